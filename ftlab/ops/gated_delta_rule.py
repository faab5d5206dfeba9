"""The gated delta rule (docs/OPS.md section 9): Gated DeltaNet's linear attention, prefill
(:func:`gated_delta_rule`) and decode (:func:`gated_delta_step`)."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends
from ftlab.backends import calls

CHUNK_SIZES = (16, 32, 64)
#: the precisions of :func:`gated_delta_rule`'s products
PRECISIONS = ("fp32", "bf16")


def _floating(name: str, t: object) -> torch.Tensor:
    argcheck.tensor(name, t)
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    return t


def _check(q, k, v, g, beta, lead: tuple[str, ...], scale, l2norm_qk) -> tuple[int, int, float]:
    """Shapes, dtypes and devices of q, k, v, g, beta (``lead``: the names of the leading dims);
    returns (Hk, Hv, scale)."""
    dims = len(lead) + 2
    for name, t in (("q", q), ("k", k), ("v", v)):
        argcheck.float_tensor(name, t)
        if t.dim() != dims:
            raise ValueError(
                f"{name} must be {dims}-D [{', '.join(lead)}, heads, D], got shape {tuple(t.shape)}"
            )
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    *lead_sizes, hk, dk = q.shape
    hv, dv = v.shape[-2:]
    if tuple(v.shape[:-2]) != tuple(lead_sizes):
        raise ValueError(
            f"v must be [{', '.join(map(str, lead_sizes))}, Hv, Dv] like q {tuple(q.shape)}, got "
            f"{tuple(v.shape)}"
        )
    if hk == 0 or dk == 0 or dv == 0:
        raise ValueError(
            f"heads and head sizes must be >= 1, got q {tuple(q.shape)} and v {tuple(v.shape)}"
        )
    if hv % hk:
        raise ValueError(f"v's head count Hv must be a multiple of q/k's Hk={hk}, got {hv}")
    for name, t in (("g", g), ("beta", beta)):
        _floating(name, t)
        if tuple(t.shape) != (*lead_sizes, hv):
            raise ValueError(
                f"{name} must be [{', '.join(map(str, lead_sizes))}, {hv}] ({', '.join(lead)}, "
                f"Hv), got {tuple(t.shape)}"
            )
    for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if not isinstance(l2norm_qk, bool):
        raise TypeError(f"l2norm_qk must be a bool, got {type(l2norm_qk).__name__}")
    scale = dk**-0.5 if scale is None else argcheck.finite_float("scale", scale)
    return hk, hv, scale


def _state(name: str, state: object, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    argcheck.tensor(name, state)
    if state.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {state.dtype}")
    if tuple(state.shape) != shape:
        raise ValueError(f"{name} must be {list(shape)} (B, Hv, Dk, Dv), got {tuple(state.shape)}")
    if state.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {state.device}")
    return state


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    state: torch.Tensor | None = None,
    scale: float | None = None,
    l2norm_qk: bool = True,
    chunk_size: int = 64,
    precision: str = "fp32",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over a sequence (prefill), in chunks.

    ``q, k [B, T, Hk, Dk]`` and ``v [B, T, Hv, Dv]`` (one dtype of fp32 / fp16 / bf16; Hv a
    multiple of Hk: value head h reads key head ``h // (Hv // Hk)``), ``g [B, T, Hv]`` the log
    decay (<= 0 normally) and ``beta [B, T, Hv]`` the write strength (in (0, 1) normally), of
    any float dtype, used in fp32; ``state [B, Hv, Dk, Dv]`` fp32, the initial state (None:
    zeros; never modified); ``scale`` default ``Dk ** -0.5``; ``l2norm_qk``: q and k are
    L2-normalised per head in fp32 first (``x * rsqrt(sum x^2 + 1e-6)``). Per (b, h), in fp32:
    ``S = S * exp(g_t); delta = (v_t - k_t^T S) * beta_t; S = S + outer(k_t, delta); o_t =
    (scale * q_t)^T S`` -- transformers' ``torch_recurrent_gated_delta_rule`` -- computed in
    chunks of ``chunk_size`` tokens (16, 32 or 64; the result is the same up to rounding).
    Returns ``(o [B, T, Hv, Dv]`` in v's dtype, ``final_state [B, Hv, Dk, Dv]`` fp32, new). A g
    below -110 (``-inf``, ``-1e30``) is a full forget: the state before that token's update is
    multiplied by 0. A NaN g makes that head's o from its token on and its final state NaN, and
    changes nothing before it (docs/OPS.md section 9).

    ``precision``: ``"fp32"`` (the default) computes every product at fp32 accuracy, within
    ``ftlab.testing.gated_delta_tolerance``; ``"bf16"`` lets the chunked kernels round each
    fp32 operand of a product (the state, the chunk's solve, its deltas) to bf16 once, with fp32
    sums and the state kept in fp32 -- the precision of fla's ``chunk_gated_delta_rule`` --
    within ``gated_delta_tolerance(..., operands="bf16")``. It applies to bf16 q, k, v in chunks
    of 64 on the GPU backends (HIP's chunks in one bf16 plane, Triton's chunk-64 kernels with
    bf16 dots); elsewhere the result is the "fp32" one, which is within both bounds, and the
    plan's reason says so (``ftlab ops gated_delta_rule --explain``).
    """
    _, hv, scale = _check(q, k, v, g, beta, ("B", "T"), scale, l2norm_qk)
    b, t, _, dk = q.shape
    dv = v.shape[-1]
    if state is not None:
        _state("state", state, (b, hv, dk, dv), q.device)
    if not argcheck.is_int(chunk_size) or chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}, got {chunk_size!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    call = calls.delta_rule(q, v, chunk_size, precision)
    plan = backends.plan("gated_delta_rule", call, backend=backend)
    if b == 0 or t == 0:
        final = state.clone() if state is not None else torch.zeros(b, hv, dk, dv, device=q.device)
        return torch.empty(b, t, hv, dv, dtype=v.dtype, device=v.device), final
    initial = None if state is None else state.contiguous()
    g, beta = g.float().contiguous(), beta.float().contiguous()
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return plan.run(q, k, v, g, beta, initial, scale, l2norm_qk, chunk_size, precision=precision)


def _gates(gates: object, g: torch.Tensor, beta: torch.Tensor, q: torch.Tensor, hv: int) -> None:
    """``gates = (a_neg, dt_bias)`` fp32 ``[Hv]`` on q's device; g and beta then in fp32 or q's
    dtype."""
    if not isinstance(gates, tuple) or len(gates) != 2:
        raise TypeError(
            f"gates must be None or a tuple (a_neg, dt_bias), got {type(gates).__name__}"
        )
    for name, t in zip(("a_neg", "dt_bias"), gates, strict=True):
        argcheck.tensor(f"gates' {name}", t)
        if t.dtype != torch.float32:
            raise TypeError(f"gates' {name} must be float32, got {t.dtype}")
        if tuple(t.shape) != (hv,):
            raise ValueError(f"gates' {name} must be [{hv}] (Hv), got {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"gates' {name} must be on q's device {q.device}, got {t.device}")
    for name, t in (("g", g), ("beta", beta)):
        if t.dtype not in (torch.float32, q.dtype):
            raise TypeError(
                f"{name} must be float32 or q's dtype {q.dtype} with gates, got {t.dtype}"
            )


def gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    scale: float | None = None,
    l2norm_qk: bool = True,
    gates: tuple[torch.Tensor, torch.Tensor] | None = None,
    reset: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """One token of the gated delta rule per sequence (decode), the state updated in place.

    ``q, k [B, Hk, Dk]``, ``v [B, Hv, Dv]``, ``g, beta [B, Hv]``, ``state [B, Hv, Dk, Dv]``
    (contiguous fp32: written in place, anything else is refused); the rest as
    :func:`gated_delta_rule` for T = 1. Returns ``o [B, Hv, Dv]`` in v's dtype. The Triton and
    HIP kernels are graph-capturable (no host syncs, no data-dependent allocation).

    ``gates = (a_neg, dt_bias)`` (fp32 ``[Hv]`` each): g and beta are then Gated DeltaNet's raw
    projections ``a`` and ``b`` (fp32 or q's dtype), and the step uses ``g = a_neg * softplus(a
    + dt_bias)`` and ``beta = sigmoid(b)``, computed in fp32 (softplus as torch's: ``x`` past 20,
    else ``log1p(exp(x))``) -- what the models compute before the step, folded into its kernel.
    ``reset`` (bool ``[B]``): the rows whose state starts afresh: their state is taken as zeros
    (never read, so whatever it held cannot leak) before the step.
    """
    _, hv, scale = _check(q, k, v, g, beta, ("B",), scale, l2norm_qk)
    b, _, dk = q.shape
    dv = v.shape[-1]
    _state("state", state, (b, hv, dk, dv), q.device)
    if not state.is_contiguous():
        raise ValueError(
            f"state must be contiguous (it is updated in place), got strides {state.stride()}"
        )
    if gates is not None:
        _gates(gates, g, beta, q, hv)
    if reset is not None:
        argcheck.reset_rows("reset", reset, b, "q", q)
    impl = backends.resolve("gated_delta_step", backend, q.device, q.dtype)
    if b == 0:
        return torch.empty(0, hv, dv, dtype=v.dtype, device=v.device)
    if gates is None:
        g, beta = g.float(), beta.float()
    else:
        gates = (gates[0].contiguous(), gates[1].contiguous())
    extra = {} if gates is None and reset is None else {"gates": gates, "reset": reset}
    return impl.fn(
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        g.contiguous(),
        beta.contiguous(),
        state,
        scale,
        l2norm_qk,
        **extra,
    )

"""Routed MoE (docs/OPS.md section 3): the router, the grouping of routes by expert, the
SwiGLU experts, and the two composed as one layer's MoE."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends
from ftlab.backends import calls
from ftlab.ops.norm import checked as norm_checked
from ftlab.ops.norm import contiguous_rows as norm_rows
from ftlab.quant import QTYPES, QuantWeight


def route_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool = True, *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router of Qwen3-MoE: ``logits [T, E]`` (fp32/fp16/bf16) -> (weights fp32 ``[T, k]``,
    ids int32 ``[T, k]``). Softmax over all E in fp32, the k largest (ties: the lower expert
    id first), renormalized to sum 1 when ``renormalize`` (Qwen3's ``norm_topk_prob``)."""
    argcheck.float_tensor("logits", logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [T, E], got shape {tuple(logits.shape)}")
    argcheck.int_in("top_k", top_k, 1, logits.shape[1])
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize must be a bool, got {type(renormalize).__name__}")
    impl = backends.resolve("route_topk", backend, logits.device, logits.dtype)
    return impl.fn(logits, top_k, renormalize)


def router_topk(
    x: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    renormalize: bool = True,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The router of Qwen3-MoE in one op: its linear layer, then :func:`route_topk`.

    x ``[T, H]`` and ``weight [E, H]`` of one float dtype (fp32/fp16/bf16) -> (logits ``[T, E]``
    in x's dtype, top-k weights fp32 ``[T, k]``, ids int32 ``[T, k]``). The logits are an fp32
    dot rounded to x's dtype (a backend's summation order may move one by the bound of
    docs/OPS.md section 3); weights and ids are exactly :func:`route_topk` of the returned
    logits. The hip backend does it in one launch for up to 8 tokens (the last block of a token
    routes it; past 8 fp16 / bf16 tokens one BLAS GEMM, then route_topk's kernel), with a
    per-device counter buffer: calls on two streams of one device must not overlap."""
    _router_checks(x, weight, top_k, renormalize)
    impl = backends.resolve("router_topk", backend, x.device, x.dtype)
    return impl.fn(x, weight, top_k, renormalize)


def _router_checks(x: object, weight: object, top_k: object, renormalize: object) -> None:
    argcheck.float_tensor("x", x)
    argcheck.float_tensor("weight", weight)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [T, H], got shape {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(
            f"weight must be [E, H] with x's H = {x.shape[1]}, got shape {tuple(weight.shape)}"
        )
    argcheck.same_dtype("weight", weight, "x", x)
    argcheck.same_device("weight", weight, "x", x)
    argcheck.int_in("top_k", top_k, 1, weight.shape[0])
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize must be a bool, got {type(renormalize).__name__}")


def add_rmsnorm_router_topk(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    top_k: int,
    renormalize: bool = True,
    *,
    backend: str = "auto",
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's residual add and the RMSNorm after it, then the router of the normed rows:
    ``(y, s, logits, weights, ids)``, bit for bit what one backend's ``y, s = add_rmsnorm(x,
    residual, norm_weight, eps)`` then ``router_topk(y, weight, top_k, renormalize)`` give
    (arguments as theirs: x and residual ``[T, H]`` of one float dtype, norm_weight ``[H]``, weight
    ``[E, H]`` of x's dtype). The hip backend does it in one launch for decode (up to
    ``backends.DECODE_MAX_TOKENS`` tokens, a residual, the norm weight in x's dtype, 16-byte aligned
    rows): each block of the router recomputes the token's norm with add_rmsnorm's arithmetic and
    reads y from its LDS; otherwise, and in the other backends, the two ops run one after the other.
    Routing counters as :func:`router_topk`'s: calls on two streams of one device must not overlap.

    ``validate=False`` skips the argument checks (the caller vouches for them, as the models do:
    a :class:`~ftlab.models.DecodePlan`'s ``checks``); the backends still refuse layouts they cannot
    read."""
    if validate:
        eps = norm_checked(x, residual, norm_weight, eps)
        _router_checks(x, weight, top_k, renormalize)
    else:
        eps = float(eps)
    impl = backends.resolve("add_rmsnorm_router_topk", backend, x.device, x.dtype)
    res = None if residual is None else norm_rows(residual)
    y, s, logits, weights, ids = impl.fn(
        norm_rows(x), res, norm_weight.contiguous(), eps, weight, top_k, renormalize
    )
    return y, x if residual is None else s, logits, weights, ids


def moe_align(
    ids: torch.Tensor, num_experts: int, block_m: int, *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group the (token, slot) pairs of ``ids [T, k]`` by expert for a grouped GEMM.

    Returns ``sorted_token_ids`` int32 ``[capacity]`` (flat pair index ``t * k + j``, groups
    in expert order, pairs in flat order within a group, each group padded to a multiple of
    ``block_m`` with the sentinel ``T * k``), ``expert_ids`` int32 ``[capacity / block_m]``
    (-1 past the end) and ``num_tokens_post_padded`` int32 ``[1]``. ``capacity`` is the static
    bound :func:`ftlab.reference.moe.align_capacity`. Ids outside ``[0, E)`` are skipped.
    """
    argcheck.tensor("ids", ids)
    argcheck.dtype_in("ids", ids, argcheck.INDEX_DTYPES)
    if ids.dim() != 2:
        raise ValueError(f"ids must be 2-D [T, k], got shape {tuple(ids.shape)}")
    argcheck.int_in("num_experts", num_experts, 1)
    argcheck.int_in("block_m", block_m, 1)
    impl = backends.resolve("moe_align", backend, ids.device, None)
    return impl.fn(_valid_ids(ids, num_experts), num_experts, block_m)


def _valid_ids(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``ids`` as contiguous int32, ids outside ``[0, E)`` as -1: the kernels read int32, and an
    int64 id such as 2**32 + 1 must not wrap into a valid expert. No host synchronization."""
    if ids.dtype == torch.int64:
        ids = torch.where((ids >= 0) & (ids < num_experts), ids, -1).to(torch.int32)
    return ids.contiguous()


def _bank(name: str, w: object) -> tuple[int, ...]:
    if isinstance(w, QuantWeight):
        shape = tuple(w.shape)
    elif isinstance(w, torch.Tensor):
        argcheck.dtype_in(name, w, argcheck.FLOAT_DTYPES)
        shape = tuple(w.shape)
    else:
        raise TypeError(
            f"{name} must be a tensor or a QuantWeight bank ({'/'.join(QTYPES)}), got "
            f"{type(w).__name__}"
        )
    if len(shape) != 3:
        raise ValueError(f"{name} must be an expert bank [E, N, K], got shape {shape}")
    return shape


def moe_experts(
    x: torch.Tensor,
    w_gate_up: torch.Tensor | QuantWeight,
    w_down: torch.Tensor | QuantWeight,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    path: str = "auto",
    backend: str = "auto",
    validate: bool = True,
    plan: backends.Plan | None = None,
) -> torch.Tensor:
    """SwiGLU experts: ``y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))``.

    x ``[T, H]`` fp32/fp16/bf16; ``w_gate_up [E, 2I, H]`` (gate rows, then up rows) and
    ``w_down [E, H, I]``, both dense (fp32/fp16/bf16) or both :class:`~ftlab.quant.QuantWeight`
    banks of any :data:`~ftlab.quant.QTYPES` types, which may differ (Q4_K_M: Q4_K gate/up, Q6_K
    or Q4_K down); ``topk_weights`` fp32 ``[T, k]``; ``topk_ids`` int32/int64 ``[T, k]`` -- ids
    outside ``[0, E)``, -1 in particular, contribute nothing. Returns ``[T, H]`` in x's dtype.

    ``path`` applies to quantized banks, as in :func:`~ftlab.ops.q4_0_matmul` and
    :func:`~ftlab.ops.quant_matmul`: ``"int8"`` (x and the SwiGLU output h quantized to Q8_1,
    exact integer sub-block dots), ``"dequant"`` (weights dequantized; a backend may round them,
    and h, to x's dtype for its matrix units), ``"auto"`` (int8 up to ``backends.DECODE_MAX_TOKENS``
    tokens, else the backend's prefill path: reference and triton ``"dequant"``, hip and cpu
    ``"int8"``); with ``backend="auto"`` the planner may take another backend and path where one
    measured faster (``ftlab ops moe_experts --explain``). Dense banks ignore it. A path a backend
    lacks raises ``BackendUnavailable``. The routing weight multiplies each expert's down output
    before the sum over the k slots, in every backend. ``backend="cpu"``: the native CPU kernels
    (CPU tensors; what the hybrid executor runs).

    ``plan``: a plan this op made for the same call, taken instead of planning again (a model keeps
    one a layer and row count); ``backend`` and ``path`` are then the plan's.

    ``validate=False`` skips the argument checks (the caller vouches for them, as the models do:
    a :class:`~ftlab.models.DecodePlan`'s ``checks``); the backends still refuse layouts they cannot
    read.
    """
    if validate:
        _experts_checks(x, w_gate_up, w_down, topk_weights, topk_ids)
    if path != "auto" and path not in backends.Q4_0_PATHS:
        raise ValueError(f"path must be 'auto' or one of {backends.Q4_0_PATHS}, got {path!r}")
    if plan is None:
        call = calls.experts(x, w_gate_up, w_down, topk_ids.shape[1])
        plan = backends.plan("moe_experts", call, backend=backend, path=path)
    backends.checked_plan(plan, "moe_experts")
    ids = _valid_ids(topk_ids, w_gate_up.shape[0])
    return plan.run(x, w_gate_up, w_down, topk_weights, ids, plan.path or path)


def _experts_checks(
    x: object, w_gate_up: object, w_down: object, topk_weights: object, topk_ids: object
) -> None:
    """moe_experts' argument checks (each error names the argument)."""
    argcheck.float_tensor("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [T, H], got shape {tuple(x.shape)}")
    e, two_i, h = _bank("w_gate_up", w_gate_up)
    e2, h2, i = _bank("w_down", w_down)
    if (e2, h2, 2 * i) != (e, x.shape[1], two_i) or h != x.shape[1]:
        raise ValueError(
            f"banks must be w_gate_up [E, 2I, H] and w_down [E, H, I] with H = {x.shape[1]}, "
            f"got {tuple(w_gate_up.shape)} and {tuple(w_down.shape)}"
        )
    quant = isinstance(w_gate_up, QuantWeight)
    if quant != isinstance(w_down, QuantWeight):
        raise TypeError(
            f"w_gate_up and w_down must both be QuantWeight banks or both dense tensors, got "
            f"{type(w_gate_up).__name__} and {type(w_down).__name__}"
        )
    argcheck.tensor("topk_weights", topk_weights)
    argcheck.tensor("topk_ids", topk_ids)
    argcheck.dtype_in("topk_ids", topk_ids, argcheck.INDEX_DTYPES)
    if topk_weights.dtype != torch.float32:
        raise TypeError(f"topk_weights must be float32, got {topk_weights.dtype}")
    if (
        topk_ids.dim() != 2
        or topk_ids.shape[0] != x.shape[0]
        or topk_weights.shape != topk_ids.shape
    ):
        raise ValueError(
            f"topk_weights and topk_ids must both be [T, k] with T = {x.shape[0]}, "
            f"got {tuple(topk_weights.shape)} and {tuple(topk_ids.shape)}"
        )
    for name, t in (
        ("w_gate_up", w_gate_up),
        ("w_down", w_down),
        ("topk_weights", topk_weights),
        ("topk_ids", topk_ids),
    ):
        if t.device != x.device:
            raise ValueError(f"{name} must be on the device of x ({x.device}), got {t.device}")


def fused_moe(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    w_gate_up: torch.Tensor | QuantWeight,
    w_down: torch.Tensor | QuantWeight,
    top_k: int,
    renormalize: bool = True,
    *,
    path: str = "auto",
    backend: str = "auto",
) -> torch.Tensor:
    """One Qwen3-MoE layer's experts: :func:`route_topk` then :func:`moe_experts`.

    x ``[T, H]``, router_logits ``[T, E]`` (E the banks' experts) -> ``[T, H]`` in x's dtype."""
    argcheck.float_tensor("x", x)
    argcheck.float_tensor("router_logits", router_logits)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [T, H], got shape {tuple(x.shape)}")
    experts = _bank("w_gate_up", w_gate_up)[0]
    if router_logits.dim() != 2 or router_logits.shape != (x.shape[0], experts):
        raise ValueError(
            f"router_logits must be [T, E] = [{x.shape[0]}, {experts}] (x's tokens, the banks' "
            f"experts), got {tuple(router_logits.shape)}"
        )
    weights, ids = route_topk(router_logits, top_k, renormalize, backend=backend)
    return moe_experts(x, w_gate_up, w_down, weights, ids, path=path, backend=backend)

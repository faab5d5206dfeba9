"""GGUF Q4_0 (docs/OPS.md section 2): quantize, dequantize, Q8_1 activations and the matmul."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends
from ftlab.backends import calls
from ftlab.ops.norm import add_rmsnorm, checked, contiguous_rows
from ftlab.quant import Q8_1, QK, Q4_0Weight


def quantize_q4_0(w: torch.Tensor, *, backend: str = "auto") -> Q4_0Weight:
    """Quantize ``w [..., N, K]`` (fp32/fp16/bf16, K % 32 == 0) to GGUF Q4_0 blocks.

    Byte-identical to ``gguf.quants.quantize(w, GGMLQuantizationType.Q4_0)`` in every backend,
    infinities included (an infinite block's scale is infinite, its finite values quantize to 8).
    NaN is refused (ValueError naming the first): gguf-py would pick it as the block's largest
    magnitude and write a NaN scale, and the kernels' max reductions do not order NaN the way
    numpy's argmax does. The check reads w on the host (not inside a graph capture; quantizing is
    load-time work). Returns a :class:`~ftlab.quant.Q4_0Weight` on w's device.
    """
    argcheck.float_tensor("w", w)
    if w.dim() < 2 or w.shape[-1] % QK:
        raise ValueError(
            f"w must be [..., N, K] with K a multiple of {QK}, got shape {tuple(w.shape)}"
        )
    if w.numel():
        argcheck.data_checks_allowed(
            "quantize_q4_0", "its NaN check reads w", "quantize before capturing"
        )
        bad = torch.isnan(w)
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"w must not hold NaN, got NaN at {where} (a NaN weight has no Q4_0 value)"
            )
    impl = backends.resolve("quantize_q4_0", backend, w.device, w.dtype)
    return impl.fn(w.contiguous())


def dequantize_q4_0(
    w: Q4_0Weight, dtype: torch.dtype = torch.float32, *, backend: str = "auto"
) -> torch.Tensor:
    """``[..., N, K]`` values ``d * (q - 8)`` of a Q4_0Weight, in ``dtype`` (fp32/fp16/bf16).

    Exact in fp32 (an fp16 scale times a small integer), hence bit-identical across
    backends; fp16/bf16 outputs are that value rounded to nearest even.
    """
    argcheck.q4_0_weight("w", w)
    argcheck.float_dtype("dtype", dtype)
    impl = backends.resolve("dequantize_q4_0", backend, w.device, dtype)
    return impl.fn(w, dtype)


def quantize_q8_1(x: torch.Tensor, *, backend: str = "auto") -> Q8_1:
    """Q8_1 activations of ``x [M, K]`` (fp32/fp16/bf16, K % 32 == 0): per 32-block
    ``d = amax / 127``, ``q = round(x / d)`` (halves away from zero), ``s = d * sum(q)``."""
    argcheck.float_tensor("x", x)
    if x.dim() != 2 or x.shape[1] % QK:
        raise ValueError(f"x must be [M, K] with K a multiple of {QK}, got shape {tuple(x.shape)}")
    impl = backends.resolve("quantize_q8_1", backend, x.device, x.dtype)
    return impl.fn(x if x.shape[1] <= 1 or x.stride(1) == 1 else x.contiguous())


def q4_0_matmul(
    x: torch.Tensor,
    w: Q4_0Weight,
    *,
    path: str = "auto",
    backend: str = "auto",
    x_q8: Q8_1 | None = None,
    validate: bool = True,
    plan: backends.Plan | None = None,
) -> torch.Tensor:
    """``x [M, K] @ W.T -> [M, N]`` for Q4_0 weights ``W [N, K]``, in x's dtype.

    Paths (docs/OPS.md section 2):
      ``"int8"``: x is quantized to Q8_1; per block ``d4 * (d8 * sum(q4 * q8) - 8 * s8)``
      with an exact integer dot (dp4a / sudot4 / sdot4), summed in fp32. Backends agree
      to fp32 rounding: ``|y - y_ref| <= (K/32 + 4) * eps32 * sum_b |d4| (|d8 sumi| + 8 |s8|)``
      (see ``ftlab.testing.matmul_tolerance``).
      ``"dequant"``: ``x @ dequantize(W).T`` with the weights rounded to x's dtype in the
      tile (Triton) -- within one rounding of each weight of the fp32 result.
      ``"auto"``: int8 up to ``backends.DECODE_MAX_TOKENS`` rows (decode); for more rows the
      backend's prefill path (reference, triton: dequant; hip: int8). With ``backend="auto"``
      the planner may take another backend and path where one measured faster (Hopper, 16-bit
      x: Triton's dequant GEMM for prefill; ``ftlab ops q4_0_matmul --explain`` says why).
    With ``backend="auto"`` and an explicit path, the first backend in auto order that
    implements that path serves the call.

    x may be non-contiguous (row stride > K); fp32 / fp16 / bf16.

    ``x_q8``: x's Q8_1 when the caller has it already (``quantize_q8_1(x)``, e.g. made once for
    several matmuls of one x): the int8 path then takes it instead of quantizing x (in hip's fused
    matvec, every block's quantization saved). It must be x's own Q8_1 (only its shapes, dtypes,
    contiguity and device are checked): the int8 path computes the product of ``x_q8`` with W.
    Unused by the dequant path.

    ``plan``: a plan this op made for the same call, taken instead of planning again (a model keeps
    one a weight); ``backend`` and ``path`` are then the plan's.

    ``validate=False`` skips the argument checks (the caller vouches for them, as the models do:
    a :class:`~ftlab.models.DecodePlan`'s ``checks``); the backends still refuse layouts they cannot
    read.
    """
    if validate:
        _matmul_checks(x, w, x_q8)
    plan = backends.checked_plan(plan, "q4_0_matmul") or backends.plan(
        "q4_0_matmul", calls.matmul(x, w), backend=backend, path=path
    )
    if x.shape[0] == 0 or w.shape[0] == 0:
        return torch.zeros((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.contiguous()
    if x_q8 is None or plan.path != "int8":  # a registered backend may take (x, w, path) only
        return plan.run(x, w, plan.path)
    return plan.run(x, w, plan.path, x_q8)


def _matmul_checks(x: object, w: object, x_q8: object) -> None:
    argcheck.float_tensor("x", x)
    argcheck.q4_0_weight("w", w)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if len(w.shape) != 2:
        raise ValueError(f"w must be a 2-D Q4_0Weight [N, K], got shape {tuple(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(
            f"x must have K = {w.shape[1]} columns (w is {tuple(w.shape)}), got {x.shape[1]}"
        )
    if x.device != w.device:
        raise ValueError(f"x must be on the device of w ({w.device}), got {x.device}")
    if x_q8 is not None:
        argcheck.q8_1("x_q8", x_q8, x)


def add_rmsnorm_q4_0_matmul(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    w: Q4_0Weight,
    *,
    path: str = "auto",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's residual add and the RMSNorm before its first projection, then that projection:
    ``(y, s, out)``, bit for bit what one backend's ``y, s = add_rmsnorm(x, residual, norm_weight,
    eps)`` then ``out = q4_0_matmul(y, w, path=path)`` give (arguments as theirs: x and residual
    ``[M, K]`` of one float dtype, norm_weight ``[K]``, w a Q4_0Weight ``[N, K]``; s is x itself
    without a residual). The hip backend does it in one launch for one row (fp16 / bf16, the int8
    path, the norm weight in x's dtype, 16-byte aligned rows, K a multiple of 256 up to 2048): its
    fused matvec computes the norm in every block with add_rmsnorm's arithmetic before quantizing;
    otherwise, and in the other backends, the two ops run one after the other."""
    eps = checked(x, residual, norm_weight, eps)
    argcheck.q4_0_weight("w", w)
    if len(w.shape) != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(
            f"w must be a 2-D Q4_0Weight [N, K] with x's K = {x.shape[1]}, got shape "
            f"{tuple(w.shape)}"
        )
    if x.device != w.device:
        raise ValueError(f"x must be on the device of w ({w.device}), got {x.device}")
    plan = backends.plan("add_rmsnorm_q4_0_matmul", calls.matmul(x, w), backend=backend, path=path)
    impl, chosen = plan.impl, plan.path
    if x.shape[0] == 0 or w.shape[0] == 0:  # nothing to multiply: the two ops' own empty cases
        y, s = add_rmsnorm(x, residual, norm_weight, eps, backend=impl.backend)
        return y, s, torch.zeros((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    res = None if residual is None else contiguous_rows(residual)
    y, s, out = impl.fn(contiguous_rows(x), res, norm_weight.contiguous(), eps, w, chosen)
    return y, x if residual is None else s, out

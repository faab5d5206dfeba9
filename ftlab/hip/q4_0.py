"""GGUF Q4_0 through the HIP kernels of ``csrc/q4_0.hip`` (JIT-built, cached).

q4_0_matmul implements the int8 path only. Up to 4 rows (decode), where K is a multiple of 256
and the activations fit its LDS: the fused (region) matvec, which takes the int8 dot and writes
the result in the activations' dtype, quantizing the activations to Q8_1 itself for one row up
to K = 2048 (one launch), otherwise given them quantized; else Q8_1 activations, then the
LDS-staged int8-dot matvec (up to 8 rows; it writes y in x's dtype, launched dependent on the
quantization) or the dp4a-tiled GEMM (prefill).
"""

from __future__ import annotations

import torch

from ftlab import argcheck, backends, jit
from ftlab.backends import calls
from ftlab.backends.calls import Call
from ftlab.hip.norm import add_rmsnorm
from ftlab.quant import Q4_0_BLOCK_BYTES, Q8_1, QK, Q4_0Weight

#: rows q4_0_mv_kernel is instantiated for (1..8, csrc/q4_0_matvec.hip): a kernel's capacity,
#: at least backends.DECODE_MAX_TOKENS (the rows the int8 path is taken for); more go to the GEMM
MATVEC_ROWS = 8


def quantize_q4_0(w: torch.Tensor) -> Q4_0Weight:
    """Backend entry of :func:`ftlab.ops.quantize_q4_0` (w contiguous)."""
    k = w.shape[-1]
    out = torch.empty(
        (*w.shape[:-1], k // QK * Q4_0_BLOCK_BYTES), dtype=torch.uint8, device=w.device
    )
    module = jit.module_for("q4_0", w.device)
    jit.on_device(w.device, lambda: module.quantize_q4_0(w, out))
    return Q4_0Weight(out, tuple(w.shape))


def dequantize_q4_0(w: Q4_0Weight, dtype: torch.dtype) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.dequantize_q4_0`."""
    out = torch.empty(w.shape, dtype=dtype, device=w.device)
    module = jit.module_for("q4_0", w.device)
    jit.on_device(w.device, lambda: module.dequantize_q4_0(w.data, out))
    return out


def quantize_q8_1(x: torch.Tensor) -> Q8_1:
    """Backend entry of :func:`ftlab.ops.quantize_q8_1` (x [M, K], rows contiguous)."""
    out = Q8_1.empty(x.shape[0], x.shape[1], x.device)
    module = jit.module_for("q4_0", x.device)
    jit.on_device(x.device, lambda: module.quantize_q8_1(x, out.q, out.d, out.s))
    return out


# For one row up to here the fused matvec quantizes x itself (one launch); longer rows, and
# several rows, are quantized first (quantize_q8_1) and the fused matvec is given their Q8_1:
# every block of the one-launch form quantizes all of x, which costs more than the launch it
# saves (results/2026-12-02-nvidia-h200-matvec-fused-q8*.txt).
FUSED_QUANTIZE_MAX_K = 2048


def q4_0_matmul(
    x: torch.Tensor,
    w: Q4_0Weight,
    path: str,
    x_q8: Q8_1 | None = None,
    variant: str | None = None,
    call: Call | None = None,
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.q4_0_matmul` (``path == "int8"``; ``x_q8``: x's Q8_1,
    taken instead of quantizing x). ``variant``: ``"fused"`` (the region matvec, M <= 4),
    ``"matvec"`` (M <= 8) or ``"gemm"`` (``ftlab.backends.rules.KERNELS``); None: the planner's
    default for the call; one that cannot serve raises ``BackendUnavailable``.
    The shapes are checked here too: the op's checks may be off."""
    argcheck.matmul_layout(x, w)
    if path != "int8":
        raise ValueError(
            f"the hip backend implements q4_0_matmul's int8 path only, got path={path!r}"
        )
    call = call or calls.matmul(x, w)  # the planner's (a plan passes it), else made here
    variant = backends.variant_for("q4_0_matmul", "hip", call, variant, path="int8")
    m, n = x.shape[0], w.shape[0]
    module = jit.module_for("q4_0", x.device)
    if x_q8 is not None and not all(t.data_ptr() % 16 == 0 for t in (x_q8.q, x_q8.d, x_q8.s)):
        # the kernels read 16-byte (4-byte) pieces
        x_q8 = Q8_1(x_q8.q.clone(), x_q8.d.clone(), x_q8.s.clone())
    if variant == "fused":
        y = x.new_empty((m, n))
        if x_q8 is None and (m > 1 or x.shape[1] > FUSED_QUANTIZE_MAX_K):
            x_q8 = quantize_q8_1(x)
        if x_q8 is not None:
            jit.on_device(
                x.device, lambda: module.q4_0_mv_fused_q8(w.data, x_q8.q, x_q8.d, x_q8.s, y)
            )
        else:
            jit.on_device(x.device, lambda: module.q4_0_mv_fused(w.data, x, y))
        return y
    x8 = quantize_q8_1(x) if x_q8 is None else x_q8
    if variant == "matvec":  # y written in x's dtype by the kernel
        y = x.new_empty((m, n))
        jit.on_device(x.device, lambda: module.q4_0_mv(w.data, x8.q, x8.d, x8.s, y))
        return y
    y = x.new_empty((m, n), dtype=torch.float32)
    jit.on_device(x.device, lambda: module.q4_0_gemm(w.data, x8.q, x8.d, x8.s, y))
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def add_rmsnorm_q4_0_matmul(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    w: Q4_0Weight,
    path: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.add_rmsnorm_q4_0_matmul`: one launch (the fused matvec's
    norm prologue) for one fp16 / bf16 row on the int8 path with the norm weight in x's dtype,
    16-byte aligned rows and K a multiple of 256 up to 2048; otherwise hip's add_rmsnorm, then
    :func:`q4_0_matmul` of its output (the same bits)."""
    m, k = x.shape
    aligned = all(
        t.data_ptr() % 16 == 0 for t in (x, norm_weight, x if residual is None else residual)
    )
    fused = backends.why_not("q4_0_matmul", "hip", "fused", calls.matmul(x, w)) is None
    if not (
        m == 1
        and w.shape[0] > 0
        and path == "int8"
        and x.dtype in (torch.float16, torch.bfloat16)
        and norm_weight.dtype == x.dtype
        and k <= 2048
        and fused
        and aligned
    ):
        y, s = add_rmsnorm(x, residual, norm_weight, eps)
        return y, s, q4_0_matmul(y, w, path)
    y = x.new_empty((1, k))
    s = x.new_empty((1, k)) if residual is not None else x
    out = x.new_empty((1, w.shape[0]))
    module = jit.module_for("q4_0", x.device)
    res = x if residual is None else residual
    jit.on_device(
        x.device,
        lambda: module.q4_0_mv_fused_norm(
            w.data, x, res, residual is not None, norm_weight, s, y, float(eps), out
        ),
    )
    return y, s, out

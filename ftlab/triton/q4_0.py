"""GGUF Q4_0 in Triton (docs/OPS.md section 2; reference: ftlab/reference/q4_0.py).

Kernels:
- ``quantize_q4_0_kernel``   fp -> Q4_0 blocks, byte-identical to gguf-py.
- ``dequantize_q4_0_kernel`` Q4_0 -> fp32/fp16/bf16.
- ``quantize_q8_1_kernel``   activations -> Q8_1 (q int8, d, s per 32-block); it lives in
  ``ftlab/triton/q4_0_common.py`` (the K-quant kernels use it too) and is served from here.
- the int8-dot matvecs for small M (decode): ``ftlab/triton/q4_0_matvec.py``.
- ``q4_0_dequant_gemm_kernel`` large M (prefill): dequantize a weight tile in registers,
  then ``tl.dot`` on it. Where ``ftlab.triton.quant_matmul.q4_0_config`` has tiles (sm_90,
  16-bit x) the dequant path takes that module's GEMM in 64-weight steps instead.

Exactness: the quantizers must match the reference bit for bit, so they divide with
``div_rn`` (Triton's ``/`` is approximate on NVIDIA) and launch with ``enable_fp_fusion=False`` (``x
* id + 8.5`` must round the product before the add).

Layout trick shared by the GEMM: a Q4_0 byte j holds elements j (low nibble) and j+16
(high nibble). ``tl.join(lo, hi)`` interleaves them, so the weight tile's K order is
(0, 16, 1, 17, ...); the activation tile is loaded in that same order, and the dot, a sum
over K, is unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab import argcheck
from ftlab.platform import current
from ftlab.quant import Q4_0_BLOCK_BYTES, Q8_1, QK, Q4_0Weight
from ftlab.triton.norm import add_rmsnorm
from ftlab.triton.q4_0_common import (  # noqa: F401 (quantize_q8_1: this family's entry of ops.quantize_q8_1)
    CONFIGS,
    config,
    interpreted,
    load_q4_0_scale,
    quantize_q8_1,
    quantize_q8_1_kernel,
    round_half_away,
)
from ftlab.triton.q4_0_matvec import MATVEC_ROWS, matvec_specs, q4_0_matvec

# ------------------------------------------------------------------ quantize / dequantize


@triton.jit
def quantize_q4_0_kernel(x_ptr, out_ptr, NB, BLOCK_B: tl.constexpr):
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [B] block ids
    j = tl.arange(0, 16)
    ok = b < NB
    m2 = ok[:, None]
    base = b.to(tl.int64)[:, None] * 32 + j[None, :]
    lo = tl.load(x_ptr + base, mask=m2, other=0.0).to(tl.float32)  # elements 0..15
    hi = tl.load(x_ptr + base + 16, mask=m2, other=0.0).to(tl.float32)  # elements 16..31
    # the element of largest magnitude, the first one on ties, and its sign bit
    alo, ahi = tl.abs(lo), tl.abs(hi)
    mlo, mhi = tl.max(alo, axis=1), tl.max(ahi, axis=1)
    ilo = tl.argmax(alo, axis=1, tie_break_left=True)
    ihi = tl.argmax(ahi, axis=1, tie_break_left=True)
    slo = tl.sum(
        tl.where(j[None, :] == ilo[:, None], (lo.to(tl.int32, bitcast=True) >> 31) & 1, 0), axis=1
    )
    shi = tl.sum(
        tl.where(j[None, :] == ihi[:, None], (hi.to(tl.int32, bitcast=True) >> 31) & 1, 0), axis=1
    )
    use_hi = mhi > mlo
    amax = tl.where(use_hi, mhi, mlo)
    negative = tl.where(use_hi, shi, slo) != 0
    # (signed amax) / -8, exact. Multiply by -0.125 rather than negate: Triton lowers -x to
    # 0 - x, which turns the -0.0 of an all-zero block into +0.0 on GPUs.
    d = tl.where(negative, amax * 0.125, amax * -0.125)
    inv = tl.where(
        d == 0, 0.0, tl.math.div_rn(tl.full(d.shape, 1.0, tl.float32), tl.where(d == 0, 1.0, d))
    )
    qlo = tl.minimum((lo * inv[:, None] + 8.5).to(tl.int32), 15)  # no FMA: see launch
    qhi = tl.minimum((hi * inv[:, None] + 8.5).to(tl.int32), 15)
    byte = (qlo | (qhi << 4)).to(tl.uint8)
    dbits = d.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    ob = out_ptr + b.to(tl.int64) * 18
    tl.store(ob, (dbits & 0xFF).to(tl.uint8), mask=ok)
    tl.store(ob + 1, (dbits >> 8).to(tl.uint8), mask=ok)
    tl.store(ob[:, None] + 2 + j[None, :], byte, mask=m2)


@triton.jit
def dequantize_q4_0_kernel(w_ptr, out_ptr, NB, BLOCK_B: tl.constexpr):
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    j = tl.arange(0, 16)
    ok = b < NB
    wb = w_ptr + b.to(tl.int64) * 18
    d = load_q4_0_scale(wb, ok)
    qs = tl.load(wb[:, None] + 2 + j[None, :], mask=ok[:, None], other=0).to(tl.int32)
    lo = d[:, None] * ((qs & 15) - 8).to(tl.float32)  # exact in fp32
    hi = d[:, None] * ((qs >> 4) - 8).to(tl.float32)
    ob = out_ptr + b.to(tl.int64)[:, None] * 32 + j[None, :]
    tl.store(ob, lo.to(out_ptr.dtype.element_ty), mask=ok[:, None])
    tl.store(ob + 16, hi.to(out_ptr.dtype.element_ty), mask=ok[:, None])


# ------------------------------------------------------------------ prefill GEMM


@triton.jit
def q4_0_dequant_gemm_kernel(
    x_ptr,
    x_stride,
    w_ptr,
    row_bytes,
    y_ptr,
    y_stride,
    M,
    N,
    NBK,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_KB: tl.constexpr,
    DOT_F32: tl.constexpr,
    IEEE: tl.constexpr,
    F32_PRECISION: tl.constexpr = "ieee",
):
    """y = x @ dequantize(W).T: per step, BLOCK_KB Q4_0 blocks (32 * BLOCK_KB of K) of a
    ``[*, BLOCK_N]`` weight tile are dequantized in registers to x's dtype, and ``tl.dot``
    accumulates in fp32.

    ``DOT_F32``: keep both operands in fp32 (the CPU interpreter computes bf16 wrongly).
    ``IEEE``: the operands are fp32 (x's dtype, or DOT_F32): ask for fp32-accurate products
    (``F32_PRECISION``: "ieee", or "tf32x3" on NVIDIA, where the IEEE dot needs stack), since
    ``tl.dot`` would round fp32 operands to TF32 on NVIDIA tensor cores."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    r = tl.arange(0, BLOCK_KB * 16)  # byte row of the tile: block r // 16, byte r % 16
    c = tl.arange(0, BLOCK_KB * 32)  # K column of the tile, in the join order of the weights:
    kcol = (c // 32) * 32 + (c % 32) // 2 + 16 * (c % 2)  # 0, 16, 1, 17, ... within each block
    wrow = w_ptr + rn.to(tl.int64) * row_bytes
    xrow = x_ptr + rm.to(tl.int64)[:, None] * x_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb0 in range(0, NBK, BLOCK_KB):
        blk = kb0 + r // 16
        wm = (blk < NBK)[:, None] & n_ok[None, :]
        boff = (blk * 18)[:, None]
        d = load_q4_0_scale(wrow[None, :] + boff, wm)  # [KB*16, BN]: each byte row's block scale
        qs = tl.load(wrow[None, :] + boff + 2 + (r % 16)[:, None], mask=wm, other=0).to(tl.int32)
        wlo = ((qs & 15) - 8).to(tl.float32) * d  # exact
        whi = ((qs >> 4) - 8).to(tl.float32) * d
        a = tl.load(
            xrow + kb0 * 32 + kcol[None, :],
            mask=m_ok[:, None] & (kb0 + c // 32 < NBK)[None, :],
            other=0.0,
        )
        if DOT_F32:
            a = a.to(tl.float32)
        else:
            wlo = wlo.to(x_ptr.dtype.element_ty)
            whi = whi.to(x_ptr.dtype.element_ty)
        b = tl.reshape(tl.permute(tl.join(wlo, whi), (0, 2, 1)), (BLOCK_KB * 32, BLOCK_N))
        if IEEE:  # fp32 operands: fp32-accurate products, not TF32 (the dequant path's contract)
            acc = tl.dot(a, b, acc, input_precision=F32_PRECISION)
        else:
            acc = tl.dot(a, b, acc)
    out = y_ptr + rm.to(tl.int64)[:, None] * y_stride + rn[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


# ------------------------------------------------------------------ backend entries

_BLOCKS_PER_PROGRAM = 64


def quantize_q4_0(w: torch.Tensor) -> Q4_0Weight:
    """Backend entry of :func:`ftlab.ops.quantize_q4_0` (w contiguous, K % 32 == 0)."""
    nb = w.numel() // QK
    out = torch.empty(nb * Q4_0_BLOCK_BYTES, dtype=torch.uint8, device=w.device)
    if nb:
        grid = (triton.cdiv(nb, _BLOCKS_PER_PROGRAM),)
        quantize_q4_0_kernel[grid](w, out, nb, BLOCK_B=_BLOCKS_PER_PROGRAM, enable_fp_fusion=False)
    k = w.shape[-1]
    return Q4_0Weight(out.view(*w.shape[:-1], k // QK * Q4_0_BLOCK_BYTES), tuple(w.shape))


def dequantize_q4_0(w: Q4_0Weight, dtype: torch.dtype) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.dequantize_q4_0`."""
    out = torch.empty(w.shape, dtype=dtype, device=w.device)
    nb = out.numel() // QK
    if nb:
        grid = (triton.cdiv(nb, _BLOCKS_PER_PROGRAM),)
        dequantize_q4_0_kernel[grid](w.data, out, nb, BLOCK_B=_BLOCKS_PER_PROGRAM)
    return out


def q4_0_dequant_gemm(x: torch.Tensor, w: Q4_0Weight) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    cfg = config("gemm_f32" if x.dtype == torch.float32 else "gemm", x.device)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]))
    q4_0_dequant_gemm_kernel[grid](
        x,
        x.stride(0),
        w.data,
        w.data.shape[-1],
        y,
        y.stride(0),
        m,
        n,
        k // QK,
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_KB=cfg["BLOCK_KB"],
        DOT_F32=x.dtype == torch.bfloat16 and interpreted(),
        IEEE=x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and interpreted()),
        F32_PRECISION=cfg.get("f32_precision", "ieee") if not interpreted() else "ieee",
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    return y


def q4_0_matmul(
    x: torch.Tensor, w: Q4_0Weight, path: str, x_q8: Q8_1 | None = None
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.q4_0_matmul` (path already resolved; ``x_q8``: x's Q8_1,
    taken instead of quantizing x; the shapes checked here too: the op's checks may be off)."""
    argcheck.matmul_layout(x, w)
    if path == "int8":  # the matvec takes up to MATVEC_ROWS rows a pass over W
        x8, rows = quantize_q8_1(x) if x_q8 is None else x_q8, MATVEC_ROWS
        if x8.q.data_ptr() % 16:  # the kernels read q as int32 words: a view needs 4-byte offsets
            x8 = Q8_1(x8.q.clone(), x8.d, x8.s)
        outs = [
            q4_0_matvec(
                Q8_1(x8.q[i : i + rows], x8.d[i : i + rows], x8.s[i : i + rows]), w, x.dtype
            )
            for i in range(0, x.shape[0], rows)
        ]
        return outs[0] if len(outs) == 1 else torch.cat(outs)
    if x.device.type != "cpu":  # 64-weight steps where they have timed tiles
        from ftlab.triton.quant_matmul import q4_0_config, quant_dequant_gemm

        cfg = q4_0_config(x.dtype, current(x.device).arch)
        if cfg is not None:
            return quant_dequant_gemm(x, w, cfg)
    return q4_0_dequant_gemm(x, w)


def add_rmsnorm_q4_0_matmul(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    w: Q4_0Weight,
    path: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.add_rmsnorm_q4_0_matmul`: Triton's add_rmsnorm, then its
    q4_0_matmul of the output (two launches: hip's is the one-launch form)."""
    y, s = add_rmsnorm(x, residual, norm_weight, eps)
    return y, s, q4_0_matmul(y, w, path)


def compile_specs(target: str) -> list:
    """The configurations ftlab launches on ``target``, for ftlab.compile_check."""
    from ftlab.triton.compile_spec import spec

    cfg = CONFIGS.get(target, CONFIGS["default"])
    ptr = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}
    exact = {"enable_fp_fusion": False}
    specs = []
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        name = str(dt).removeprefix("torch.")
        specs += [
            spec(
                quantize_q4_0_kernel,
                f"quantize_q4_0_kernel[{name}]",
                types={"x_ptr": ptr[dt], "out_ptr": "*u8"},
                constexprs={"BLOCK_B": _BLOCKS_PER_PROGRAM},
                options=exact,
            ),
            spec(
                dequantize_q4_0_kernel,
                f"dequantize_q4_0_kernel[{name}]",
                types={"w_ptr": "*u8", "out_ptr": ptr[dt]},
                constexprs={"BLOCK_B": _BLOCKS_PER_PROGRAM},
            ),
            spec(
                quantize_q8_1_kernel,
                f"quantize_q8_1_kernel[{name}]",
                types={"x_ptr": ptr[dt], "q_ptr": "*i8", "d_ptr": "*fp32", "s_ptr": "*fp32"},
                constexprs={"BLOCK_B": 16},
                options=exact,
            ),
        ]
    specs += matvec_specs(target)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        gemm = cfg["gemm_f32" if dt == torch.float32 else "gemm"]
        name = str(dt).removeprefix("torch.")
        label = f"q4_0_dequant_gemm_kernel[{name}, {gemm['BLOCK_M']}x{gemm['BLOCK_N']}"
        specs.append(
            spec(
                q4_0_dequant_gemm_kernel,
                f"{label}, {gemm['BLOCK_KB']} blocks]",
                types={"x_ptr": ptr[dt], "w_ptr": "*u8", "y_ptr": ptr[dt]},
                constexprs={
                    "BLOCK_M": gemm["BLOCK_M"],
                    "BLOCK_N": gemm["BLOCK_N"],
                    "BLOCK_KB": gemm["BLOCK_KB"],
                    "DOT_F32": False,
                    "IEEE": dt == torch.float32,
                    "F32_PRECISION": gemm.get("f32_precision", "ieee"),
                },
                num_warps=gemm["num_warps"],
                options={"num_stages": gemm["num_stages"]},
            )
        )
    return specs

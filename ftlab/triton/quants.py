"""GGUF Q8_0 and K-quant (Q4_K, Q5_K, Q6_K) dequantization, and Q8_0 quantization
(``quantize_q8_0_kernel``), in Triton (docs/OPS.md section 7;
the specification is the reference, ftlab/reference/quants.py).

Blocks are independent and a row's blocks are consecutive, so the packed tensor is one flat
array of NB blocks and the output one flat array of NB * block values. Each kernel runs one
program per ``BLOCK_B`` consecutive blocks, sized so that a program loads a tile of ~1024
quantized bytes (8 a thread at 4 warps of 32): enough work to hide load latency, few enough
registers that no target spills (``compile_specs``).

- ``q8_0_kernel``: a ``[BLOCK_B, 32]`` tile of int8 weights times each block's fp16 ``d``
  (32 blocks a program).
- ``q4_k_kernel`` (Q4_K, and Q5_K with ``FIFTH``): a ``[BLOCK_B, 4, 32]`` tile of ``qs`` bytes,
  sub-block pair p by byte i. Each byte is loaded once: its low nibble is weight i of
  sub-block 2p, its high nibble weight i of 2p + 1, stored as two tiles. The 6-bit scales and
  mins are decoded per (block, sub-block) by :func:`scale_min_k4` and broadcast over the 32
  weights (8 blocks a program).
- ``q6_k_kernel``: a ``[BLOCK_B, 4, 16]`` tile, g = 2 * half + (weight // 16) by weight % 16,
  of the three bytes that feed four weights (``ql`` bytes l and l + 32 of the half, ``qh``
  byte l); the four quarters of the half are four stores, each with its own int8 scale per
  (block, g) (16 blocks a program).

Exactness (the fp32 outputs equal the reference bit for bit for any bytes): every value is
computed in fp32 in the reference's order -- ``d * q``; ``(d * sc) * q - (dmin * m)``;
``(d * scales) * q`` -- and each kernel is launched with ``enable_fp_fusion=False``, so no
product is contracted into an FMA with the subtraction. fp16 scales are read from their two
little-endian bytes (:func:`~ftlab.triton.q4_0_common.load_q4_0_scale`: block sizes 34 and 210
leave them unaligned) and widened exactly, NaN, infinity and subnormals included. The single
rounding to fp16 / bf16 happens at the store (round to nearest even on GPUs; the CPU
interpreter's bf16 store truncates, which the tests allow for). Nothing is computed in bf16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.quant import QTYPES, QuantWeight
from ftlab.triton.q4_0_common import load_q4_0_scale, round_half_away


@triton.jit
def q8_0_kernel(w_ptr, out_ptr, NB, BLOCK_B: tl.constexpr):
    """Q8_0 (34 bytes / 32 weights: fp16 d, int8 q[32]): x = d * q."""
    b = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)[:, None]  # [B, 1]
    i = tl.arange(0, 32)[None, :]
    ok = b < NB
    wb = w_ptr + b * 34
    d = load_q4_0_scale(wb, ok)  # [B, 1]
    q = tl.load(wb + 2 + i, mask=ok, other=0).to(tl.int8, bitcast=True).to(tl.float32)
    tl.store(out_ptr + b * 32 + i, (d * q).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def scale_min_k4(sp, j, mask):
    """The 6-bit scale and min of sub-blocks ``j`` (0..7) from Q4_K / Q5_K's 12 packed bytes at
    ``sp`` (llama.cpp's ``get_scale_min_k4``), as fp32: j < 4 takes the low six bits of bytes
    j and j + 4; j >= 4 the nibbles of byte j + 4 and the top two bits of bytes j - 4 and j."""
    y = tl.load(sp + j, mask=mask, other=0).to(tl.int32)  # byte j
    x = tl.load(sp + j + 4, mask=mask, other=0).to(tl.int32)  # byte j + 4
    z = tl.load(sp + (j & 3), mask=mask, other=0).to(tl.int32)  # byte j - 4 (used where j >= 4)
    low = j < 4
    sc = tl.where(low, y & 0x3F, (x & 0x0F) | ((z >> 2) & 0x30))
    mn = tl.where(low, x & 0x3F, (x >> 4) | ((y >> 2) & 0x30))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def k_sub_block(out, q, d, dmin, sc, mn, mask):
    """Store ``(d * sc) * q - (dmin * mn)`` at ``out``: each product rounded on its own, as the
    reference rounds it (the launch turns FMA contraction off)."""
    scale = d * sc
    shift = dmin * mn
    tl.store(out, (scale * q.to(tl.float32) - shift).to(out.dtype.element_ty), mask=mask)


@triton.jit
def q4_k_kernel(w_ptr, out_ptr, NB, FIFTH: tl.constexpr, BLOCK_B: tl.constexpr):
    """Q4_K (144 bytes / 256 weights) or, with ``FIFTH``, Q5_K (176 bytes: ``qh[32]`` of fifth
    bits between the scales and ``qs``). Sub-block pair p is ``qs`` bytes 32p..32p + 31: low
    nibbles weights 64p.., high nibbles 64p + 32..; bit j of ``qh[i]`` tops weight i of
    sub-block j."""
    NBYTES: tl.constexpr = 176 if FIFTH else 144
    QS: tl.constexpr = 48 if FIFTH else 16
    b = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)[:, None, None]  # [B, 1, 1]
    p = tl.arange(0, 4)[None, :, None]  # [1, 4, 1] sub-block pair
    i = tl.arange(0, 32)[None, None, :]  # [1, 1, 32] byte of the pair
    ok = b < NB
    wb = w_ptr + b * NBYTES
    d = load_q4_0_scale(wb, ok)  # [B, 1, 1]
    dmin = load_q4_0_scale(wb + 2, ok)
    sc_lo, mn_lo = scale_min_k4(wb + 4, 2 * p, ok)  # [B, 4, 1]: sub-blocks 2p
    sc_hi, mn_hi = scale_min_k4(wb + 4, 2 * p + 1, ok)  # and 2p + 1
    qs = tl.load(wb + QS + 32 * p + i, mask=ok, other=0).to(tl.int32)  # [B, 4, 32]
    lo = qs & 0x0F
    hi = qs >> 4
    if FIFTH:
        # bit j of byte i: loaded once per pair p (the repeats hit the cache), since loading
        # [B, 1, 32] and broadcasting the bytes changes layout through shared memory
        qh_ptr = tl.broadcast_to(wb + 16 + i, (BLOCK_B, 4, 32))
        qh = tl.load(qh_ptr, mask=ok, other=0).to(tl.int32)  # [B, 4, 32]
        lo = lo | (((qh >> (2 * p)) & 1) << 4)
        hi = hi | (((qh >> (2 * p + 1)) & 1) << 4)
    ob = out_ptr + b * 256 + 64 * p + i
    k_sub_block(ob, lo, d, dmin, sc_lo, mn_lo, ok)
    k_sub_block(ob + 32, hi, d, dmin, sc_hi, mn_hi, ok)


@triton.jit
def q6_k_quarter(out, wb, low, two, d, j, mask):
    """Store quarter weights ``(d * scales[j]) * ((low | two << 4) - 32)`` at ``out``; ``j``
    indexes the block's 16 int8 scales (bytes 192..207)."""
    sc = tl.load(wb + 192 + j, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
    q = ((low | (two << 4)) - 32).to(tl.float32)
    tl.store(out, ((d * sc) * q).to(out.dtype.element_ty), mask=mask)


@triton.jit
def q6_k_kernel(w_ptr, out_ptr, NB, BLOCK_B: tl.constexpr):
    """Q6_K (210 bytes / 256 weights: ``ql[128]``, ``qh[64]``, ``scales[16]`` int8, fp16 d).
    Half h (weights 128h..) reads ``ql`` bytes 64h.. and ``qh`` bytes 128 + 32h..; weight l
    (0..31) of its quarter t is nibble t // 2 of ``ql`` byte l + 32 (t % 2) with bits 2t, 2t + 1
    of ``qh`` byte l, scaled by ``scales[8h + 2t + l // 16]``."""
    b = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)[:, None, None]  # [B, 1, 1]
    g = tl.arange(0, 4)[None, :, None]  # [1, 4, 1]: half g // 2, sixteen g % 2
    k = tl.arange(0, 16)[None, None, :]  # [1, 1, 16]
    h = g // 2
    l = 16 * (g % 2) + k  # noqa: E741 -- llama.cpp's name for the weight within a quarter
    ok = b < NB
    wb = w_ptr + b * 210
    d = load_q4_0_scale(wb + 208, ok)  # [B, 1, 1]
    ql0 = tl.load(wb + 64 * h + l, mask=ok, other=0).to(tl.int32)  # [B, 4, 16]: quarters 0, 2
    ql1 = tl.load(wb + 64 * h + 32 + l, mask=ok, other=0).to(tl.int32)  # quarters 1, 3
    qh = tl.load(wb + 128 + 32 * h + l, mask=ok, other=0).to(tl.int32)
    ob = out_ptr + b * 256 + 128 * h + l
    j = 8 * h + g % 2  # [1, 4, 1]: the scale of quarter 0; quarter t adds 2t
    q6_k_quarter(ob, wb, ql0 & 0x0F, qh & 3, d, j, ok)
    q6_k_quarter(ob + 32, wb, ql1 & 0x0F, (qh >> 2) & 3, d, j + 2, ok)
    q6_k_quarter(ob + 64, wb, ql0 >> 4, (qh >> 4) & 3, d, j + 4, ok)
    q6_k_quarter(ob + 96, wb, ql1 >> 4, qh >> 6, d, j + 6, ok)


@triton.jit
def quantize_q8_0_kernel(x_ptr, out_ptr, NB, BLOCK_B: tl.constexpr):
    """Q8_0 of ``BLOCK_B`` 32-blocks of x: ``d = amax / 127``, ``q = round_half_away(x * (1 / d))``
    (0 when d == 0), the quotients correctly rounded (``div_rn``: Triton's ``/`` is approximate
    on NVIDIA), d stored as fp16, then the 32 int8 -- gguf-py's bytes."""
    b = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)  # [B]
    i = tl.arange(0, 32)[None, :]
    ok = (b < NB)[:, None]
    x = tl.load(x_ptr + b[:, None] * 32 + i, mask=ok, other=0.0).to(tl.float32)  # [B, 32]
    amax = tl.max(tl.abs(x), axis=1)
    d = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))
    inv = tl.where(
        d == 0, 0.0, tl.math.div_rn(tl.full(d.shape, 1.0, tl.float32), tl.where(d == 0, 1.0, d))
    )
    q = round_half_away(x * inv[:, None]).to(tl.int32)
    bits = d.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    ob = out_ptr + b * 34
    tl.store(ob, (bits & 0xFF).to(tl.uint8), mask=b < NB)
    tl.store(ob + 1, (bits >> 8).to(tl.uint8), mask=b < NB)
    tl.store(ob[:, None] + 2 + i, (q & 0xFF).to(tl.uint8), mask=ok)


QUANTIZE_BLOCKS = 32  # 32-blocks a program of quantize_q8_0_kernel


def quantize(w: torch.Tensor, qtype: str) -> QuantWeight:
    """Backend entry of :func:`ftlab.ops.quantize` (``qtype`` "Q8_0"; w contiguous, finite)."""
    qt = QTYPES[qtype]
    nb = w.numel() // qt.block
    out = torch.empty(nb * qt.nbytes, dtype=torch.uint8, device=w.device)
    if nb:
        quantize_q8_0_kernel[(triton.cdiv(nb, QUANTIZE_BLOCKS),)](
            w, out, nb, BLOCK_B=QUANTIZE_BLOCKS, num_warps=NUM_WARPS, enable_fp_fusion=False
        )
    return QuantWeight(out.view(*w.shape[:-1], qt.row_bytes(w.shape[-1])), tuple(w.shape), qtype)


#: qtype -> (kernel, its constexprs); BLOCK_B makes each program's tile ~1024 quantized bytes.
LAUNCH: dict[str, tuple[object, dict[str, int]]] = {
    "Q8_0": (q8_0_kernel, {"BLOCK_B": 32}),  # [32, 32] int8
    "Q4_K": (q4_k_kernel, {"FIFTH": False, "BLOCK_B": 8}),  # [8, 4, 32] qs bytes
    "Q5_K": (q4_k_kernel, {"FIFTH": True, "BLOCK_B": 8}),
    "Q6_K": (q6_k_kernel, {"BLOCK_B": 16}),  # [16, 4, 16] x (ql, ql, qh) bytes
}
NUM_WARPS = 4


def dequantize(w: QuantWeight, dtype: torch.dtype) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.dequantize` (arguments validated, ``w.data`` non-empty):
    ``w``'s values (Q8_0, Q4_K, Q5_K or Q6_K), ``w.shape``, in ``dtype`` on ``w``'s device."""
    out = torch.empty(w.shape, dtype=dtype, device=w.device)
    nb = w.data.numel() // QTYPES[w.qtype].nbytes
    kernel, constexprs = LAUNCH[w.qtype]
    grid = (triton.cdiv(nb, constexprs["BLOCK_B"]),)
    kernel[grid](w.data, out, nb, **constexprs, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out


def compile_specs(target: str) -> list:
    """The configurations :func:`dequantize` launches, one per (type, output dtype), for
    ``ftlab compile-check``; the same on every ``target``."""
    from ftlab.triton.compile_spec import spec

    exact = {"enable_fp_fusion": False}
    dequant = [
        spec(
            kernel,
            f"{kernel.__name__}[{qtype}, {dt}, {constexprs['BLOCK_B']} blocks]",
            types={"w_ptr": "*u8", "out_ptr": f"*{dt}"},
            constexprs=constexprs,
            num_warps=NUM_WARPS,
            options=exact,
        )
        for qtype, (kernel, constexprs) in LAUNCH.items()
        for dt in ("fp32", "fp16", "bf16")
    ]
    quant = [
        spec(
            quantize_q8_0_kernel,
            f"quantize_q8_0_kernel[{dt}, {QUANTIZE_BLOCKS} blocks]",
            types={"x_ptr": f"*{dt}", "out_ptr": "*u8"},
            constexprs={"BLOCK_B": QUANTIZE_BLOCKS},
            num_warps=NUM_WARPS,
            options=exact,
        )
        for dt in ("fp32", "fp16", "bf16")
    ]
    return dequant + quant

"""GGUF Q4_0 in Triton (OPS.md section 2; reference: ftlab/reference/q4_0.py).

Kernels:
- ``quantize_q4_0_kernel``   fp -> Q4_0 blocks, byte-identical to gguf-py.
- ``dequantize_q4_0_kernel`` Q4_0 -> fp32/fp16/bf16.
- ``quantize_q8_1_kernel``   activations -> Q8_1 (q int8, d, s per 32-block).
- ``q4_0_mv_kernel``         the int8-dot matvec for small M (decode), split-K.
- ``q4_0_dequant_gemm_kernel`` large M (prefill): dequantize a weight tile in registers,
  then ``tl.dot`` on it.

Exactness: the quantizers must match the reference bit for bit, so they divide with
``div_rn`` (Triton's ``/`` is approximate on NVIDIA) and launch with
``enable_fp_fusion=False`` (``x * id + 8.5`` must round the product before the add).

Layout trick shared by the GEMM: a Q4_0 byte j holds elements j (low nibble) and j+16
(high nibble). ``tl.join(lo, hi)`` interleaves them, so the weight tile's K order is
(0, 16, 1, 17, ...); the activation tile is loaded in that same order, and the dot, a sum
over K, is unchanged.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ftlab.backends import DECODE_MAX_TOKENS
from ftlab.platform import current
from ftlab.quant import Q4_0_BLOCK_BYTES, Q8_1, QK, Q4_0Weight

# Launch configurations, one table. sm_90's matvec entry is the best of a sweep on an H200
# (benchmarks/NOTES.md); its GEMM entry and every gfx entry are untimed starting points
# (wave32 / wave64 sized), compile-checked for their targets.
CONFIGS: dict[str, dict[str, dict[str, int]]] = {
    # mv4 (the dp4a matvec over 32-bit words) where PTX dp4a exists (asm: 1); the gfx targets
    # keep mv, the int16-word matvec. sm_90 mv4: best of 12 (BLOCK_N 2-16, BLOCK_KB 32/64,
    # 2-8 warps, 4-32 programs per SM) on lm_head, 71.6% of copy (benchmarks/NOTES.md).
    "sm_90": {
        "mv": {"BLOCK_N": 64, "BLOCK_KB": 8, "num_warps": 4},
        "mv4": {"BLOCK_N": 4, "BLOCK_KB": 64, "num_warps": 4, "asm": 1, "progs_per_sm": 8},
        # the MoE decode experts' int8 matvecs (ftlab/triton/moe.py): best of 9 at T = 1
        "moe_mv": {"BLOCK_N": 4, "BLOCK_KB": 32, "num_warps": 2, "asm": 1},
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 3},
        "gemm_f32": {
            "BLOCK_M": 64,
            "BLOCK_N": 64,
            "BLOCK_KB": 1,
            "num_warps": 4,
            "num_stages": 2,
            "f32_precision": "tf32x3",
        },
    },
    "gfx1100": {
        "mv": {"BLOCK_N": 16, "BLOCK_KB": 8, "num_warps": 4},
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
        "gemm_f32": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
    },
    "gfx1201": {
        "mv": {"BLOCK_N": 16, "BLOCK_KB": 8, "num_warps": 4},
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
        "gemm_f32": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
    },
    "gfx942": {  # wave64; BLOCK_KB 8 spills SGPRs at M = 8
        "mv": {"BLOCK_N": 16, "BLOCK_KB": 4, "num_warps": 4},
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
        "gemm_f32": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
    },
    "default": {
        "mv": {"BLOCK_N": 16, "BLOCK_KB": 8, "num_warps": 4},
        "mv4": {"BLOCK_N": 4, "BLOCK_KB": 64, "num_warps": 4, "asm": 0, "progs_per_sm": 8},
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
        "gemm_f32": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
    },
}
CONFIGS["gfx1151"] = CONFIGS["gfx1100"]



def _table(device: torch.device) -> dict[str, dict[str, int]]:
    arch = current(device).arch if device.type != "cpu" else None
    return CONFIGS.get(arch or "default", CONFIGS["default"])


def config(kernel: str, device: torch.device) -> dict[str, int]:
    return dict(_table(device)[kernel])


# ------------------------------------------------------------------ quantize / dequantize


@triton.jit
def _round_half_away(v):
    t = v.to(tl.int32).to(tl.float32)  # truncation toward zero; v - t is exact
    return tl.where(tl.abs(v - t) >= 0.5, t + tl.where(v < 0, -1.0, 1.0), t)


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
def load_q4_0_scale(ptr, mask):
    """The fp16 scale at ``ptr`` (little-endian bytes) as fp32."""
    b0 = tl.load(ptr, mask=mask, other=0).to(tl.int32)
    b1 = tl.load(ptr + 1, mask=mask, other=0).to(tl.int32)
    return (b0 | (b1 << 8)).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


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


@triton.jit
def quantize_q8_1_kernel(x_ptr, x_stride, q_ptr, d_ptr, s_ptr, K, NBK, BLOCK_B: tl.constexpr):
    m = tl.program_id(0)
    b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    i = tl.arange(0, 32)
    ok = b < NBK
    col = b[:, None] * 32 + i[None, :]
    x = tl.load(x_ptr + m.to(tl.int64) * x_stride + col, mask=ok[:, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    d = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))
    safe = tl.where(d == 0, 1.0, d)
    q = tl.where(amax[:, None] == 0, 0.0, _round_half_away(tl.math.div_rn(x, safe[:, None])))
    qi = q.to(tl.int32)
    s = d * tl.sum(qi, axis=1).to(tl.float32)
    tl.store(q_ptr + m.to(tl.int64) * K + col, qi.to(tl.int8), mask=ok[:, None])
    tl.store(d_ptr + m * NBK + b, d, mask=ok)
    tl.store(s_ptr + m * NBK + b, s, mask=ok)


# ------------------------------------------------------------------ int8-dot matvec


@triton.jit
def q4_0_mv_kernel(
    w16_ptr, row_words, q8_ptr, d8_ptr, s8_ptr, part_ptr,
    M, N, K, NBK, KB_PER_SPLIT,
    MP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr,
):  # fmt: skip
    """partial[split, m, n] = sum over this split's blocks of d4 * (d8 * sumi - 8 * s8).

    The weight tile is read as 16-bit words ``[BLOCK_N, BLOCK_KB, 8]`` (the 16 ``qs`` bytes
    of each block; the ``d`` word is read apart), so neighbouring lanes read neighbouring
    words and a warp's loads stay contiguous within a row.
    """
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    i = tl.arange(0, 8)
    mrange = tl.arange(0, MP)
    acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
    row = n.to(tl.int64) * row_words
    kb_lo = split * KB_PER_SPLIT
    kb_hi = tl.minimum(kb_lo + KB_PER_SPLIT, NBK)
    for kb0 in range(kb_lo, kb_hi, BLOCK_KB):
        kb = kb0 + tl.arange(0, BLOCK_KB)
        kb_ok = kb < kb_hi
        wmask = n_ok[:, None, None] & kb_ok[None, :, None]
        w = tl.load(
            w16_ptr + row[:, None, None] + kb[None, :, None] * 9 + 1 + i[None, None, :],
            mask=wmask,
            other=0,
        )
        w = w.to(tl.int32) & 0xFFFF  # bytes 2i (low) and 2i+1 (high) of qs
        e0 = w & 15  # element 2i
        e1 = (w >> 8) & 15  # element 2i + 1
        e16 = (w >> 4) & 15  # element 2i + 16
        e17 = (w >> 12) & 15  # element 2i + 17
        dm = n_ok[:, None] & kb_ok[None, :]
        d4 = tl.load(w16_ptr + row[:, None] + kb[None, :] * 9, mask=dm, other=0)
        d4 = d4.to(tl.float16, bitcast=True).to(tl.float32)  # [BN, KB]
        for m in tl.static_range(MP):
            if m < M:
                xb = q8_ptr + m * K + kb[:, None] * 32 + 2 * i[None, :]  # [KB, 8]
                xm = kb_ok[:, None]
                x0 = tl.load(xb, mask=xm, other=0).to(tl.int32)
                x1 = tl.load(xb + 1, mask=xm, other=0).to(tl.int32)
                x16 = tl.load(xb + 16, mask=xm, other=0).to(tl.int32)
                x17 = tl.load(xb + 17, mask=xm, other=0).to(tl.int32)
                prod = e0 * x0[None] + e1 * x1[None] + e16 * x16[None] + e17 * x17[None]
                sumi = tl.sum(prod, axis=2)  # [BN, KB], exact
                d8 = tl.load(d8_ptr + m * NBK + kb, mask=kb_ok, other=0.0)
                s8 = tl.load(s8_ptr + m * NBK + kb, mask=kb_ok, other=0.0)
                part = tl.sum(d4 * (d8[None, :] * sumi.to(tl.float32) - 8.0 * s8[None, :]), axis=1)
                acc += tl.where(mrange[:, None] == m, part[None, :], 0.0)
    out = part_ptr + split.to(tl.int64) * M * N + mrange[:, None] * N + n[None, :]
    tl.store(out, acc, mask=(mrange[:, None] < M) & n_ok[None, :])


@triton.jit
def _dp4a(a, b, c, ASM: tl.constexpr):
    """c + the dot of the four signed bytes of a and of b (int32 tensors).

    ``ASM``: PTX ``dp4a`` (NVIDIA); else the same sum from sign-extended bytes (any target,
    and the CPU interpreter, which runs no inline assembly)."""
    if ASM:
        return tl.inline_asm_elementwise(
            "dp4a.s32.s32 $0, $1, $2, $3;",
            "=r,r,r,r",
            [a, b, c],
            dtype=tl.int32,
            is_pure=True,
            pack=1,
        )
    else:
        r = c
        for j in tl.static_range(4):
            r += ((a << (24 - 8 * j)) >> 24) * ((b << (24 - 8 * j)) >> 24)
        return r


@triton.jit
def _qs_word(w_lo, w_hi, odd):
    """qs word i of a block from the row's 32-bit words j and j + 1 (j = 9b/2 + i): an odd
    block's qs are word-aligned (word j + 1), an even block's straddle two words."""
    lo = w_lo.to(tl.uint32, bitcast=True)
    hi = w_hi.to(tl.uint32, bitcast=True)
    return tl.where(odd, hi, (lo >> 16) | (hi << 16)).to(tl.int32, bitcast=True)


@triton.jit
def _load_blocks(w32_ptr, w16_ptr, row32, kb, mask):
    """The four qs words and the fp32 scale of blocks ``kb`` of rows ``row32`` (word offsets
    of the rows), ``[BN, KB]`` each: five word loads per block (block b starts at word 9b/2)."""
    wp = w32_ptr + row32[:, None] + ((kb * 9) // 2)[None, :]
    w0 = tl.load(wp, mask=mask, other=0)
    w1 = tl.load(wp + 1, mask=mask, other=0)
    w2 = tl.load(wp + 2, mask=mask, other=0)
    w3 = tl.load(wp + 3, mask=mask, other=0)
    w4 = tl.load(wp + 4, mask=mask, other=0)
    odd = (kb % 2 == 1)[None, :]
    d4 = tl.load(w16_ptr + 2 * row32[:, None] + (kb * 9)[None, :], mask=mask, other=0)
    d4 = d4.to(tl.float16, bitcast=True).to(tl.float32)
    return (_qs_word(w0, w1, odd), _qs_word(w1, w2, odd), _qs_word(w2, w3, odd),
            _qs_word(w3, w4, odd), d4)  # fmt: skip


@triton.jit
def _load_x_words(xp, mask):
    """The eight q8 words of blocks at ``xp`` (``[KB]`` word pointers), each ``[1, KB]``."""
    return (tl.load(xp, mask=mask, other=0)[None, :], tl.load(xp + 1, mask=mask, other=0)[None, :],
            tl.load(xp + 2, mask=mask, other=0)[None, :], tl.load(xp + 3, mask=mask, other=0)[None, :],
            tl.load(xp + 4, mask=mask, other=0)[None, :], tl.load(xp + 5, mask=mask, other=0)[None, :],
            tl.load(xp + 6, mask=mask, other=0)[None, :], tl.load(xp + 7, mask=mask, other=0)[None, :])  # fmt: skip


@triton.jit
def _block_sums(q0, q1, q2, q3, x0, x1, x2, x3, x4, x5, x6, x7, ASM: tl.constexpr):
    """Exact int8 sums of blocks: low nibbles (elements 4i..4i+3) against q8 words 0..3, high
    nibbles (elements 4i+16..4i+19) against words 4..7."""
    s = _dp4a(q0 & 0x0F0F0F0F, x0, tl.zeros(q0.shape, dtype=tl.int32), ASM)
    s = _dp4a(q1 & 0x0F0F0F0F, x1, s, ASM)
    s = _dp4a(q2 & 0x0F0F0F0F, x2, s, ASM)
    s = _dp4a(q3 & 0x0F0F0F0F, x3, s, ASM)
    s = _dp4a((q0 >> 4) & 0x0F0F0F0F, x4, s, ASM)
    s = _dp4a((q1 >> 4) & 0x0F0F0F0F, x5, s, ASM)
    s = _dp4a((q2 >> 4) & 0x0F0F0F0F, x6, s, ASM)
    return _dp4a((q3 >> 4) & 0x0F0F0F0F, x7, s, ASM)


@triton.jit
def q4_0_mv4_kernel(
    w32_ptr, w16_ptr, row_words, q8w_ptr, d8_ptr, s8_ptr, part_ptr,
    M, N, K, NBK, KB_PER_SPLIT,
    MP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, ASM: tl.constexpr,
    HOIST: tl.constexpr,
):  # fmt: skip
    """partial[split, m, n] as q4_0_mv_kernel computes it, a block's int8 dot taken as eight
    4-byte dots of 32-bit words (dp4a) over ``[BLOCK_N, BLOCK_KB]`` tiles of blocks.

    Rows hold an even number of blocks, so they are read as 32-bit words: block b's bytes
    start at word 9b/2 (its fp16 scale in the low half for even b, the high half for odd b);
    five word loads per block give its four qs words, nibbles masked as the HIP kernel does:
    (w & 0x0F0F0F0F) are elements 4i..4i+3, ((w >> 4) & 0x0F0F0F0F) elements 4i+16..4i+19.

    ``HOIST`` (M = 1, K in one tile): y[n] is written straight to ``part_ptr`` (of the output
    dtype) by a persistent grid that keeps the activations in registers.
    """
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    if HOIST:
        # the activations are loaded once; the program walks row tiles pid_n, pid_n + programs..
        kb = tl.arange(0, BLOCK_KB)
        kb_ok = kb < NBK
        x0, x1, x2, x3, x4, x5, x6, x7 = _load_x_words(q8w_ptr + kb * 8, kb_ok)
        x_d = tl.load(d8_ptr + kb, mask=kb_ok, other=0.0)[None, :]
        x_s = tl.load(s8_ptr + kb, mask=kb_ok, other=0.0)[None, :]
        for tile in range(pid_n, tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
            n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = n < N
            row32 = n.to(tl.int64) * row_words
            q0, q1, q2, q3, d4 = _load_blocks(
                w32_ptr, w16_ptr, row32, kb, n_ok[:, None] & kb_ok[None, :]
            )
            sumi = _block_sums(q0, q1, q2, q3, x0, x1, x2, x3, x4, x5, x6, x7, ASM)
            y = tl.sum(d4 * (x_d * sumi.to(tl.float32) - 8.0 * x_s), axis=1)
            tl.store(part_ptr + n, y.to(part_ptr.dtype.element_ty), mask=n_ok)
    else:
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < N
        mrange = tl.arange(0, MP)
        acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
        row32 = n.to(tl.int64) * row_words
        kb_lo = split * KB_PER_SPLIT
        kb_hi = tl.minimum(kb_lo + KB_PER_SPLIT, NBK)
        for kb0 in range(kb_lo, kb_hi, BLOCK_KB):
            kb = kb0 + tl.arange(0, BLOCK_KB)
            kb_ok = kb < kb_hi
            q0, q1, q2, q3, d4 = _load_blocks(
                w32_ptr, w16_ptr, row32, kb, n_ok[:, None] & kb_ok[None, :]
            )
            for m in tl.static_range(MP):
                if m < M:
                    x0, x1, x2, x3, x4, x5, x6, x7 = _load_x_words(
                        q8w_ptr + m * (K // 4) + kb * 8, kb_ok
                    )
                    sumi = _block_sums(q0, q1, q2, q3, x0, x1, x2, x3, x4, x5, x6, x7, ASM)
                    d8 = tl.load(d8_ptr + m * NBK + kb, mask=kb_ok, other=0.0)
                    s8 = tl.load(s8_ptr + m * NBK + kb, mask=kb_ok, other=0.0)
                    part = tl.sum(
                        d4 * (d8[None, :] * sumi.to(tl.float32) - 8.0 * s8[None, :]), axis=1
                    )
                    acc += tl.where(mrange[:, None] == m, part[None, :], 0.0)
        out = part_ptr + split.to(tl.int64) * M * N + mrange[:, None] * N + n[None, :]
        tl.store(out, acc, mask=(mrange[:, None] < M) & n_ok[None, :])


# ------------------------------------------------------------------ prefill GEMM


@triton.jit
def q4_0_dequant_gemm_kernel(
    x_ptr, x_stride, w_ptr, row_bytes, y_ptr, y_stride,
    M, N, NBK,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, DOT_F32: tl.constexpr,
    IEEE: tl.constexpr, F32_PRECISION: tl.constexpr = "ieee",
):  # fmt: skip
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


def quantize_q8_1(x: torch.Tensor) -> Q8_1:
    """Backend entry of :func:`ftlab.ops.quantize_q8_1` (x [M, K], rows contiguous)."""
    m, k = x.shape
    nbk = k // QK
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    d = torch.empty((m, nbk), dtype=torch.float32, device=x.device)
    s = torch.empty((m, nbk), dtype=torch.float32, device=x.device)
    if m and nbk:
        grid = (m, triton.cdiv(nbk, 16))
        quantize_q8_1_kernel[grid](
            x, x.stride(0), q, d, s, k, nbk, BLOCK_B=16, enable_fp_fusion=False
        )
    return Q8_1(q, d, s)


def _sm_count(device: torch.device) -> int:
    if device.type == "cpu":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _use_mv4(w: Q4_0Weight) -> bool:
    """The dp4a matvec reads 32-bit words: rows of an even number of blocks, an aligned base,
    and a target whose table has an ``mv4`` entry."""
    return (w.shape[-1] // QK) % 2 == 0 and w.data.data_ptr() % 4 == 0 and "mv4" in _table(w.device)


def q4_0_matvec(x8: Q8_1, w: Q4_0Weight, out_dtype: torch.dtype) -> torch.Tensor:
    """int8-dot ``[M <= 8, K] x [N, K] -> [M, N]``; split-K when N alone would leave SMs idle."""
    m, k = x8.q.shape
    n = w.shape[0]
    nbk = k // QK
    dot = _use_mv4(w)
    cfg = config("mv4" if dot else "mv", w.device)
    programs_n = triton.cdiv(n, cfg["BLOCK_N"])
    splits = max(
        1, min(triton.cdiv(2 * _sm_count(w.device), programs_n), triton.cdiv(nbk, cfg["BLOCK_KB"]))
    )
    kb_per_split = triton.cdiv(triton.cdiv(nbk, splits), cfg["BLOCK_KB"]) * cfg["BLOCK_KB"]
    splits = triton.cdiv(nbk, kb_per_split)
    if dot and m == 1 and nbk <= cfg["BLOCK_KB"]:
        y = torch.empty((1, n), dtype=out_dtype, device=w.device)
        programs = min(programs_n, _sm_count(w.device) * cfg["progs_per_sm"])
        q4_0_mv4_kernel[(programs, 1)](
            w.data.view(torch.int32), w.data.view(torch.int16), w.data.shape[-1] // 4,
            x8.q.view(torch.int32), x8.d, x8.s, y, m, n, k, nbk, nbk,
            MP=1, BLOCK_N=cfg["BLOCK_N"], BLOCK_KB=cfg["BLOCK_KB"],
            ASM=bool(cfg["asm"]) and not _interpreted(), HOIST=True, num_warps=cfg["num_warps"],
        )  # fmt: skip
        return y
    parts = torch.empty((splits, m, n), dtype=torch.float32, device=w.device)
    if dot:
        q4_0_mv4_kernel[(programs_n, splits)](
            w.data.view(torch.int32), w.data.view(torch.int16), w.data.shape[-1] // 4,
            x8.q.view(torch.int32), x8.d, x8.s, parts, m, n, k, nbk, kb_per_split,
            MP=triton.next_power_of_2(m), BLOCK_N=cfg["BLOCK_N"], BLOCK_KB=cfg["BLOCK_KB"],
            ASM=bool(cfg["asm"]) and not _interpreted(), HOIST=False, num_warps=cfg["num_warps"],
        )  # fmt: skip
    else:
        q4_0_mv_kernel[(programs_n, splits)](
            w.data.view(torch.int16), w.data.shape[-1] // 2, x8.q, x8.d, x8.s, parts,
            m, n, k, nbk, kb_per_split,
            MP=triton.next_power_of_2(m), BLOCK_N=cfg["BLOCK_N"], BLOCK_KB=cfg["BLOCK_KB"],
            num_warps=cfg["num_warps"],
        )  # fmt: skip
    y = parts[0] if splits == 1 else parts.sum(0)
    return y.to(out_dtype)


def q4_0_dequant_gemm(x: torch.Tensor, w: Q4_0Weight) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    cfg = config("gemm_f32" if x.dtype == torch.float32 else "gemm", x.device)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]))
    q4_0_dequant_gemm_kernel[grid](
        x, x.stride(0), w.data, w.data.shape[-1], y, y.stride(0), m, n, k // QK,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_KB=cfg["BLOCK_KB"],
        DOT_F32=x.dtype == torch.bfloat16 and _interpreted(),
        IEEE=x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and _interpreted()),
        F32_PRECISION=cfg.get("f32_precision", "ieee") if not _interpreted() else "ieee",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    return y


def q4_0_matmul(x: torch.Tensor, w: Q4_0Weight, path: str) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.q4_0_matmul` (path already resolved)."""
    if path == "int8":  # the matvec takes up to DECODE_MAX_TOKENS rows a pass over W
        x8, rows = quantize_q8_1(x), DECODE_MAX_TOKENS
        outs = [q4_0_matvec(Q8_1(x8.q[i : i + rows], x8.d[i : i + rows], x8.s[i : i + rows]), w, x.dtype)
                for i in range(0, x.shape[0], rows)]  # fmt: skip
        return outs[0] if len(outs) == 1 else torch.cat(outs)
    return q4_0_dequant_gemm(x, w)


def compile_specs(target: str) -> list:
    """The configurations ftlab launches on ``target``, for ftlab.compile_check."""
    from ftlab.compile_check import TritonSpec

    cfg = CONFIGS.get(target, CONFIGS["default"])
    ptr = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}
    exact = {"enable_fp_fusion": False}
    specs = []
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        name = str(dt).removeprefix("torch.")
        specs += [
            TritonSpec(f"quantize_q4_0_kernel[{name}]", quantize_q4_0_kernel,
                       {"x_ptr": ptr[dt], "out_ptr": "*u8", "NB": "i32", "BLOCK_B": "constexpr"},
                       {"BLOCK_B": _BLOCKS_PER_PROGRAM}, options=exact),
            TritonSpec(f"dequantize_q4_0_kernel[{name}]", dequantize_q4_0_kernel,
                       {"w_ptr": "*u8", "out_ptr": ptr[dt], "NB": "i32", "BLOCK_B": "constexpr"},
                       {"BLOCK_B": _BLOCKS_PER_PROGRAM}),
            TritonSpec(f"quantize_q8_1_kernel[{name}]", quantize_q8_1_kernel,
                       {"x_ptr": ptr[dt], "x_stride": "i32", "q_ptr": "*i8", "d_ptr": "*fp32", "s_ptr": "*fp32",
                        "K": "i32", "NBK": "i32", "BLOCK_B": "constexpr"},
                       {"BLOCK_B": 16}, options=exact),
        ]  # fmt: skip
    mv = cfg["mv"]
    for mp in (1, 8):
        specs.append(TritonSpec(
            f"q4_0_mv_kernel[M<={mp}, {mv['BLOCK_N']}x{mv['BLOCK_KB']} blocks]", q4_0_mv_kernel,
            {"w16_ptr": "*i16", "row_words": "i32", "q8_ptr": "*i8", "d8_ptr": "*fp32", "s8_ptr": "*fp32",
             "part_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "NBK": "i32", "KB_PER_SPLIT": "i32",
             "MP": "constexpr", "BLOCK_N": "constexpr", "BLOCK_KB": "constexpr"},
            {"MP": mp, "BLOCK_N": mv["BLOCK_N"], "BLOCK_KB": mv["BLOCK_KB"]}, num_warps=mv["num_warps"],
        ))  # fmt: skip
    if "mv4" in cfg:
        mv4 = cfg["mv4"]
        for mp, hoist in ((1, True), (1, False), (8, False)):
            specs.append(TritonSpec(
                f"q4_0_mv4_kernel[M<={mp}{', hoisted' if hoist else ''}, {mv4['BLOCK_N']}x{mv4['BLOCK_KB']} blocks]",
                q4_0_mv4_kernel,
                {"w32_ptr": "*i32", "w16_ptr": "*i16", "row_words": "i32", "q8w_ptr": "*i32", "d8_ptr": "*fp32",
                 "s8_ptr": "*fp32", "part_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "NBK": "i32",
                 "KB_PER_SPLIT": "i32", "MP": "constexpr", "BLOCK_N": "constexpr", "BLOCK_KB": "constexpr",
                 "ASM": "constexpr", "HOIST": "constexpr"},
                {"MP": mp, "BLOCK_N": mv4["BLOCK_N"], "BLOCK_KB": mv4["BLOCK_KB"], "ASM": bool(mv4["asm"]),
                 "HOIST": hoist},
                num_warps=mv4["num_warps"],
            ))  # fmt: skip
    gemm = cfg["gemm"]
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        gemm = cfg["gemm_f32" if dt == torch.float32 else "gemm"]
        label = f"q4_0_dequant_gemm_kernel[{str(dt).removeprefix('torch.')}, {gemm['BLOCK_M']}x{gemm['BLOCK_N']}"
        specs.append(TritonSpec(
            f"{label}, {gemm['BLOCK_KB']} blocks]",
            q4_0_dequant_gemm_kernel,
            {"x_ptr": ptr[dt], "x_stride": "i32", "w_ptr": "*u8", "row_bytes": "i32", "y_ptr": ptr[dt],
             "y_stride": "i32", "M": "i32", "N": "i32", "NBK": "i32", "BLOCK_M": "constexpr",
             "BLOCK_N": "constexpr", "BLOCK_KB": "constexpr", "DOT_F32": "constexpr", "IEEE": "constexpr",
             "F32_PRECISION": "constexpr"},
            {"BLOCK_M": gemm["BLOCK_M"], "BLOCK_N": gemm["BLOCK_N"], "BLOCK_KB": gemm["BLOCK_KB"],
             "DOT_F32": False, "IEEE": dt == torch.float32,
             "F32_PRECISION": gemm.get("f32_precision", "ieee")},
            num_warps=gemm["num_warps"], options={"num_stages": gemm["num_stages"]},
        ))  # fmt: skip
    return specs

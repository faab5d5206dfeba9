"""Shared Triton helpers of the Q4_0 kernels: the Triton twin of ``hip/csrc/q4_0_common.h``.

Used by ``ftlab/triton/q4_0.py`` (quantizers, GEMM), ``ftlab/triton/q4_0_matvec.py`` (the int8
matvecs), ``ftlab/triton/moe.py`` (the int8-path expert kernels) and ``ftlab/triton/moe_gemm.py``
(the grouped GEMM's dequantized tiles):

- block access: :func:`load_q4_0_scale` (the fp16 scale of a block), :func:`load_blocks` /
  :func:`load_blocks_h16` (a tile of blocks as four ``qs`` words and the scale, rows of an even
  / odd number of blocks), :func:`load_x_words` (eight words of Q8_1 activations);
- arithmetic: :func:`dp4a` (PTX dp4a on NVIDIA, byte sums elsewhere and in the interpreter),
  :func:`block_sums` (the exact int8 dot of a Q4_0 block with a Q8_1 block),
  :func:`round_half_away` (C's roundf);
- activations: :func:`quantize_q8_1` (its kernel ``quantize_q8_1_kernel``; ``ftlab/triton/q4_0.py``
  serves it as ``ops.quantize_q8_1``'s entry), the int8 paths' other side;
- split-K matvecs (these and ``ftlab/triton/quant_matmul_mv*.py``'s): :func:`split_k` (the second
  grid axis), :func:`split_tile` (a program's rows and units), :func:`add_row`,
  :func:`store_split` (its partial sums), :func:`sum_splits`;
- launch: ``CONFIGS`` (the per-arch launch configurations, one table), :func:`config`,
  :func:`launch_table`, :func:`sm_count`, :func:`interpreted`.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ftlab.backends import tuning
from ftlab.platform import current
from ftlab.quant import Q8_1, QK

CONFIGS = tuning.TRITON_Q4_0


def launch_table(device: torch.device) -> dict[str, dict[str, int]]:
    """The launch configurations for ``device``'s arch (``interpreter`` on the CPU, ``default`` on
    unknown archs)."""
    if device.type == "cpu":
        return CONFIGS["interpreter"]
    return CONFIGS.get(current(device).arch or "default", CONFIGS["default"])


def config(kernel: str, device: torch.device) -> dict[str, int]:
    """A copy of the launch configuration of ``kernel`` on ``device``'s arch."""
    return dict(launch_table(device)[kernel])


def sm_count(device: torch.device) -> int:
    """Multiprocessors (SMs / CUs) of ``device``; 4 in the CPU interpreter."""
    if device.type == "cpu":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def interpreted() -> bool:
    """Whether Triton runs in its CPU interpreter (no inline assembly, wrong bf16 arithmetic)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def split_k(units: int, step: int, programs_n: int, device: torch.device) -> tuple[int, int]:
    """(splits, units per split) of a matvec whose ``programs_n`` programs along N walk ``units``
    units of K ``step`` at a time: split-K over a second grid axis up to two programs an SM (one
    split where N alone gives them), each split a whole number of steps, none empty."""
    splits = max(1, min(triton.cdiv(2 * sm_count(device), programs_n), triton.cdiv(units, step)))
    per_split = triton.cdiv(triton.cdiv(units, splits), step) * step
    return triton.cdiv(units, per_split), per_split


def sum_splits(parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[M, N]`` in ``dtype``: the sum of a split-K matvec's fp32 partial sums ``[splits, M,
    N]``."""
    return (parts[0] if parts.shape[0] == 1 else parts.sum(0)).to(dtype)


# ------------------------------------------------------------------ device helpers


@triton.jit
def round_half_away(v):
    t = v.to(tl.int32).to(tl.float32)  # truncation toward zero; v - t is exact
    return tl.where(tl.abs(v - t) >= 0.5, t + tl.where(v < 0, -1.0, 1.0), t)


@triton.jit
def load_q4_0_scale(ptr, mask):
    """The fp16 scale at ``ptr`` (little-endian bytes) as fp32."""
    b0 = tl.load(ptr, mask=mask, other=0).to(tl.int32)
    b1 = tl.load(ptr + 1, mask=mask, other=0).to(tl.int32)
    return (b0 | (b1 << 8)).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def dp4a(a, b, c, ASM: tl.constexpr):
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
def qs_word(w_lo, w_hi, odd):
    """qs word i of a block from the row's 32-bit words j and j + 1 (j = 9b/2 + i): an odd
    block's qs are word-aligned (word j + 1), an even block's straddle two words."""
    lo = w_lo.to(tl.uint32, bitcast=True)
    hi = w_hi.to(tl.uint32, bitcast=True)
    return tl.where(odd, hi, (lo >> 16) | (hi << 16)).to(tl.int32, bitcast=True)


@triton.jit
def load_blocks(w32_ptr, w16_ptr, row32, kb, mask):
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
    return (
        qs_word(w0, w1, odd),
        qs_word(w1, w2, odd),
        qs_word(w2, w3, odd),
        qs_word(w3, w4, odd),
        d4,
    )


@triton.jit
def load_x_words(xp, mask):
    """The eight q8 words of blocks at ``xp`` (``[KB]`` word pointers), each ``[1, KB]``."""
    return (
        tl.load(xp, mask=mask, other=0)[None, :],
        tl.load(xp + 1, mask=mask, other=0)[None, :],
        tl.load(xp + 2, mask=mask, other=0)[None, :],
        tl.load(xp + 3, mask=mask, other=0)[None, :],
        tl.load(xp + 4, mask=mask, other=0)[None, :],
        tl.load(xp + 5, mask=mask, other=0)[None, :],
        tl.load(xp + 6, mask=mask, other=0)[None, :],
        tl.load(xp + 7, mask=mask, other=0)[None, :],
    )


@triton.jit
def block_sums(q0, q1, q2, q3, x0, x1, x2, x3, x4, x5, x6, x7, ASM: tl.constexpr):
    """Exact int8 sums of blocks: low nibbles (elements 4i..4i+3) against q8 words 0..3, high
    nibbles (elements 4i+16..4i+19) against words 4..7."""
    s = dp4a(q0 & 0x0F0F0F0F, x0, tl.zeros(q0.shape, dtype=tl.int32), ASM)
    s = dp4a(q1 & 0x0F0F0F0F, x1, s, ASM)
    s = dp4a(q2 & 0x0F0F0F0F, x2, s, ASM)
    s = dp4a(q3 & 0x0F0F0F0F, x3, s, ASM)
    s = dp4a((q0 >> 4) & 0x0F0F0F0F, x4, s, ASM)
    s = dp4a((q1 >> 4) & 0x0F0F0F0F, x5, s, ASM)
    s = dp4a((q2 >> 4) & 0x0F0F0F0F, x6, s, ASM)
    return dp4a((q3 >> 4) & 0x0F0F0F0F, x7, s, ASM)


@triton.jit
def split_tile(N, UNITS, PER_SPLIT, BLOCK_N: tl.constexpr):
    """A split-K matvec program's share (:func:`split_k`): its split ``program_id(1)``, the rows
    ``n`` ``[BLOCK_N]`` of row tile ``program_id(0)``, ``n < N``, and its units ``lo .. hi`` of
    ``UNITS``."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    lo = split * PER_SPLIT
    return split, n, n < N, lo, tl.minimum(lo + PER_SPLIT, UNITS)


@triton.jit
def add_row(acc, part, m, MP: tl.constexpr):
    """``acc`` ``[MP, BN]`` with ``part`` ``[BN]`` added to its row ``m``."""
    return acc + tl.where(tl.arange(0, MP)[:, None] == m, part[None, :], 0.0)


@triton.jit
def store_split(part_ptr, acc, split, n, n_ok, M, N, MP: tl.constexpr):
    """A program's partial sums ``acc`` ``[MP, BN]`` of rows ``n`` to ``partial[split, :M, n]``
    (``part_ptr``: fp32 ``[splits, M, N]``, summed by :func:`sum_splits`)."""
    mrange = tl.arange(0, MP)
    out = part_ptr + split.to(tl.int64) * M * N + mrange[:, None] * N + n[None, :]
    tl.store(out, acc, mask=(mrange[:, None] < M) & n_ok[None, :])


@triton.jit
def load_blocks_h16(w16_ptr, row16, kb, mask):
    """``load_blocks`` for rows of an odd number of blocks (not word-aligned): block b is
    halfwords 9b (the fp16 scale) .. 9b + 8 (qs), nine halfword loads."""
    hp = w16_ptr + row16[:, None] + (kb * 9)[None, :]
    d4 = tl.load(hp, mask=mask, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    h1 = tl.load(hp + 1, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h2 = tl.load(hp + 2, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h3 = tl.load(hp + 3, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h4 = tl.load(hp + 4, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h5 = tl.load(hp + 5, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h6 = tl.load(hp + 6, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h7 = tl.load(hp + 7, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h8 = tl.load(hp + 8, mask=mask, other=0).to(tl.int32) & 0xFFFF
    return h1 | (h2 << 16), h3 | (h4 << 16), h5 | (h6 << 16), h7 | (h8 << 16), d4


def rows_16(x: torch.Tensor) -> torch.Tensor:
    """``x`` [M, K] with unit column stride, its rows as the dequant GEMMs' compile-check rows
    assume them (``multiple_of_16`` of their specs): a 16-byte-aligned start and a row stride that
    is a multiple of 16 elements -- ``x`` itself when it has them, else a contiguous copy (K a
    multiple of 16, as every quantized type's K is)."""
    if x.data_ptr() % 16 == 0 and x.stride(0) % 16 == 0 and x.stride(1) == 1:
        return x
    return x.clone(memory_format=torch.contiguous_format)


# ------------------------------------------------------------------ Q8_1 activations
# (the int8 paths' other side: ftlab.triton.q4_0's entry of ops.quantize_q8_1, and the K-quant
# matvecs' and experts' quantizer)


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
    q = tl.where(amax[:, None] == 0, 0.0, round_half_away(tl.math.div_rn(x, safe[:, None])))
    qi = q.to(tl.int32)
    s = d * tl.sum(qi, axis=1).to(tl.float32)
    tl.store(q_ptr + m.to(tl.int64) * K + col, qi.to(tl.int8), mask=ok[:, None])
    tl.store(d_ptr + m * NBK + b, d, mask=ok)
    tl.store(s_ptr + m * NBK + b, s, mask=ok)


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

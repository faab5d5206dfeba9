"""The tile matvecs of Q8_0 and the K-quants in Triton (decode; docs/OPS.md section 11;
reference: ``ftlab/reference/quant_matmul.py``): ``quant_matvec``'s ``"tiles"`` variant
(``ftlab/triton/quant_matmul_mv.py``), for the rows the word-tiled kernel of
``ftlab/triton/quant_matmul_mvw.py`` cannot read.

One program takes ``BLOCK_N`` weight rows and walks its share of K (split-K over a second grid
axis when the rows alone would leave SMs idle) ``BLOCK_SB`` blocks at a time, reading each
weight byte once for all the M rows of activations: the blocks' integers are unpacked in
registers as 32-bit words of four weights, each sub-block's exact integer dot with its Q8_1
block is a sum of 4-byte dots (PTX dp4a on NVIDIA, byte products elsewhere: ``dp4a`` of
``q4_0_common``), and the terms are scaled in fp32 as the reference scales them:

- ``q8_0_mv_kernel``: ``[BLOCK_N, BLOCK_SB, 8]`` words of int8 weights, read as halfword pairs
  (34-byte blocks are 2-byte aligned); ``d * (d8 * sumi)``.
- ``q4_k_mv_kernel`` (Q4_K; Q5_K with ``FIFTH``): ``[BLOCK_N, BLOCK_SB, 4, 8]`` ``qs`` words
  (sub-block pair p by word i: low nibbles sub-block 2p, high 2p + 1; blocks are whole words);
  ``d * (d8 * (sc * sumi)) - dmin * (m * s8)``.
- ``q6_k_mv_kernel``: ``[BLOCK_N, BLOCK_SB, 2, 2, 4]`` (half, sixteen, word) of the ``ql`` and
  ``qh`` words feeding the four quarters, read as halfword pairs; ``d * (d8 * (scales * sumi))``
  per 16-sub-block, the offset of 32 taken out as ``32 * sum(q8)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.quant import Q8_1, QTYPES, QuantWeight
from ftlab.triton.q4_0_common import (
    add_row,
    dp4a,
    split_k,
    split_tile,
    store_split,
    sum_splits,
)
from ftlab.triton.quant_matmul_mvw import f16_bits
from ftlab.triton.quants import scale_min_k4

#: per type: rows and blocks of a program's tile, warps. Untimed starting points: 2048 weights
#: a tile (4 rows of 512), 16 a thread at 4 warps.
MV_CONFIGS: dict[str, dict[str, int]] = {
    "Q8_0": {"BLOCK_N": 4, "BLOCK_SB": 16, "num_warps": 4},
    "Q4_K": {"BLOCK_N": 4, "BLOCK_SB": 2, "num_warps": 4},
    "Q5_K": {"BLOCK_N": 4, "BLOCK_SB": 2, "num_warps": 4},
    "Q6_K": {"BLOCK_N": 4, "BLOCK_SB": 2, "num_warps": 4},
}


@triton.jit
def _words16(p, mask):
    """int32 words of two consecutive 16-bit loads at ``p`` (2-byte aligned data)."""
    lo = tl.load(p, mask=mask, other=0).to(tl.int32) & 0xFFFF
    hi = tl.load(p + 1, mask=mask, other=0).to(tl.int32) & 0xFFFF
    return lo | (hi << 16)


@triton.jit
def _dot_words(q, x, axis: tl.constexpr, ASM: tl.constexpr):
    """Exact int32 sum over ``axis`` of the 4-byte dots of words ``q`` and ``x`` (broadcast)."""
    q, x = tl.broadcast(q, x)
    return tl.sum(dp4a(q, x, tl.zeros(q.shape, dtype=tl.int32), ASM), axis=axis)


@triton.jit
def q8_0_mv_kernel(
    w_ptr,
    w16_ptr,
    row_bytes,
    q8w_ptr,
    d8_ptr,
    s8_ptr,
    part_ptr,
    M,
    N,
    K,
    NSB,
    SB_PER_SPLIT,
    ASM: tl.constexpr,
    MP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SB: tl.constexpr,
):
    """partial[split, m, n] = sum over this split's 32-blocks of d * (d8 * sumi). Block b is
    halfwords 17b (d) .. 17b + 16 of the row: its q words are halfword pairs 17b + 1 + 2i."""
    split, n, n_ok, lo, hi = split_tile(N, NSB, SB_PER_SPLIT, BLOCK_N)
    i = tl.arange(0, 8)
    row16 = n.to(tl.int64) * (row_bytes // 2)
    acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
    for b0 in range(lo, hi, BLOCK_SB):
        b = b0 + tl.arange(0, BLOCK_SB)
        b_ok = b < hi
        mask = n_ok[:, None] & b_ok[None, :]
        hb = w16_ptr + row16[:, None] + b[None, :] * 17  # [BN, SB]
        d = f16_bits(tl.load(hb, mask=mask, other=0).to(tl.int32))
        q = _words16(hb[:, :, None] + 1 + 2 * i[None, None, :], mask[:, :, None])  # [BN, SB, 8]
        for m in tl.static_range(MP):
            if m < M:
                xw = tl.load(
                    q8w_ptr + m * (K // 4) + b[:, None] * 8 + i[None, :],
                    mask=b_ok[:, None],
                    other=0,
                )
                sumi = _dot_words(q, xw[None], 2, ASM)  # [BN, SB], exact
                d8 = tl.load(d8_ptr + m * (K // 32) + b, mask=b_ok, other=0.0)
                part = tl.sum(d * (d8[None, :] * sumi.to(tl.float32)), axis=1)
                acc = add_row(acc, part, m, MP)
    store_split(part_ptr, acc, split, n, n_ok, M, N, MP)


@triton.jit
def _k4_half(q, xw, d8p, s8p, b_ok, d, dmin, sc, mn, ASM: tl.constexpr):
    """The terms of sub-blocks ``[BN, SB, 4]`` (weight words q ``[BN, SB, 4, 8]``, activation
    words ``xw`` ``[SB, 4, 8]``, their d8 / s8 at ``d8p`` / ``s8p`` ``[SB, 4]``)."""
    sumi = _dot_words(q, xw[None], 3, ASM).to(tl.float32)  # [BN, SB, 4], exact
    d8 = tl.load(d8p, mask=b_ok[:, None], other=0.0)[None]
    s8 = tl.load(s8p, mask=b_ok[:, None], other=0.0)[None]
    return d[:, :, None] * (d8 * (sc * sumi)) - dmin[:, :, None] * (mn * s8)


@triton.jit
def q4_k_mv_kernel(
    w_ptr,
    w32_ptr,
    row_bytes,
    q8w_ptr,
    d8_ptr,
    s8_ptr,
    part_ptr,
    M,
    N,
    K,
    NSB,
    SB_PER_SPLIT,
    FIFTH: tl.constexpr,
    ASM: tl.constexpr,
    MP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SB: tl.constexpr,
):
    """partial[split, m, n] = sum over this split's 32-sub-blocks of d * (d8 * (sc * sumi)) - dmin *
    (m * s8); Q5_K with ``FIFTH``. Blocks are whole 32-bit words (36 / 44): word 0 holds d and dmin,
    ``qs`` word 8p + i holds bytes 4i.. of sub-block pair p (low nibbles sub-block 2p, high 2p + 1),
    Q5_K's ``qh`` word i (words 4..11) the fifth bits of weights 4i.. (bit j for sub-block j)."""
    NWORDS: tl.constexpr = 44 if FIFTH else 36
    QSW: tl.constexpr = 12 if FIFTH else 4
    split, n, n_ok, lo, hi = split_tile(N, NSB, SB_PER_SPLIT, BLOCK_N)
    row = n.to(tl.int64) * row_bytes
    row32 = n.to(tl.int64) * (row_bytes // 4)
    p4 = tl.arange(0, 4)[None, None, :, None]  # sub-block pair, [1, 1, 4, 1]
    i4 = tl.arange(0, 8)[None, None, None, :]  # word of the pair
    p3 = tl.arange(0, 4)[None, :, None]  # for the activation words [SB, 4, 8]
    i3 = tl.arange(0, 8)[None, None, :]
    pj = tl.arange(0, 4)[None, None, :]  # [1, 1, 4] for the scales [BN, SB, 4]
    acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
    for b0 in range(lo, hi, BLOCK_SB):
        b = b0 + tl.arange(0, BLOCK_SB)
        b_ok = b < hi
        mask = n_ok[:, None] & b_ok[None, :]
        wb32 = w32_ptr + row32[:, None] + b[None, :] * NWORDS  # [BN, SB]
        head = tl.load(wb32, mask=mask, other=0)
        d = f16_bits(head)
        dmin = f16_bits(head >> 16)
        wb = w_ptr + row[:, None, None] + b[None, :, None] * (4 * NWORDS) + 4  # the 12 scale bytes
        sc_lo, mn_lo = scale_min_k4(wb, 2 * pj, mask[:, :, None])  # [BN, SB, 4]
        sc_hi, mn_hi = scale_min_k4(wb, 2 * pj + 1, mask[:, :, None])
        m4 = mask[:, :, None, None]
        qs = tl.load(wb32[:, :, None, None] + QSW + 8 * p4 + i4, mask=m4, other=0)  # [BN, SB, 4, 8]
        q_lo = qs & 0x0F0F0F0F
        q_hi = (qs >> 4) & 0x0F0F0F0F
        if FIFTH:
            qh_ptr = tl.broadcast_to(wb32[:, :, None, None] + 4 + i4, (BLOCK_N, BLOCK_SB, 4, 8))
            qh = tl.load(qh_ptr, mask=m4, other=0)
            q_lo = q_lo | (((qh >> (2 * p4)) & 0x01010101) << 4)
            q_hi = q_hi | (((qh >> (2 * p4 + 1)) & 0x01010101) << 4)
        for m in tl.static_range(MP):
            if m < M:
                # [SB, 4, 8]: sub-block 2p
                xp = q8w_ptr + m * (K // 4) + b[:, None, None] * 64 + 16 * p3 + i3
                x_lo = tl.load(xp, mask=b_ok[:, None, None], other=0)
                x_hi = tl.load(xp + 8, mask=b_ok[:, None, None], other=0)
                # [SB, 4]: Q8_1 block 2p
                jb = m * (K // 32) + b[:, None] * 8 + 2 * tl.arange(0, 4)[None, :]
                t = _k4_half(q_lo, x_lo, d8_ptr + jb, s8_ptr + jb, b_ok, d, dmin, sc_lo, mn_lo, ASM)
                t += _k4_half(
                    q_hi, x_hi, d8_ptr + jb + 1, s8_ptr + jb + 1, b_ok, d, dmin, sc_hi, mn_hi, ASM
                )
                acc = add_row(acc, tl.sum(tl.sum(t, axis=2), axis=1), m, MP)
    store_split(part_ptr, acc, split, n, n_ok, M, N, MP)


@triton.jit
def _q6_quarter(
    ql, qh, sc, xp, d8p, b_ok, d, NIB: tl.constexpr, T: tl.constexpr, ASM: tl.constexpr
):
    """Terms ``[BN, SB, 2, 2]`` (half, sixteen) of quarter ``T``: weight words
    ``((ql >> 4 NIB) & 15 | ((qh >> 2T) & 3) << 4)`` (q + 32), scales ``sc``, activation words at
    ``xp`` ``[SB, 2, 2, 4]``, d8 at ``d8p`` ``[SB, 2, 1]``. sumi = dot(q + 32, x) - 32 sum(x)."""
    q = ((ql >> (4 * NIB)) & 0x0F0F0F0F) | (((qh >> (2 * T)) & 0x03030303) << 4)
    x = tl.load(xp, mask=b_ok[:, None, None, None], other=0)
    ones = tl.full(x.shape, 0x01010101, tl.int32)
    sumx = _dot_words(ones, x, 3, ASM)[None]  # [1, SB, 2, 2]
    sumi = (_dot_words(q, x[None], 4, ASM) - 32 * sumx).to(tl.float32)
    d8 = tl.load(d8p, mask=b_ok[:, None, None], other=0.0)[None]
    return d[:, :, None, None] * (d8 * (sc * sumi))


@triton.jit
def q6_k_mv_kernel(
    w_ptr,
    w16_ptr,
    row_bytes,
    q8w_ptr,
    d8_ptr,
    s8_ptr,
    part_ptr,
    M,
    N,
    K,
    NSB,
    SB_PER_SPLIT,
    ASM: tl.constexpr,
    MP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SB: tl.constexpr,
):
    """partial[split, m, n] = sum over this split's 16-sub-blocks of d * (d8 * (scales * sumi)).
    Weight 128h + 32t + l (half h, quarter t, l < 32) is nibble t // 2 of ``ql`` byte
    64h + 32 (t % 2) + l with bits 2t, 2t + 1 of ``qh`` byte 128 + 32h + l, scale 8h + 2t + l // 16.
    Blocks are 105 halfwords (d: halfword 104): words are read as halfword pairs, tiles
    ``[BN, SB, 2 (h), 2 (l // 16), 4 (word of the sixteen)]``."""
    split, n, n_ok, lo, hi = split_tile(N, NSB, SB_PER_SPLIT, BLOCK_N)
    row = n.to(tl.int64) * row_bytes
    row16 = n.to(tl.int64) * (row_bytes // 2)
    h5 = tl.arange(0, 2)[None, None, :, None, None]
    s5 = tl.arange(0, 2)[None, None, None, :, None]
    i5 = tl.arange(0, 4)[None, None, None, None, :]
    wl5 = 2 * (4 * s5 + i5)  # halfword of the word within a 32-byte run
    h4 = tl.arange(0, 2)[None, :, None, None]  # activation words [SB, 2, 2, 4]
    xw4 = 32 * h4 + 4 * tl.arange(0, 2)[None, None, :, None] + tl.arange(0, 4)[None, None, None, :]
    # [1, 1, 2, 2]
    sj = 192 + 8 * tl.arange(0, 2)[None, None, :, None] + tl.arange(0, 2)[None, None, None, :]
    acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
    for b0 in range(lo, hi, BLOCK_SB):
        b = b0 + tl.arange(0, BLOCK_SB)
        b_ok = b < hi
        mask = n_ok[:, None] & b_ok[None, :]
        hb = w16_ptr + row16[:, None] + b[None, :] * 105  # [BN, SB]
        d = f16_bits(tl.load(hb + 104, mask=mask, other=0).to(tl.int32))
        m5 = mask[:, :, None, None, None]
        h5p = hb[:, :, None, None, None]
        ql0 = _words16(h5p + 32 * h5 + wl5, m5)  # quarters 0, 2
        ql1 = _words16(h5p + 32 * h5 + 16 + wl5, m5)  # quarters 1, 3
        qh = _words16(h5p + 64 + 16 * h5 + wl5, m5)
        bp = w_ptr + row[:, None, None, None] + b[None, :, None, None] * 210 + sj  # [BN, SB, 2, 2]
        m4 = mask[:, :, None, None]
        sc0 = tl.load(bp, mask=m4, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        sc1 = tl.load(bp + 2, mask=m4, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        sc2 = tl.load(bp + 4, mask=m4, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        sc3 = tl.load(bp + 6, mask=m4, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        for m in tl.static_range(MP):
            if m < M:
                # [SB, 2, 2, 4], quarter 0
                xp = q8w_ptr + m * (K // 4) + b[:, None, None, None] * 64 + xw4
                d8p = (
                    d8_ptr
                    + m * (K // 32)
                    + b[:, None, None] * 8
                    + 4 * tl.arange(0, 2)[None, :, None]
                )
                t = _q6_quarter(ql0, qh, sc0, xp, d8p, b_ok, d, 0, 0, ASM)
                t += _q6_quarter(ql1, qh, sc1, xp + 8, d8p + 1, b_ok, d, 0, 1, ASM)
                t += _q6_quarter(ql0, qh, sc2, xp + 16, d8p + 2, b_ok, d, 1, 2, ASM)
                t += _q6_quarter(ql1, qh, sc3, xp + 24, d8p + 3, b_ok, d, 1, 3, ASM)
                acc = add_row(acc, tl.sum(tl.sum(tl.sum(t, axis=3), axis=2), axis=1), m, MP)
    store_split(part_ptr, acc, split, n, n_ok, M, N, MP)


def _kernel(qtype: str):
    """(kernel, its extra constexprs, the dtype of the wide view of the blocks it reads)."""
    if qtype == "Q8_0":
        return q8_0_mv_kernel, {}, torch.int16
    if qtype == "Q6_K":
        return q6_k_mv_kernel, {}, torch.int16
    return q4_k_mv_kernel, {"FIFTH": qtype == "Q5_K"}, torch.int32


def tiles_matvec(x8: Q8_1, w: QuantWeight, out_dtype: torch.dtype, asm: bool) -> torch.Tensor:
    """int8-dot ``[M <= 8, K] x [N, K] -> [M, N]`` (``x8`` Q8_1 rows of ``w``'s K; out in
    ``out_dtype``) by the kernels of this module, split-K when N alone would leave SMs idle;
    ``asm``: PTX dp4a (where the launch table enables it)."""
    m, k = x8.q.shape
    n = w.shape[0]
    nsb = k // QTYPES[w.qtype].block
    cfg = MV_CONFIGS[w.qtype]
    programs_n = triton.cdiv(n, cfg["BLOCK_N"])
    splits, sb_per_split = split_k(nsb, cfg["BLOCK_SB"], programs_n, w.device)
    parts = torch.empty((splits, m, n), dtype=torch.float32, device=w.device)
    kernel, extra, wide = _kernel(w.qtype)
    # the kernels read 16- / 32-bit words of the blocks: an unaligned view is copied
    data = w.data if w.data.data_ptr() % 4 == 0 else w.data.clone()
    kernel[(programs_n, splits)](
        data,
        data.view(wide),
        data.shape[-1],
        x8.q.view(torch.int32),
        x8.d,
        x8.s,
        parts,
        m,
        n,
        k,
        nsb,
        sb_per_split,
        **extra,
        ASM=asm,
        MP=triton.next_power_of_2(m),
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_SB=cfg["BLOCK_SB"],
        num_warps=cfg["num_warps"],
    )
    return sum_splits(parts, out_dtype)


def tiles_specs(asm: bool) -> list:
    """The tile kernels' configurations for ftlab.compile_check, with PTX dp4a (``asm``) or
    not."""
    from ftlab.triton.compile_spec import spec

    specs = []
    for qtype, cfg in MV_CONFIGS.items():
        kernel, extra, wide = _kernel(qtype)
        view = "w32_ptr" if wide == torch.int32 else "w16_ptr"
        types = {
            "w_ptr": "*u8",
            view: "*i32" if wide == torch.int32 else "*i16",
            "q8w_ptr": "*i32",
            "d8_ptr": "*fp32",
            "s8_ptr": "*fp32",
            "part_ptr": "*fp32",
        }
        for mp in (1, 8):
            label = (
                f"{kernel.__name__}[{qtype}, M<={mp}, {cfg['BLOCK_N']}x{cfg['BLOCK_SB']} blocks]"
            )
            specs.append(
                spec(
                    kernel,
                    label,
                    types=types,
                    constexprs={
                        **extra,
                        "ASM": asm,
                        "MP": mp,
                        "BLOCK_N": cfg["BLOCK_N"],
                        "BLOCK_SB": cfg["BLOCK_SB"],
                    },
                    num_warps=cfg["num_warps"],
                )
            )
    return specs

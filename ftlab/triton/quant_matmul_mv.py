"""The int8-dot matvecs of Q8_0 and the K-quants in Triton (decode: up to ``MATVEC_ROWS`` rows
of Q8_1 activations; docs/OPS.md section 11; reference: ``ftlab/reference/quant_matmul.py``),
used by ``quant_matmul``'s int8 path (``ftlab/triton/quant_matmul.py``).

One program takes ``BLOCK_N`` weight rows and walks its share of K (split-K over a second grid
axis when the rows alone would leave SMs idle) ``BLOCK_SB`` blocks at a time, reading each
weight byte once for all the M rows of activations: the blocks' integers are unpacked in
registers, each sub-block's exact integer dot with its Q8_1 block is a sum of int32 products,
and the terms are scaled in fp32 as the reference scales them:

- ``q8_0_mv_kernel``: ``[BLOCK_N, BLOCK_SB, 32]`` int8 weights; ``d * (d8 * sumi)``.
- ``q4_k_mv_kernel`` (Q4_K; Q5_K with ``FIFTH``): ``[BLOCK_N, BLOCK_SB, 4, 32]`` ``qs`` bytes
  (sub-block pair p by byte i: low nibbles sub-block 2p, high 2p + 1);
  ``d * (d8 * (sc * sumi)) - dmin * (m * s8)``.
- ``q6_k_mv_kernel``: ``[BLOCK_N, BLOCK_SB, 4, 16]`` (g = 2 * half + sixteen, by weight) of the
  three bytes feeding four weights, one per quarter; ``d * (d8 * (scales * sumi))`` per
  16-sub-block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.quant import Q8_1, QTYPES, QuantWeight
from ftlab.triton.q4_0_common import load_q4_0_scale, sm_count
from ftlab.triton.quants import scale_min_k4

#: rows one matvec pass takes (MP up to 8); more rows run pass by pass
MATVEC_ROWS = 8
#: per type: rows and blocks of a program's tile, warps. Untimed starting points: ~1024 weights
#: a tile, 8 a thread at 4 warps.
MV_CONFIGS: dict[str, dict[str, int]] = {
    "Q8_0": {"BLOCK_N": 8, "BLOCK_SB": 4, "num_warps": 4},
    "Q4_K": {"BLOCK_N": 4, "BLOCK_SB": 1, "num_warps": 4},
    "Q5_K": {"BLOCK_N": 4, "BLOCK_SB": 1, "num_warps": 4},
    "Q6_K": {"BLOCK_N": 4, "BLOCK_SB": 1, "num_warps": 4},
}


@triton.jit
def _accumulate(acc, part, m, MP: tl.constexpr):
    return acc + tl.where(tl.arange(0, MP)[:, None] == m, part[None, :], 0.0)


@triton.jit
def _store_parts(part_ptr, acc, split, n, n_ok, M, N, MP: tl.constexpr):
    mrange = tl.arange(0, MP)
    out = part_ptr + split.to(tl.int64) * M * N + mrange[:, None] * N + n[None, :]
    tl.store(out, acc, mask=(mrange[:, None] < M) & n_ok[None, :])


@triton.jit
def q8_0_mv_kernel(
    w_ptr, row_bytes, q8_ptr, d8_ptr, s8_ptr, part_ptr, M, N, K, NSB, SB_PER_SPLIT,
    MP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SB: tl.constexpr,
):  # fmt: skip
    """partial[split, m, n] = sum over this split's 32-blocks of d * (d8 * sumi)."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    i = tl.arange(0, 32)
    row = n.to(tl.int64) * row_bytes
    acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
    lo = split * SB_PER_SPLIT
    hi = tl.minimum(lo + SB_PER_SPLIT, NSB)
    for b0 in range(lo, hi, BLOCK_SB):
        b = b0 + tl.arange(0, BLOCK_SB)
        b_ok = b < hi
        mask = n_ok[:, None] & b_ok[None, :]
        wb = w_ptr + row[:, None] + b[None, :] * 34  # [BN, SB]
        d = load_q4_0_scale(wb, mask)
        q = tl.load(wb[:, :, None] + 2 + i[None, None, :], mask=mask[:, :, None], other=0)
        q = q.to(tl.int8, bitcast=True).to(tl.int32)  # [BN, SB, 32]
        for m in tl.static_range(MP):
            if m < M:
                xq = tl.load(
                    q8_ptr + m * K + b[:, None] * 32 + i[None, :], mask=b_ok[:, None], other=0
                )
                sumi = tl.sum(q * xq.to(tl.int32)[None], axis=2)  # [BN, SB], exact
                d8 = tl.load(d8_ptr + m * (K // 32) + b, mask=b_ok, other=0.0)
                part = tl.sum(d * (d8[None, :] * sumi.to(tl.float32)), axis=1)
                acc = _accumulate(acc, part, m, MP)
    _store_parts(part_ptr, acc, split, n, n_ok, M, N, MP)


@triton.jit
def _k4_half(q, xb, d8p, s8p, b_ok, d, dmin, sc, mn):
    """The terms of sub-blocks ``[BN, SB, 4]`` (ints q ``[BN, SB, 4, 32]``, activations at ``xb``
    ``[SB, 4, 32]``, their d8 / s8 at ``d8p`` / ``s8p`` ``[SB, 4]``)."""
    x = tl.load(xb, mask=b_ok[:, None, None], other=0).to(tl.int32)
    sumi = tl.sum(q * x[None], axis=3).to(tl.float32)  # [BN, SB, 4], exact
    d8 = tl.load(d8p, mask=b_ok[:, None], other=0.0)[None]
    s8 = tl.load(s8p, mask=b_ok[:, None], other=0.0)[None]
    return d[:, :, None] * (d8 * (sc * sumi)) - dmin[:, :, None] * (mn * s8)


@triton.jit
def q4_k_mv_kernel(
    w_ptr, row_bytes, q8_ptr, d8_ptr, s8_ptr, part_ptr, M, N, K, NSB, SB_PER_SPLIT,
    FIFTH: tl.constexpr, MP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SB: tl.constexpr,
):  # fmt: skip
    """partial[split, m, n] = sum over this split's 32-sub-blocks of
    d * (d8 * (sc * sumi)) - dmin * (m * s8); Q5_K with ``FIFTH``."""
    NBYTES: tl.constexpr = 176 if FIFTH else 144
    QS: tl.constexpr = 48 if FIFTH else 16
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    row = n.to(tl.int64) * row_bytes
    p4 = tl.arange(0, 4)[None, None, :, None]  # sub-block pair, [1, 1, 4, 1]
    i4 = tl.arange(0, 32)[None, None, None, :]
    p3 = tl.arange(0, 4)[None, :, None]  # [1, 4, 1] for the activations [SB, 4, 32]
    i3 = tl.arange(0, 32)[None, None, :]
    pj = tl.arange(0, 4)[None, None, :]  # [1, 1, 4] for the scales [BN, SB, 4]
    acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
    lo = split * SB_PER_SPLIT
    hi = tl.minimum(lo + SB_PER_SPLIT, NSB)
    for b0 in range(lo, hi, BLOCK_SB):
        b = b0 + tl.arange(0, BLOCK_SB)
        b_ok = b < hi
        mask = n_ok[:, None] & b_ok[None, :]
        wb = w_ptr + row[:, None] + b[None, :] * NBYTES  # [BN, SB]
        d = load_q4_0_scale(wb, mask)
        dmin = load_q4_0_scale(wb + 2, mask)
        sc_lo, mn_lo = scale_min_k4(wb[:, :, None] + 4, 2 * pj, mask[:, :, None])  # [BN, SB, 4]
        sc_hi, mn_hi = scale_min_k4(wb[:, :, None] + 4, 2 * pj + 1, mask[:, :, None])
        m4 = mask[:, :, None, None]
        qs = tl.load(wb[:, :, None, None] + QS + 32 * p4 + i4, mask=m4, other=0).to(tl.int32)
        q_lo = qs & 0x0F
        q_hi = qs >> 4
        if FIFTH:
            qh_ptr = tl.broadcast_to(wb[:, :, None, None] + 16 + i4, (BLOCK_N, BLOCK_SB, 4, 32))
            qh = tl.load(qh_ptr, mask=m4, other=0).to(tl.int32)
            q_lo = q_lo | (((qh >> (2 * p4)) & 1) << 4)
            q_hi = q_hi | (((qh >> (2 * p4 + 1)) & 1) << 4)
        for m in tl.static_range(MP):
            if m < M:
                xb = q8_ptr + m * K + b[:, None, None] * 256 + 64 * p3 + i3  # [SB, 4, 32]
                jb = (
                    m * (K // 32) + b[:, None] * 8 + 2 * tl.arange(0, 4)[None, :]
                )  # [SB, 4]: Q8_1 block 2p
                t = _k4_half(q_lo, xb, d8_ptr + jb, s8_ptr + jb, b_ok, d, dmin, sc_lo, mn_lo)
                t += _k4_half(
                    q_hi, xb + 32, d8_ptr + jb + 1, s8_ptr + jb + 1, b_ok, d, dmin, sc_hi, mn_hi
                )
                acc = _accumulate(acc, tl.sum(tl.sum(t, axis=2), axis=1), m, MP)
    _store_parts(part_ptr, acc, split, n, n_ok, M, N, MP)


@triton.jit
def _q6_quarter(
    ql, qh, wb, sj, mask, xb, d8p, b_ok, d, SHIFT: tl.constexpr, QH_SHIFT: tl.constexpr
):
    """Quarter terms ``[BN, SB, 4]``: ints ``((ql >> SHIFT) & 15 | ((qh >> QH_SHIFT) & 3) << 4) - 32``,
    scales at byte offsets ``sj`` ``[1, 1, 4]``, activations at ``xb`` ``[SB, 4, 16]``."""
    q = (((ql >> SHIFT) & 0x0F) | (((qh >> QH_SHIFT) & 3) << 4)) - 32
    sc = (
        tl.load(wb[:, :, None] + sj, mask=mask[:, :, None], other=0)
        .to(tl.int8, bitcast=True)
        .to(tl.float32)
    )
    x = tl.load(xb, mask=b_ok[:, None, None], other=0).to(tl.int32)
    sumi = tl.sum(q * x[None], axis=3).to(tl.float32)
    d8 = tl.load(d8p, mask=b_ok[:, None], other=0.0)[None]
    return d[:, :, None] * (d8 * (sc * sumi))


@triton.jit
def q6_k_mv_kernel(
    w_ptr, row_bytes, q8_ptr, d8_ptr, s8_ptr, part_ptr, M, N, K, NSB, SB_PER_SPLIT,
    MP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SB: tl.constexpr,
):  # fmt: skip
    """partial[split, m, n] = sum over this split's 16-sub-blocks of d * (d8 * (scales * sumi)).
    Weight 128h + 32t + l (half h, quarter t, l < 32) is nibble t // 2 of ``ql`` byte
    64h + 32 (t % 2) + l with bits 2t, 2t + 1 of ``qh`` byte 32h + l, scale 8h + 2t + l // 16."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    row = n.to(tl.int64) * row_bytes
    g4 = tl.arange(0, 4)[None, None, :, None]  # half g // 2, sixteen g % 2
    l4 = 16 * (g4 % 2) + tl.arange(0, 16)[None, None, None, :]
    h4 = g4 // 2
    g3 = tl.arange(0, 4)[None, :, None]  # for the activations [SB, 4, 16]
    l3 = 16 * (g3 % 2) + tl.arange(0, 16)[None, None, :]
    gj = tl.arange(0, 4)[None, None, :]  # for the scales [BN, SB, 4]
    sj = 192 + 8 * (gj // 2) + gj % 2
    g2 = tl.arange(0, 4)[None, :]  # Q8_1 block of quarter 0: 4 * half
    acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
    lo = split * SB_PER_SPLIT
    hi = tl.minimum(lo + SB_PER_SPLIT, NSB)
    for b0 in range(lo, hi, BLOCK_SB):
        b = b0 + tl.arange(0, BLOCK_SB)
        b_ok = b < hi
        mask = n_ok[:, None] & b_ok[None, :]
        wb = w_ptr + row[:, None] + b[None, :] * 210  # [BN, SB]
        d = load_q4_0_scale(wb + 208, mask)
        m4 = mask[:, :, None, None]
        w4 = wb[:, :, None, None]
        ql0 = tl.load(w4 + 64 * h4 + l4, mask=m4, other=0).to(tl.int32)  # quarters 0 and 2
        ql1 = tl.load(w4 + 64 * h4 + 32 + l4, mask=m4, other=0).to(tl.int32)  # quarters 1 and 3
        qh = tl.load(w4 + 128 + 32 * h4 + l4, mask=m4, other=0).to(tl.int32)
        for m in tl.static_range(MP):
            if m < M:
                xb = q8_ptr + m * K + b[:, None, None] * 256 + 128 * (g3 // 2) + l3  # [SB, 4, 16]
                jb = d8_ptr + m * (K // 32) + b[:, None] * 8 + 4 * (g2 // 2)  # [SB, 4]
                t = _q6_quarter(ql0, qh, wb, sj, mask, xb, jb, b_ok, d, 0, 0)
                t += _q6_quarter(ql1, qh, wb, sj + 2, mask, xb + 32, jb + 1, b_ok, d, 0, 2)
                t += _q6_quarter(ql0, qh, wb, sj + 4, mask, xb + 64, jb + 2, b_ok, d, 4, 4)
                t += _q6_quarter(ql1, qh, wb, sj + 6, mask, xb + 96, jb + 3, b_ok, d, 4, 6)
                acc = _accumulate(acc, tl.sum(tl.sum(t, axis=2), axis=1), m, MP)
    _store_parts(part_ptr, acc, split, n, n_ok, M, N, MP)


def _kernel(qtype: str):
    if qtype == "Q8_0":
        return q8_0_mv_kernel, {}
    if qtype == "Q6_K":
        return q6_k_mv_kernel, {}
    return q4_k_mv_kernel, {"FIFTH": qtype == "Q5_K"}


def quant_matvec(x8: Q8_1, w: QuantWeight, out_dtype: torch.dtype) -> torch.Tensor:
    """int8-dot ``[M <= 8, K] x [N, K] -> [M, N]``; split-K when N alone would leave SMs idle."""
    m, k = x8.q.shape
    n = w.shape[0]
    nsb = k // QTYPES[w.qtype].block
    cfg = MV_CONFIGS[w.qtype]
    programs_n = triton.cdiv(n, cfg["BLOCK_N"])
    splits = max(
        1, min(triton.cdiv(2 * sm_count(w.device), programs_n), triton.cdiv(nsb, cfg["BLOCK_SB"]))
    )
    sb_per_split = triton.cdiv(triton.cdiv(nsb, splits), cfg["BLOCK_SB"]) * cfg["BLOCK_SB"]
    splits = triton.cdiv(nsb, sb_per_split)
    parts = torch.empty((splits, m, n), dtype=torch.float32, device=w.device)
    kernel, extra = _kernel(w.qtype)
    kernel[(programs_n, splits)](
        w.data, w.data.shape[-1], x8.q, x8.d, x8.s, parts, m, n, k, nsb, sb_per_split,
        **extra, MP=triton.next_power_of_2(m), BLOCK_N=cfg["BLOCK_N"], BLOCK_SB=cfg["BLOCK_SB"],
        num_warps=cfg["num_warps"],
    )  # fmt: skip
    y = parts[0] if splits == 1 else parts.sum(0)
    return y.to(out_dtype)


def matvec_specs(target: str) -> list:
    """The matvec configurations ftlab launches, for ftlab.compile_check (the same on every target)."""
    from ftlab.triton.compile_spec import spec

    types = {
        "w_ptr": "*u8",
        "q8_ptr": "*i8",
        "d8_ptr": "*fp32",
        "s8_ptr": "*fp32",
        "part_ptr": "*fp32",
    }
    specs = []
    for qtype, cfg in MV_CONFIGS.items():
        kernel, extra = _kernel(qtype)
        for mp in (1, 8):
            label = (
                f"{kernel.__name__}[{qtype}, M<={mp}, {cfg['BLOCK_N']}x{cfg['BLOCK_SB']} blocks]"
            )
            specs.append(spec(kernel, label, types=types,
                              constexprs={**extra, "MP": mp, "BLOCK_N": cfg["BLOCK_N"], "BLOCK_SB": cfg["BLOCK_SB"]},
                              num_warps=cfg["num_warps"]))  # fmt: skip
    return specs

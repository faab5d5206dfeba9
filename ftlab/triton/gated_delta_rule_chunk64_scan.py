"""The scan and the output of the chunk-64 gated delta rule prefill
(:mod:`ftlab.triton.gated_delta_rule_chunk64`), from the WY form of
:mod:`ftlab.triton.gated_delta_rule_chunk64_wy` (``W``, ``U``, the cumulative log decays ``c``
and the keys' norm factors):

- ``scan_kernel`` (chunk after chunk, per sequence, value head and BV state columns): the state
  slice ``[Dk, BV]`` stays in registers, in up to four blocks of key rows; a chunk's deltas
  ``X = U - W S`` (written over U) and ``S' = exp(c_last) S + (K exp(c_last - c))^T X``; every
  chunk's starting state is kept in ``h`` (``[NT, Dk, Dv]`` a head) for the output;
- ``out_kernel`` (chunks in parallel, BV output columns a program): ``O = diag(exp(c)) Q S +
  (Q K^T * D) X`` with ``D[i, j] = exp(c_i - c_j)`` (j <= i).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ftlab.triton.gated_delta_rule_chunk64_tiles import (
    chunk_coords,
    input_gram,
    input_rows,
    mmp,
    narrow,
)


@triton.jit
def _scratch(ptr, row, c0, D: tl.constexpr, BD: tl.constexpr):
    """fp32 ``[len(row), BD]``: columns c0 .. c0 + BD of the given rows of an fp32 (bf16) ``[*,
    D]`` scratch, zeros past D."""
    d = c0 + tl.arange(0, BD)
    return tl.load(ptr + row[:, None] * D + d[None, :], mask=(d < D)[None, :], other=0.0).to(
        tl.float32
    )


@triton.jit
def _slab(q0, dv, DK: tl.constexpr, DV: tl.constexpr, BQ: tl.constexpr):
    """Offsets and mask of state rows q0 .. q0 + BQ, columns dv, in a ``[Dk, Dv]`` state."""
    d = q0 + tl.arange(0, BQ)
    return d[:, None] * DV + dv[None, :], (d < DK)[:, None] & (dv < DV)[None, :]


@triton.jit
def _delta_part(
    x,
    w_ptr,
    row,
    s,
    q: tl.constexpr,
    DK: tl.constexpr,
    BQ: tl.constexpr,
    PRECISION: tl.constexpr,
    BF16: tl.constexpr,
    NATIVE: tl.constexpr,
):
    """``x - W[:, q BQ ..] s`` for the state block ``s`` of key rows q BQ .. (q + 1) BQ."""
    return x - mmp(_scratch(w_ptr, row, q * BQ, DK, BQ), s, PRECISION, BF16, NATIVE)


@triton.jit
def _update(
    s,
    e,
    k_ptr,
    b,
    t0,
    T,
    kh,
    xf,
    q: tl.constexpr,
    HK: tl.constexpr,
    DK: tl.constexpr,
    BQ: tl.constexpr,
    PRECISION: tl.constexpr,
    BF16: tl.constexpr,
    NATIVE: tl.constexpr,
):
    """``e s + K[:, q BQ ..]^T xf`` for the state block ``s``."""
    kq = input_rows(k_ptr, b, t0, T, kh, HK, DK, 64, BQ, q * BQ).to(tl.float32)
    return s * e + mmp(tl.trans(kq), xf, PRECISION, BF16, NATIVE)


@triton.jit
def scan_kernel(
    k_ptr,
    c_ptr,
    rk_ptr,
    w_ptr,
    u_ptr,
    h_ptr,
    st_ptr,
    T,
    NT,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BQ: tl.constexpr,
    NQ: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
    STAGES: tl.constexpr,
    BF16: tl.constexpr,
    NATIVE: tl.constexpr,
):
    """The state slice ``[Dk, BV]`` in registers as NQ (1, 2 or 4) blocks of BQ key rows, so that
    every dot's operands stay narrow (tf32x3 splits each operand in registers): from ``st``
    (fp32 ``[Dk, Dv]`` a head), each chunk's start written to ``h`` (``[NT, Dk, Dv]``, bf16 when
    BF16), the last back to ``st``."""
    bh = tl.program_id(1)
    b = bh // HV
    h = bh % HV
    kh = h // (HV // HK)
    rows = tl.arange(0, 64)
    dv = tl.program_id(0) * BV + tl.arange(0, BV)
    mv = dv < DV
    hb = h_ptr + bh.to(tl.int64) * NT * DK * DV
    sb = st_ptr + bh.to(tl.int64) * DK * DV
    o0, m0 = _slab(0, dv, DK, DV, BQ)
    s0 = tl.load(sb + o0, mask=m0, other=0.0)
    if NQ > 1:
        o1, m1 = _slab(BQ, dv, DK, DV, BQ)
        s1 = tl.load(sb + o1, mask=m1, other=0.0)
    if NQ > 2:
        o2, m2 = _slab(2 * BQ, dv, DK, DV, BQ)
        o3, m3 = _slab(3 * BQ, dv, DK, DV, BQ)
        s2 = tl.load(sb + o2, mask=m2, other=0.0)
        s3 = tl.load(sb + o3, mask=m3, other=0.0)
    for n in tl.range(0, NT, num_stages=STAGES):
        t0 = n * 64
        row = bh.to(tl.int64) * NT * 64 + t0 + rows
        hn = hb + n * DK * DV
        x = _scratch(u_ptr, row, tl.program_id(0) * BV, DV, BV)
        tl.store(hn + o0, narrow(s0, BF16, NATIVE), mask=m0)
        x = _delta_part(x, w_ptr, row, s0, 0, DK, BQ, PRECISION, BF16, NATIVE)
        if NQ > 1:
            tl.store(hn + o1, narrow(s1, BF16, NATIVE), mask=m1)
            x = _delta_part(x, w_ptr, row, s1, 1, DK, BQ, PRECISION, BF16, NATIVE)
        if NQ > 2:
            tl.store(hn + o2, narrow(s2, BF16, NATIVE), mask=m2)
            tl.store(hn + o3, narrow(s3, BF16, NATIVE), mask=m3)
            x = _delta_part(x, w_ptr, row, s2, 2, DK, BQ, PRECISION, BF16, NATIVE)
            x = _delta_part(x, w_ptr, row, s3, 3, DK, BQ, PRECISION, BF16, NATIVE)
        tl.store(u_ptr + row[:, None] * DV + dv[None, :], narrow(x, BF16, NATIVE), mask=mv[None, :])
        c = tl.load(c_ptr + row)
        c_last = tl.sum(tl.where(rows == 63, c, 0.0), axis=0)
        e = tl.exp(c_last)
        xf = x * (tl.exp(c_last - c) * tl.load(rk_ptr + row))[:, None]
        s0 = _update(s0, e, k_ptr, b, t0, T, kh, xf, 0, HK, DK, BQ, PRECISION, BF16, NATIVE)
        if NQ > 1:
            s1 = _update(s1, e, k_ptr, b, t0, T, kh, xf, 1, HK, DK, BQ, PRECISION, BF16, NATIVE)
        if NQ > 2:
            s2 = _update(s2, e, k_ptr, b, t0, T, kh, xf, 2, HK, DK, BQ, PRECISION, BF16, NATIVE)
            s3 = _update(s3, e, k_ptr, b, t0, T, kh, xf, 3, HK, DK, BQ, PRECISION, BF16, NATIVE)
    # again from the argument: nothing more live through the loop
    sb = st_ptr + (bh * DK).to(tl.int64) * DV
    tl.store(sb + o0, s0, mask=m0)
    if NQ > 1:
        tl.store(sb + o1, s1, mask=m1)
    if NQ > 2:
        tl.store(sb + o2, s2, mask=m2)
        tl.store(sb + o3, s3, mask=m3)


@triton.jit
def out_kernel(
    q_ptr,
    k_ptr,
    c_ptr,
    rk_ptr,
    u_ptr,
    h_ptr,
    o_ptr,
    scale,
    T,
    NT,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BS: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
    PRECISION: tl.constexpr,
    NATIVE: tl.constexpr,
    BF16: tl.constexpr,
):
    n = tl.program_id(1)
    bh = tl.program_id(2)
    b, h, kh, t0, row0 = chunk_coords(n, bh, NT, HK, HV)
    rows = tl.arange(0, 64)
    dv = tl.program_id(0) * BV + tl.arange(0, BV)
    mv = dv < DV
    hn = h_ptr + (bh.to(tl.int64) * NT + n) * DK * DV
    qk = tl.zeros((64, 64), dtype=tl.float32)
    qs = tl.zeros((64, BV), dtype=tl.float32)
    ss = tl.zeros((64,), dtype=tl.float32)
    for s0 in range(0, DK, BS):
        q = input_rows(q_ptr, b, t0, T, kh, HK, DK, 64, BS, s0)
        qk += input_gram(q, input_rows(k_ptr, b, t0, T, kh, HK, DK, 64, BS, s0), PRECISION, NATIVE)
        qf = q.to(tl.float32)
        ss += tl.sum(qf * qf, axis=1)
        offs, m = _slab(s0, dv, DK, DV, BS)
        qs += mmp(qf, tl.load(hn + offs, mask=m, other=0.0).to(tl.float32), PRECISION, BF16, NATIVE)
    if L2NORM:
        rq = scale / tl.sqrt(ss + 1e-6)
    else:
        rq = tl.sum(qk * 0.0, axis=1) + scale
    c = tl.load(c_ptr + row0 + rows)
    rk = tl.load(rk_ptr + row0 + rows)
    upto = rows[:, None] >= rows[None, :]
    gap = tl.exp(tl.where(upto, c[:, None] - c[None, :], 0.0))
    attn = tl.where(upto, qk * rq[:, None] * rk[None, :] * gap, 0.0)
    x = tl.load(u_ptr + (row0 + rows)[:, None] * DV + dv[None, :], mask=mv[None, :], other=0.0).to(
        tl.float32
    )
    o = qs * (rq * tl.exp(c))[:, None] + mmp(attn, x, PRECISION, BF16, NATIVE)
    offs = ((b * T + t0 + rows).to(tl.int64)[:, None] * HV + h) * DV + dv[None, :]
    tl.store(
        o_ptr + offs, o.to(o_ptr.dtype.element_ty), mask=(t0 + rows < T)[:, None] & mv[None, :]
    )

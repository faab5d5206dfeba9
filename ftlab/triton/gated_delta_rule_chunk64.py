"""The chunked prefill of the gated delta rule in Triton for chunks of 64 tokens, the models'
chunk size (reference: ftlab/reference/gated_delta_rule.py; other chunk sizes:
:mod:`ftlab.triton.gated_delta_rule_chunk`). With a chunk's keys ``K`` (L2-normalised when asked),
cumulative log decays ``c`` from its start and ``L = beta_i (k_i . k_j) exp(c_i - c_j)``
(j < i), four kernels:

- ``inverse_kernel`` (chunks in parallel): ``L`` from one ``[64, 64]`` key product, then the
  inverse ``A = (I + L)^-1`` block by block over blocks of 16 rows (each diagonal block by
  forward substitution over its rows, the blocks below it from the solved ones); writes ``A``
  (fp32 ``[64, 64]`` a chunk), ``c`` and the keys' norm factors;
- ``wy_kernel`` (chunks in parallel): ``W = A (beta exp(c) K)`` and ``U = A (beta V)``, head
  dimensions BS columns at a time, fp32;
- ``scan_kernel`` (chunk after chunk, per sequence, value head and BV state columns): the state
  slice ``[Dk, BV]`` stays in registers, in up to four blocks of key rows; a chunk's deltas
  ``X = U - W S`` (written over U) and ``S' = exp(c_last) S + (K exp(c_last - c))^T X``; every
  chunk's starting state is kept in ``h`` (``[NT, Dk, Dv]`` a head) for the output;
- ``out_kernel`` (chunks in parallel, BV output columns a program): ``O = diag(exp(c)) Q S +
  (Q K^T * D) X`` with ``D[i, j] = exp(c_i - c_j)`` (j <= i).

The products of two input rows (``K K^T``, ``Q K^T``) take the inputs' own dtype into the dot
(bf16 / fp16 products are exact in the fp32 accumulator); every dot with an fp32 operand is
IEEE, or tf32x3 on NVIDIA (three tf32 products, fp32 accuracy), so the bound of
:func:`ftlab.testing.gated_delta_tolerance` (fp32 dots) holds for these kernels as for the
reference. With ``precision="bf16"`` (bf16 inputs) the WY, scan and output kernels' fp32
operands are each rounded to bf16 once and every such dot is one bf16 product with fp32 sums, as
fla's kernels compute (the inverse and the state in registers stay fp32; W, U / X and h are kept
in bf16), within ``gated_delta_tolerance(..., operands="bf16")``. Hostile decays as in
:mod:`ftlab.triton.gated_delta_rule_chunk`: :func:`floor_decay` at load, ``L`` and ``fk``
:func:`finite`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.backends import tuning
from ftlab.platform import current, platform_from_arch
from ftlab.triton.gated_delta_rule_chunk import finite, floor_decay, narrow
from ftlab.triton.gated_delta_rule_chunk import mmp as _mmp
from ftlab.triton.gated_delta_rule_chunk import precision as dot_precision
from ftlab.triton.q4_0_common import interpreted

C = 64


@triton.jit
def _rows(
    ptr, b, t0, T, head, H: tl.constexpr, D: tl.constexpr, R: tl.constexpr, BD: tl.constexpr, col0
):
    """``[R, BD]`` in the tensor's dtype: rows t0 .. t0 + R, columns col0 .. col0 + BD of head
    ``head`` of a ``[B, T, H, D]`` tensor, zeros past T and D."""
    t = t0 + tl.arange(0, R)
    d = col0 + tl.arange(0, BD)
    offs = ((b * T + t).to(tl.int64)[:, None] * H + head) * D + d[None, :]
    return tl.load(ptr + offs, mask=(t < T)[:, None] & (d < D)[None, :], other=0.0)


@triton.jit
def _chunk(n, bh, NT, HK: tl.constexpr, HV: tl.constexpr):
    """Of chunk ``n`` of row ``bh`` (sequence x value head): the sequence, the value head, its key
    head, the chunk's first token and its first row in the ``[B Hv, NT 64, *]`` scratch."""
    b = bh // HV
    h = bh % HV
    return b, h, h // (HV // HK), n * 64, bh.to(tl.int64) * NT * 64 + n * 64


@triton.jit
def _gram(a, b, PRECISION: tl.constexpr, NATIVE: tl.constexpr):
    """``a b^T`` of two tiles of input rows, fp32: the inputs' own dot for 16-bit inputs when
    NATIVE (exact products), else (fp32 inputs; the interpreter, whose bf16 dot is not one) the
    rows in fp32 at PRECISION, which gives the same products."""
    if a.dtype == tl.float32 or not NATIVE:
        return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision=PRECISION)
    else:
        return tl.dot(a, tl.trans(b))


@triton.jit
def _per_row(ptr, b, t0, T, h, HV: tl.constexpr, R: tl.constexpr):
    """``[R]`` fp32: the per-token, per-value-head scalars (g or beta) of rows t0 .. t0 + R."""
    t = t0 + tl.arange(0, R)
    return tl.load(ptr + (b * T + t).to(tl.int64) * HV + h, mask=t < T, other=0.0).to(tl.float32)


@triton.jit
def _load_block(a_ptr, base, i: tl.constexpr, j: tl.constexpr):
    """Block (i, j) of 16 x 16 of a chunk's ``[64, 64]`` fp32 matrix at ``base``."""
    rows = tl.arange(0, 16)
    return tl.load(a_ptr + base + (i * 16 + rows)[:, None] * 64 + j * 16 + rows[None, :])


@triton.jit
def _store_block(a_ptr, base, i: tl.constexpr, j: tl.constexpr, x):
    """Block (i, j) of 16 x 16 of a chunk's ``[64, 64]`` fp32 matrix at ``base``."""
    rows = tl.arange(0, 16)
    tl.store(a_ptr + base + (i * 16 + rows)[:, None] * 64 + j * 16 + rows[None, :], x)


@triton.jit
def _unit_lower_inverse(lii):
    """``(I + L_ii)^-1`` of a strictly lower 16 x 16 block, row by row (forward substitution)."""
    rows = tl.arange(0, 16)
    inv = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    for r in range(1, 16):
        a = tl.sum(tl.where(rows[:, None] == r, lii, 0.0), axis=0)
        inv = tl.where(rows[:, None] == r, inv - tl.sum(a[:, None] * inv, axis=0)[None, :], inv)
    return inv


@triton.jit
def _mm(a, b, PRECISION: tl.constexpr):
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def inverse_kernel(
    k_ptr,
    g_ptr,
    beta_ptr,
    a_ptr,
    c_ptr,
    rk_ptr,
    T,
    NT,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    BS: tl.constexpr,
    L2NORM: tl.constexpr,
    PRECISION: tl.constexpr,
    NATIVE: tl.constexpr,
):
    """``L`` of the chunk in one ``[64, 64]`` dot over the keys (written to ``a``), then its
    blocks of 16 read back and ``A = (I + L)^-1`` written over it."""
    n = tl.program_id(0)
    bh = tl.program_id(1)
    b, h, kh, t0, row0 = _chunk(n, bh, NT, HK, HV)
    rows = tl.arange(0, 64)
    gram = tl.zeros((64, 64), dtype=tl.float32)
    ss = tl.zeros((64,), dtype=tl.float32)
    for s0 in range(0, DK, BS):
        k = _rows(k_ptr, b, t0, T, kh, HK, DK, 64, BS, s0)
        gram += _gram(k, k, PRECISION, NATIVE)
        kf = k.to(tl.float32)
        ss += tl.sum(kf * kf, axis=1)
    if L2NORM:
        r = 1.0 / tl.sqrt(ss + 1e-6)
    else:
        r = ss * 0.0 + 1.0
    c = tl.cumsum(floor_decay(_per_row(g_ptr, b, t0, T, h, HV, 64)), axis=0)
    beta = _per_row(beta_ptr, b, t0, T, h, HV, 64)
    tl.store(c_ptr + row0 + rows, c)
    tl.store(rk_ptr + row0 + rows, r)
    below = (rows[:, None] > rows[None, :]) & finite(c)[:, None]  # the rows from a NaN on: out of L
    gap = tl.exp(tl.where(below, c[:, None] - c[None, :], 0.0))
    lower = tl.where(below, gram * r[:, None] * r[None, :] * gap * beta[:, None], 0.0)
    base = row0 * 64
    tl.store(a_ptr + base + rows[:, None] * 64 + rows[None, :], lower)
    tl.debug_barrier()
    # the inverse of I + L, block by block: A_ii by substitution, A_ij = -A_ii sum_k L_ik A_kj
    a00 = _unit_lower_inverse(_load_block(a_ptr, base, 0, 0))
    a11 = _unit_lower_inverse(_load_block(a_ptr, base, 1, 1))
    a22 = _unit_lower_inverse(_load_block(a_ptr, base, 2, 2))
    a33 = _unit_lower_inverse(_load_block(a_ptr, base, 3, 3))
    l10 = _load_block(a_ptr, base, 1, 0)
    l20 = _load_block(a_ptr, base, 2, 0)
    l21 = _load_block(a_ptr, base, 2, 1)
    l30 = _load_block(a_ptr, base, 3, 0)
    l31 = _load_block(a_ptr, base, 3, 1)
    l32 = _load_block(a_ptr, base, 3, 2)
    tl.debug_barrier()
    a10 = -_mm(a11, _mm(l10, a00, PRECISION), PRECISION)
    a21 = -_mm(a22, _mm(l21, a11, PRECISION), PRECISION)
    a32 = -_mm(a33, _mm(l32, a22, PRECISION), PRECISION)
    a20 = -_mm(a22, _mm(l20, a00, PRECISION) + _mm(l21, a10, PRECISION), PRECISION)
    a31 = -_mm(a33, _mm(l31, a11, PRECISION) + _mm(l32, a21, PRECISION), PRECISION)
    a30 = -_mm(
        a33,
        _mm(l30, a00, PRECISION) + _mm(l31, a10, PRECISION) + _mm(l32, a20, PRECISION),
        PRECISION,
    )
    _store_block(a_ptr, base, 0, 0, a00)
    _store_block(a_ptr, base, 1, 0, a10)
    _store_block(a_ptr, base, 1, 1, a11)
    _store_block(a_ptr, base, 2, 0, a20)
    _store_block(a_ptr, base, 2, 1, a21)
    _store_block(a_ptr, base, 2, 2, a22)
    _store_block(a_ptr, base, 3, 0, a30)
    _store_block(a_ptr, base, 3, 1, a31)
    _store_block(a_ptr, base, 3, 2, a32)
    _store_block(a_ptr, base, 3, 3, a33)


@triton.jit
def _inverse(a_ptr, row0):
    """A chunk's ``[64, 64]`` inverse (block lower triangular; the blocks above hold ``L``'s
    zeros)."""
    rows = tl.arange(0, 64)
    return tl.load(a_ptr + (row0 + rows)[:, None] * 64 + rows[None, :])


@triton.jit
def wy_kernel(
    k_ptr,
    v_ptr,
    beta_ptr,
    a_ptr,
    c_ptr,
    rk_ptr,
    w_ptr,
    u_ptr,
    T,
    NT,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BS: tl.constexpr,
    PRECISION: tl.constexpr,
    BF16: tl.constexpr,
    NATIVE: tl.constexpr,
):
    n = tl.program_id(0)
    bh = tl.program_id(1)
    b, h, kh, t0, row0 = _chunk(n, bh, NT, HK, HV)
    rows = tl.arange(0, 64)
    a = _inverse(a_ptr, row0)
    beta = _per_row(beta_ptr, b, t0, T, h, HV, 64)
    c = tl.load(c_ptr + row0 + rows)
    fk = tl.where(finite(c), beta * tl.exp(c) * tl.load(rk_ptr + row0 + rows), 0.0)
    d = tl.arange(0, BS)
    for s0 in range(0, DK, BS):
        x = _rows(k_ptr, b, t0, T, kh, HK, DK, 64, BS, s0).to(tl.float32) * fk[:, None]
        tl.store(
            w_ptr + (row0 + rows)[:, None] * DK + s0 + d[None, :],
            narrow(_mmp(a, x, PRECISION, BF16, NATIVE), BF16, NATIVE),
            mask=(s0 + d < DK)[None, :],
        )
    for s0 in range(0, DV, BS):
        y = _rows(v_ptr, b, t0, T, h, HV, DV, 64, BS, s0).to(tl.float32) * beta[:, None]
        tl.store(
            u_ptr + (row0 + rows)[:, None] * DV + s0 + d[None, :],
            narrow(_mmp(a, y, PRECISION, BF16, NATIVE), BF16, NATIVE),
            mask=(s0 + d < DV)[None, :],
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
    return x - _mmp(_scratch(w_ptr, row, q * BQ, DK, BQ), s, PRECISION, BF16, NATIVE)


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
    kq = _rows(k_ptr, b, t0, T, kh, HK, DK, 64, BQ, q * BQ).to(tl.float32)
    return s * e + _mmp(tl.trans(kq), xf, PRECISION, BF16, NATIVE)


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
    sb = (
        st_ptr + (bh * DK).to(tl.int64) * DV
    )  # again from the argument: nothing more live through the loop
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
    b, h, kh, t0, row0 = _chunk(n, bh, NT, HK, HV)
    rows = tl.arange(0, 64)
    dv = tl.program_id(0) * BV + tl.arange(0, BV)
    mv = dv < DV
    hn = h_ptr + (bh.to(tl.int64) * NT + n) * DK * DV
    qk = tl.zeros((64, 64), dtype=tl.float32)
    qs = tl.zeros((64, BV), dtype=tl.float32)
    ss = tl.zeros((64,), dtype=tl.float32)
    for s0 in range(0, DK, BS):
        q = _rows(q_ptr, b, t0, T, kh, HK, DK, 64, BS, s0)
        qk += _gram(q, _rows(k_ptr, b, t0, T, kh, HK, DK, 64, BS, s0), PRECISION, NATIVE)
        qf = q.to(tl.float32)
        ss += tl.sum(qf * qf, axis=1)
        offs, m = _slab(s0, dv, DK, DV, BS)
        qs += _mmp(
            qf, tl.load(hn + offs, mask=m, other=0.0).to(tl.float32), PRECISION, BF16, NATIVE
        )
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
    o = qs * (rq * tl.exp(c))[:, None] + _mmp(attn, x, PRECISION, BF16, NATIVE)
    offs = ((b * T + t0 + rows).to(tl.int64)[:, None] * HV + h) * DV + dv[None, :]
    tl.store(
        o_ptr + offs, o.to(o_ptr.dtype.element_ty), mask=(t0 + rows < T)[:, None] & mv[None, :]
    )


CONFIGS = tuning.TRITON_DELTA_RULE_CHUNK64


def _config(dev: torch.device) -> dict[str, int]:
    return CONFIGS.get(current(dev).arch if dev.type != "cpu" else "default", CONFIGS["default"])


def gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    state,
    scale: float,
    l2norm_qk: bool,
    config: dict | None = None,
    precision: str = "fp32",
):
    """Chunks of 64: backend entry below :func:`ftlab.triton.gated_delta_rule.gated_delta_rule`
    (contiguous q, k, v ``[B, T, H, D]``; g and beta fp32 ``[B, T, Hv]``; state fp32 ``[B, Hv, Dk,
    Dv]`` or None). Returns ``(o [B, T, Hv, Dv] in v's dtype, final state fp32)``; ``config``
    overrides entries of :data:`CONFIGS` (benchmark sweeps). ``precision="bf16"`` with bf16
    inputs: the WY, scan and output kernels round each fp32 operand to bf16 once and take one bf16
    product (fp32 sums; the inverse and the state in registers stay at fp32 accuracy), and W, U /
    X and the chunks' start states are kept in bf16 -- the WY form of
    ``ftlab.testing.gated_delta_rule.bf16_operand_terms``; otherwise (and for other dtypes) fp32
    dots and
    fp32 scratch."""
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2:]
    nt = triton.cdiv(t, C)
    bhv = b * hv
    dev = q.device
    cfg = {**_config(dev), **(config or {})}
    prec = dot_precision(dev)
    native = not interpreted()
    bf16 = precision == "bf16" and q.dtype == torch.bfloat16
    bk = max(16, triton.next_power_of_2(dk))
    heads = dict(HK=hk, HV=hv, DK=dk)
    a = torch.empty(bhv, nt * C, C, dtype=torch.float32, device=dev)
    keep = torch.bfloat16 if bf16 else torch.float32  # W, U / X and the chunks' start states
    w = torch.empty(bhv, nt * C, dk, dtype=keep, device=dev)
    u = torch.empty(bhv, nt * C, dv, dtype=keep, device=dev)
    hs = torch.empty(bhv, nt, dk, dv, dtype=keep, device=dev)
    st = (
        state.reshape(bhv, dk, dv).clone()
        if state is not None
        else torch.zeros(bhv, dk, dv, device=dev)
    )
    rk = torch.empty(bhv, nt * C, dtype=torch.float32, device=dev)
    cs = torch.empty(bhv, nt * C, dtype=torch.float32, device=dev)
    inverse_kernel[(nt, bhv)](
        k,
        g,
        beta,
        a,
        cs,
        rk,
        t,
        nt,
        **heads,
        BS=min(cfg["INV_BS"], bk),
        L2NORM=l2norm_qk,
        PRECISION=prec,
        NATIVE=native,
        num_warps=cfg["INV_WARPS"],
    )
    wbs = min(cfg["WY_BS"], max(16, triton.next_power_of_2(max(dk, dv))))
    wy_kernel[(nt, bhv)](
        k,
        v,
        beta,
        a,
        cs,
        rk,
        w,
        u,
        t,
        nt,
        **heads,
        DV=dv,
        BS=wbs,
        PRECISION=prec,
        BF16=bf16,
        NATIVE=native,
        num_warps=cfg["WY_WARPS"],
    )
    nq = max(1, min(cfg["SCAN_NQ"], bk // 16))
    bq = bk // nq
    sbv = min(cfg["SCAN_BV"], max(16, triton.next_power_of_2(dv)))
    scan_kernel[(triton.cdiv(dv, sbv), bhv)](
        k,
        cs,
        rk,
        w,
        u,
        hs,
        st,
        t,
        nt,
        **heads,
        DV=dv,
        BQ=bq,
        NQ=nq,
        BV=sbv,
        PRECISION=prec,
        STAGES=cfg["SCAN_STAGES"],
        BF16=bf16,
        NATIVE=native,
        num_warps=cfg["SCAN_WARPS"],
    )
    obs = min(cfg["OUT_BS"], bk)
    obv = min(
        cfg["OUT_BV_F32" if q.dtype == torch.float32 else "OUT_BV"],
        max(16, triton.next_power_of_2(dv)),
    )
    o = torch.empty(b, t, hv, dv, dtype=v.dtype, device=dev)
    out_kernel[(triton.cdiv(dv, obv), nt, bhv)](
        q,
        k,
        cs,
        rk,
        u,
        hs,
        o,
        float(scale),
        t,
        nt,
        **heads,
        DV=dv,
        BS=obs,
        BV=obv,
        L2NORM=l2norm_qk,
        PRECISION=prec,
        NATIVE=native,
        BF16=bf16,
        num_warps=cfg["OUT_WARPS"],
    )
    return o, st.reshape(b, hv, dk, dv)


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check): Qwen3-Next's
    16 key / 32 value heads of 128 in chunks of 64, in each float dtype, and for bf16 also with
    bf16 operands (``precision="bf16"``: the WY, scan and output kernels)."""
    from ftlab.triton.compile_spec import spec

    if platform_from_arch(target).rdna:  # the general kernels serve RDNA (the planner's rules)
        return []
    cfg = CONFIGS.get(target, CONFIGS["default"])
    prec = "tf32x3" if platform_from_arch(target).tf32 else "ieee"
    heads = {"HK": 16, "HV": 32, "DK": 128}
    f32 = "*fp32"
    specs = []
    for dt, bf16 in (("fp32", False), ("fp16", False), ("bf16", False), ("bf16", True)):
        x = f"*{dt}"
        ops16 = {"BF16": bf16, "NATIVE": True}
        keep = "*bf16" if bf16 else f32  # the scratch W, U / X and start states
        kernels = [
            (
                inverse_kernel,
                {
                    "k_ptr": x,
                    "g_ptr": f32,
                    "beta_ptr": f32,
                    "a_ptr": f32,
                    "c_ptr": f32,
                    "rk_ptr": f32,
                },
                {"BS": cfg["INV_BS"], "L2NORM": True, "NATIVE": True},
                cfg["INV_WARPS"],
            ),
            (
                wy_kernel,
                {
                    "k_ptr": x,
                    "v_ptr": x,
                    "beta_ptr": f32,
                    "a_ptr": f32,
                    "c_ptr": f32,
                    "rk_ptr": f32,
                    "w_ptr": keep,
                    "u_ptr": keep,
                },
                {"DV": 128, "BS": cfg["WY_BS"], **ops16},
                cfg["WY_WARPS"],
            ),
            (
                scan_kernel,
                {
                    "k_ptr": x,
                    "c_ptr": f32,
                    "rk_ptr": f32,
                    "w_ptr": keep,
                    "u_ptr": keep,
                    "h_ptr": keep,
                    "st_ptr": f32,
                },
                {
                    "DV": 128,
                    "BQ": 128 // cfg["SCAN_NQ"],
                    "NQ": cfg["SCAN_NQ"],
                    "BV": cfg["SCAN_BV"],
                    "STAGES": cfg["SCAN_STAGES"],
                    **ops16,
                },
                cfg["SCAN_WARPS"],
            ),
            (
                out_kernel,
                {
                    "q_ptr": x,
                    "k_ptr": x,
                    "c_ptr": f32,
                    "rk_ptr": f32,
                    "u_ptr": keep,
                    "h_ptr": keep,
                    "o_ptr": x,
                    "scale": "fp32",
                },
                {
                    "DV": 128,
                    "BS": cfg["OUT_BS"],
                    "BV": cfg["OUT_BV_F32" if dt == "fp32" else "OUT_BV"],
                    "L2NORM": True,
                    **ops16,
                },
                cfg["OUT_WARPS"],
            ),
        ]
        if bf16:  # the inverse does not change with the operands' precision
            kernels = kernels[1:]
        for kernel, types, extra, warps in kernels:
            name = kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__
            what = f"{dt}, bf16 operands" if bf16 else dt
            specs.append(
                spec(
                    kernel,
                    f"{name}[{what}, chunk 64, 16/32 heads of 128]",
                    types=types,
                    constexprs={**heads, "PRECISION": prec, **extra},
                    num_warps=warps,
                )
            )
    return specs

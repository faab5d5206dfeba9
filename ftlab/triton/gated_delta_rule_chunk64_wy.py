"""The WY form of the chunk-64 gated delta rule prefill
(:mod:`ftlab.triton.gated_delta_rule_chunk64`), chunks in parallel. With a chunk's keys ``K``
(L2-normalised when asked), cumulative log decays ``c`` from its start and ``L = beta_i (k_i . k_j)
exp(c_i - c_j)`` (j < i):

- ``inverse_kernel``: ``L`` from one ``[64, 64]`` key product, then the inverse
  ``A = (I + L)^-1`` block by block over blocks of 16 rows (each diagonal block by forward
  substitution over its rows, the blocks below it from the solved ones); writes ``A`` (fp32
  ``[64, 64]`` a chunk), ``c`` and the keys' norm factors;
- ``wy_kernel``: ``W = A (beta exp(c) K)`` and ``U = A (beta V)``, head dimensions BS columns at
  a time, fp32 (bf16 with bf16 operands).

Hostile decays as in the general form (:mod:`ftlab.triton.gated_delta_rule_chunk_inputs`):
:func:`floor_decay` at load, and ``L`` and the keys' factor selected to 0 on the rows whose
``c`` is not :func:`finite`.
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
from ftlab.triton.gated_delta_rule_chunk_inputs import finite, floor_decay


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
    b, h, kh, t0, row0 = chunk_coords(n, bh, NT, HK, HV)
    rows = tl.arange(0, 64)
    gram = tl.zeros((64, 64), dtype=tl.float32)
    ss = tl.zeros((64,), dtype=tl.float32)
    for s0 in range(0, DK, BS):
        k = input_rows(k_ptr, b, t0, T, kh, HK, DK, 64, BS, s0)
        gram += input_gram(k, k, PRECISION, NATIVE)
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
    b, h, kh, t0, row0 = chunk_coords(n, bh, NT, HK, HV)
    rows = tl.arange(0, 64)
    a = _inverse(a_ptr, row0)
    beta = _per_row(beta_ptr, b, t0, T, h, HV, 64)
    c = tl.load(c_ptr + row0 + rows)
    fk = tl.where(finite(c), beta * tl.exp(c) * tl.load(rk_ptr + row0 + rows), 0.0)
    d = tl.arange(0, BS)
    for s0 in range(0, DK, BS):
        x = input_rows(k_ptr, b, t0, T, kh, HK, DK, 64, BS, s0).to(tl.float32) * fk[:, None]
        tl.store(
            w_ptr + (row0 + rows)[:, None] * DK + s0 + d[None, :],
            narrow(mmp(a, x, PRECISION, BF16, NATIVE), BF16, NATIVE),
            mask=(s0 + d < DK)[None, :],
        )
    for s0 in range(0, DV, BS):
        y = input_rows(v_ptr, b, t0, T, h, HV, DV, 64, BS, s0).to(tl.float32) * beta[:, None]
        tl.store(
            u_ptr + (row0 + rows)[:, None] * DV + s0 + d[None, :],
            narrow(mmp(a, y, PRECISION, BF16, NATIVE), BF16, NATIVE),
            mask=(s0 + d < DV)[None, :],
        )

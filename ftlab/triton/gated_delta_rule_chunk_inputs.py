"""A chunk's inputs as the chunked gated delta rule prefill's kernels read them (the general form,
:mod:`ftlab.triton.gated_delta_rule_chunk`; the decay guards also in
:mod:`ftlab.triton.gated_delta_rule_chunk64`): rows of q, k and v in fp32, their L2-norm factors,
and the cumulative log decays.

Hostile decays as the reference computes them (ftlab/reference/gated_delta_rule.py): g at least
``G_FLOOR`` (:func:`floor_decay`), a NaN kept in ``c``, and the rows whose ``c`` is not finite
(:func:`finite`) selected out of every sum over the chunk's rows by the kernels, so that a NaN
reaches its own and later tokens only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ftlab.reference.gated_delta_rule import G_FLOOR

_G_FLOOR = tl.constexpr(G_FLOOR)


@triton.jit
def rows_f32(
    ptr, b, t0, T, head, H: tl.constexpr, D: tl.constexpr, R: tl.constexpr, BS: tl.constexpr, col0
):
    """fp32 ``[R, BS]``: rows t0 .. t0 + R, columns col0 .. of head ``head`` of a ``[B, T, H, D]``
    tensor, zeros past T and D."""
    t = t0 + tl.arange(0, R)
    d = col0 + tl.arange(0, BS)
    offs = ((b * T + t).to(tl.int64)[:, None] * H + head) * D + d[None, :]
    return tl.load(ptr + offs, mask=(t < T)[:, None] & (d < D)[None, :], other=0.0).to(tl.float32)


@triton.jit
def inv_norms(
    ptr,
    b,
    t0,
    T,
    head,
    H: tl.constexpr,
    D: tl.constexpr,
    R: tl.constexpr,
    BS: tl.constexpr,
    L2NORM: tl.constexpr,
):
    """``[R]``: rsqrt(sum x^2 + 1e-6) of each row (transformers' l2norm), or ones."""
    if L2NORM:
        ss = tl.zeros((R,), dtype=tl.float32)
        for s0 in range(0, D, BS):
            x = rows_f32(ptr, b, t0, T, head, H, D, R, BS, s0)
            ss += tl.sum(x * x, axis=1)
        return 1.0 / tl.sqrt(ss + 1e-6)
    else:
        return tl.full((R,), 1.0, dtype=tl.float32)


@triton.jit
def floor_decay(g):
    """Log decays g at least G_FLOOR (ftlab.reference.gated_delta_rule: a full forget either way, as
    fp32 exp is 0 below it), so that a chunk's cumulative sums stay finite and well-conditioned; a
    NaN stays a NaN."""
    return tl.where(g < _G_FLOOR, _G_FLOOR, g)


@triton.jit
def finite(c):
    """Whether each cumulative log decay is finite: a row whose c is NaN (or +inf) has its decays
    selected out of every sum over the chunk's rows."""
    return c - c == 0.0


@triton.jit
def decay(g_ptr, b, t0, T, h, HV: tl.constexpr, R: tl.constexpr, before):
    """``[R]``: the cumulative log decay of rows t0 .. t0 + R, ``before`` the sum ahead of t0."""
    t = t0 + tl.arange(0, R)
    g = tl.load(g_ptr + (b * T + t).to(tl.int64) * HV + h, mask=t < T, other=0.0)
    return before + tl.cumsum(floor_decay(g), axis=0)


@triton.jit
def sum_before(g_ptr, b, t0, n, T, h, HV: tl.constexpr, C: tl.constexpr):
    """The sum of the log decays of the chunk's first n rows (chunk at t0)."""
    t = t0 + tl.arange(0, C)
    g = tl.load(
        g_ptr + (b * T + t).to(tl.int64) * HV + h, mask=(t < T) & (tl.arange(0, C) < n), other=0.0
    )
    return tl.sum(floor_decay(g), axis=0)

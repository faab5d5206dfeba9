"""The chunked prefill of the gated delta rule in Triton (reference:
ftlab/reference/gated_delta_rule.py).

Chunks of C tokens; with a chunk's keys ``K`` (L2-normalised when asked), cumulative log decay
``c`` from its start and ``L = beta_i (k_i . k_j) exp(c_i - c_j)`` (j < i), four kernels, each
on tiles of at most ``[C, C]`` or ``[C, BS]`` (head dimensions taken BS columns at a time):

- ``chunk_kkt_kernel`` (chunks in parallel): ``L``, fp32 scratch ``[C, C]`` a chunk, and the
  keys' L2-norm factors for the solve and state kernels;
- ``chunk_solve_kernel`` (chunks in parallel): the WY form ``W = (I + L)^-1 (beta exp(c) K)``,
  ``U = (I + L)^-1 (beta V)`` by block forward substitution over blocks of 16 rows (a block's
  right-hand sides less ``L_ij`` times the solved blocks above, then its unit-triangular
  diagonal block inverted row by row and applied);
- ``chunk_state_kernel`` (chunk after chunk, per sequence, value head and BV state columns):
  the deltas ``X = U - W S`` (over U) and ``S' = exp(c_last) S + (K exp(c_last - c))^T X``,
  every chunk's starting state kept in ``h`` (fp32 ``[NT + 1, Dk, Dv]`` a head);
- ``chunk_output_kernel`` (chunks in parallel): ``O = (Q exp(c)) S + (Q K^T * D) X`` with
  ``D[i, j] = exp(c_i - c_j)`` (j <= i).

The fp32 dots are IEEE, or tf32x3 on NVIDIA (three tf32 products, fp32 accuracy). The kernels
read their inputs through :mod:`ftlab.triton.gated_delta_rule_chunk_inputs`, which floors hostile
decays as the reference does (a NaN kept in ``c``); ``L`` and the keys' factor ``beta exp(c)``
are selected to 0 on the rows whose ``c`` is not finite, so that a NaN reaches its own and later
tokens only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.backends import tuning
from ftlab.platform import current, platform_from_arch
from ftlab.triton.gated_delta_rule_chunk_inputs import (
    decay,
    finite,
    inv_norms,
    rows_f32,
    sum_before,
)
from ftlab.triton.q4_0_common import interpreted


@triton.jit
def chunk_kkt_kernel(
    k_ptr,
    g_ptr,
    beta_ptr,
    a_ptr,
    rk_ptr,
    T,
    NT,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    C: tl.constexpr,
    BS: tl.constexpr,
    L2NORM: tl.constexpr,
    PRECISION: tl.constexpr,
):
    n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HV
    h = bh % HV
    kh = h // (HV // HK)
    t0 = n * C
    rows = tl.arange(0, C)
    acc = tl.zeros((C, C), dtype=tl.float32)
    for s0 in range(0, DK, BS):
        x = rows_f32(k_ptr, b, t0, T, kh, HK, DK, C, BS, s0)
        acc += tl.dot(x, tl.trans(x), input_precision=PRECISION)
    r = inv_norms(k_ptr, b, t0, T, kh, HK, DK, C, BS, L2NORM)
    c = decay(g_ptr, b, t0, T, h, HV, C, 0.0)
    beta = tl.load(
        beta_ptr + (b * T + t0 + rows).to(tl.int64) * HV + h, mask=t0 + rows < T, other=0.0
    )
    below = (rows[:, None] > rows[None, :]) & finite(c)[:, None]  # the rows from a NaN on: out of L
    gap = tl.exp(tl.where(below, c[:, None] - c[None, :], 0.0))
    lower = tl.where(below, acc * r[:, None] * r[None, :] * gap * beta[:, None], 0.0)
    tl.store(a_ptr + (bh.to(tl.int64) * NT * C + t0 + rows)[:, None] * C + rows[None, :], lower)
    tl.store(rk_ptr + bh.to(tl.int64) * NT * C + t0 + rows, r)


@triton.jit
def _solve_columns(
    x_ptr,
    a_ptr,
    row0,
    i,
    rhs,
    inv,
    D: tl.constexpr,
    C: tl.constexpr,
    col0,
    BS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Block ``i`` (16 rows from scratch row ``row0``) of the solution's columns col0 .. col0 +
    BS: ``rhs`` less ``L_ij X_j`` for the solved blocks j < i, times the diagonal block's
    inverse."""
    rows = tl.arange(0, 16)
    d = col0 + tl.arange(0, BS)
    for j in range(i):
        lij = tl.load(a_ptr + (row0 + i * 16 + rows)[:, None] * C + j * 16 + rows[None, :])
        xj = tl.load(
            x_ptr + (row0 + j * 16 + rows)[:, None] * D + d[None, :],
            mask=(d < D)[None, :],
            other=0.0,
        )
        rhs -= tl.dot(lij, xj, input_precision=PRECISION)
    out = tl.dot(inv, rhs, input_precision=PRECISION)
    tl.store(x_ptr + (row0 + i * 16 + rows)[:, None] * D + d[None, :], out, mask=(d < D)[None, :])


@triton.jit
def chunk_solve_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    a_ptr,
    rk_ptr,
    w_ptr,
    u_ptr,
    T,
    NT,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    C: tl.constexpr,
    BS: tl.constexpr,
    L2NORM: tl.constexpr,
    PRECISION: tl.constexpr,
):
    n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HV
    h = bh % HV
    kh = h // (HV // HK)
    t0 = n * C
    row0 = bh.to(tl.int64) * NT * C + t0
    rows = tl.arange(0, 16)
    for i in range(C // 16):
        ti = t0 + i * 16
        lii = tl.load(a_ptr + (row0 + i * 16 + rows)[:, None] * C + i * 16 + rows[None, :])
        inv = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
        for r in range(1, 16):
            a = tl.sum(tl.where(rows[:, None] == r, lii, 0.0), axis=0)
            inv = tl.where(rows[:, None] == r, inv - tl.sum(a[:, None] * inv, axis=0)[None, :], inv)
        beta = tl.load(
            beta_ptr + (b * T + ti + rows).to(tl.int64) * HV + h, mask=ti + rows < T, other=0.0
        )
        c = decay(g_ptr, b, ti, T, h, HV, 16, sum_before(g_ptr, b, t0, i * 16, T, h, HV, C))
        wk = tl.where(finite(c), beta * tl.exp(c) * tl.load(rk_ptr + row0 + i * 16 + rows), 0.0)
        for s0 in range(0, DK, BS):
            rhs = rows_f32(k_ptr, b, ti, T, kh, HK, DK, 16, BS, s0) * wk[:, None]
            _solve_columns(w_ptr, a_ptr, row0, i, rhs, inv, DK, C, s0, BS, PRECISION)
        for s0 in range(0, DV, BS):
            rhs = rows_f32(v_ptr, b, ti, T, h, HV, DV, 16, BS, s0) * beta[:, None]
            _solve_columns(u_ptr, a_ptr, row0, i, rhs, inv, DV, C, s0, BS, PRECISION)
        tl.debug_barrier()


@triton.jit
def chunk_state_kernel(
    k_ptr,
    g_ptr,
    w_ptr,
    u_ptr,
    h_ptr,
    rk_ptr,
    T,
    NT,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    C: tl.constexpr,
    BS: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
    PRECISION: tl.constexpr,
):
    bh = tl.program_id(0)
    b = bh // HV
    h = bh % HV
    kh = h // (HV // HK)
    rows = tl.arange(0, C)
    dv = tl.program_id(1) * BV + tl.arange(0, BV)
    mv = dv < DV
    ds = tl.arange(0, BS)
    for n in range(NT):
        t0 = n * C
        row = bh.to(tl.int64) * NT * C + t0 + rows
        hn = h_ptr + (bh.to(tl.int64) * (NT + 1) + n) * DK * DV
        x = tl.load(u_ptr + row[:, None] * DV + dv[None, :], mask=mv[None, :], other=0.0)
        for s0 in range(0, DK, BS):
            d = s0 + ds
            ws = tl.load(w_ptr + row[:, None] * DK + d[None, :], mask=(d < DK)[None, :], other=0.0)
            ss = tl.load(
                hn + d[:, None] * DV + dv[None, :], mask=(d < DK)[:, None] & mv[None, :], other=0.0
            )
            x -= tl.dot(ws, ss, input_precision=PRECISION)
        tl.store(u_ptr + row[:, None] * DV + dv[None, :], x, mask=mv[None, :])
        c = decay(g_ptr, b, t0, T, h, HV, C, 0.0)
        c_last = sum_before(g_ptr, b, t0, C, T, h, HV, C)
        wk = tl.exp(c_last - c) * tl.load(rk_ptr + row)
        for s0 in range(0, DK, BS):
            d = s0 + ds
            smask = (d < DK)[:, None] & mv[None, :]
            ss = tl.load(hn + d[:, None] * DV + dv[None, :], mask=smask, other=0.0)
            ks = rows_f32(k_ptr, b, t0, T, kh, HK, DK, C, BS, s0) * wk[:, None]
            ss = ss * tl.exp(c_last) + tl.dot(tl.trans(ks), x, input_precision=PRECISION)
            tl.store(hn + DK * DV + d[:, None] * DV + dv[None, :], ss, mask=smask)
        tl.debug_barrier()


@triton.jit
def chunk_output_kernel(
    q_ptr,
    k_ptr,
    g_ptr,
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
    C: tl.constexpr,
    BS: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
    PRECISION: tl.constexpr,
):
    n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HV
    h = bh % HV
    kh = h // (HV // HK)
    t0 = n * C
    rows = tl.arange(0, C)
    dv = tl.program_id(2) * BV + tl.arange(0, BV)
    mv = dv < DV
    ds = tl.arange(0, BS)
    c = decay(g_ptr, b, t0, T, h, HV, C, 0.0)
    rq = inv_norms(q_ptr, b, t0, T, kh, HK, DK, C, BS, L2NORM) * scale
    rk = inv_norms(k_ptr, b, t0, T, kh, HK, DK, C, BS, L2NORM)
    hn = h_ptr + (bh.to(tl.int64) * (NT + 1) + n) * DK * DV
    qk = tl.zeros((C, C), dtype=tl.float32)
    o = tl.zeros((C, BV), dtype=tl.float32)
    for s0 in range(0, DK, BS):
        d = s0 + ds
        qs = rows_f32(q_ptr, b, t0, T, kh, HK, DK, C, BS, s0)
        qk += tl.dot(
            qs,
            tl.trans(rows_f32(k_ptr, b, t0, T, kh, HK, DK, C, BS, s0)),
            input_precision=PRECISION,
        )
        ss = tl.load(
            hn + d[:, None] * DV + dv[None, :], mask=(d < DK)[:, None] & mv[None, :], other=0.0
        )
        o += tl.dot(qs * (rq * tl.exp(c))[:, None], ss, input_precision=PRECISION)
    upto = rows[:, None] >= rows[None, :]
    gap = tl.exp(tl.where(upto, c[:, None] - c[None, :], 0.0))
    attn = tl.where(upto, qk * rq[:, None] * rk[None, :] * gap, 0.0)
    x = tl.load(
        u_ptr + (bh.to(tl.int64) * NT * C + t0 + rows)[:, None] * DV + dv[None, :],
        mask=mv[None, :],
        other=0.0,
    )
    o += tl.dot(attn, x, input_precision=PRECISION)
    offs = ((b * T + t0 + rows).to(tl.int64)[:, None] * HV + h) * DV + dv[None, :]
    tl.store(
        o_ptr + offs, o.to(o_ptr.dtype.element_ty), mask=(t0 + rows < T)[:, None] & mv[None, :]
    )


def precision(device: torch.device) -> str:
    """The fp32 dots' input precision on ``device``."""
    return "ieee" if interpreted() or current(device).kind != "cuda" else "tf32x3"


CONFIGS = tuning.TRITON_DELTA_RULE_CHUNK


def scratch(bhv: int, nt: int, c: int, dk: int, dv: int, state, dev: torch.device):
    """fp32 scratch of a chunked prefill over ``bhv`` (sequence, value head) rows of ``nt``
    chunks of ``c``: the chunks' ``[c, c]`` matrices, W ``[nt c, dk]``, U ``[nt c, dv]``, the
    chunks' start states ``[nt + 1, dk, dv]`` (the first one ``state``, or zeros), the keys' norm
    factors."""
    a = torch.empty(bhv, nt * c, c, dtype=torch.float32, device=dev)
    w = torch.empty(bhv, nt * c, dk, dtype=torch.float32, device=dev)
    u = torch.empty(bhv, nt * c, dv, dtype=torch.float32, device=dev)
    hs = torch.empty(bhv, nt + 1, dk, dv, dtype=torch.float32, device=dev)
    if state is None:
        hs[:, 0].zero_()
    else:
        hs[:, 0].copy_(state.reshape(bhv, dk, dv))
    rk = torch.empty(bhv, nt * c, dtype=torch.float32, device=dev)
    return a, w, u, hs, rk


def gated_delta_rule(q, k, v, g, beta, state, scale: float, l2norm_qk: bool, chunk_size: int):
    """Backend entry of :func:`ftlab.ops.gated_delta_rule` (contiguous q, k, v; g and beta fp32)."""
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2:]
    c = chunk_size
    nt = triton.cdiv(t, c)
    bhv = b * hv
    dev = q.device
    cfg = CONFIGS.get(current(dev).arch if dev.type != "cpu" else "default", CONFIGS["default"])
    bs, bv, nw = cfg["BS"], cfg["BV"], cfg["num_warps"]
    common = dict(
        HK=hk, HV=hv, DK=dk, C=c, BS=bs, L2NORM=l2norm_qk, PRECISION=precision(dev), num_warps=nw
    )
    a, w, u, hs, rk = scratch(bhv, nt, c, dk, dv, state, dev)
    chunk_kkt_kernel[(nt, bhv)](k, g, beta, a, rk, t, nt, **common)
    chunk_solve_kernel[(nt, bhv)](k, v, g, beta, a, rk, w, u, t, nt, DV=dv, **common)
    sbv = cfg.get("STATE_BV", bv)
    chunk_state_kernel[(bhv, triton.cdiv(dv, sbv))](
        k, g, w, u, hs, rk, t, nt, DV=dv, BV=sbv, **common
    )
    vb = triton.cdiv(dv, bv)
    o = torch.empty(b, t, hv, dv, dtype=v.dtype, device=dev)
    chunk_output_kernel[(nt, bhv, vb)](
        q, k, g, u, hs, o, float(scale), t, nt, DV=dv, BV=bv, **common
    )
    return o, hs[:, nt].reshape(b, hv, dk, dv).contiguous()


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check): Qwen3-Next's
    16 key / 32 value heads of 128, chunks of 64, in each float dtype."""
    from ftlab.triton.compile_spec import spec

    prec = "tf32x3" if platform_from_arch(target).tf32 else "ieee"
    cfg = CONFIGS.get(target, CONFIGS["default"])
    bs, bv, nw = cfg["BS"], cfg["BV"], cfg["num_warps"]
    base = {"HK": 16, "HV": 32, "DK": 128, "C": 64, "BS": bs, "L2NORM": True, "PRECISION": prec}
    f32 = "*fp32"
    specs = []
    for dt in ("fp32", "fp16", "bf16"):
        x = f"*{dt}"
        for kernel, types, extra in (
            (
                chunk_kkt_kernel,
                {"k_ptr": x, "g_ptr": f32, "beta_ptr": f32, "a_ptr": f32, "rk_ptr": f32},
                {},
            ),
            (
                chunk_solve_kernel,
                {
                    "k_ptr": x,
                    "v_ptr": x,
                    "g_ptr": f32,
                    "beta_ptr": f32,
                    "a_ptr": f32,
                    "rk_ptr": f32,
                    "w_ptr": f32,
                    "u_ptr": f32,
                },
                {"DV": 128},
            ),
            (
                chunk_state_kernel,
                {"k_ptr": x, "g_ptr": f32, "w_ptr": f32, "u_ptr": f32, "h_ptr": f32, "rk_ptr": f32},
                {"DV": 128, "BV": cfg.get("STATE_BV", bv)},
            ),
            (
                chunk_output_kernel,
                {
                    "q_ptr": x,
                    "k_ptr": x,
                    "g_ptr": f32,
                    "u_ptr": f32,
                    "h_ptr": f32,
                    "o_ptr": x,
                    "scale": "fp32",
                },
                {"DV": 128, "BV": bv},
            ),
        ):
            name = kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__
            specs.append(
                spec(
                    kernel,
                    f"{name}[{dt}, chunk 64, 16/32 heads of 128]",
                    types=types,
                    constexprs={**base, **extra},
                    num_warps=nw,
                )
            )
    return specs

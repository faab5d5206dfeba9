"""The gated delta rule in Triton (reference: ftlab/reference/deltanet.py).

Decode (:func:`gated_delta_step`): one program per (sequence, value head, block of BLOCK_V
state columns) holds its ``[Dk, BLOCK_V]`` slice of the fp32 state in registers, L2-normalises
its query and key head (the key head ``h // (Hv // Hk)``), decays, reads, writes and reads out
the state, and stores it back in place: one pass over the state, no host work, capturable.

Prefill (:func:`gated_delta_rule`), chunks of C tokens, two kernels:

- ``chunk_prepare_kernel``, one program per (chunk, sequence and value head), all in parallel:
  with the chunk's normalised keys ``K``, cumulative log decay ``c`` and the strictly lower
  ``L = beta_i (k_i . k_j) exp(c_i - c_j)``, the WY form ``W = (I + L)^-1 (beta exp(c) K)``,
  ``U = (I + L)^-1 (beta V)`` (fp32 scratch) by block forward substitution over blocks of 16
  rows: a block's right-hand sides less ``L_ij`` times the blocks above (dots), then the
  inverse of its unit-triangular diagonal block (row by row on a 16 x 16 tile) applied;
- ``chunk_scan_kernel``, one program per (sequence and value head, block of BLOCK_V columns),
  chunk after chunk with the state slice in registers: the chunk's deltas ``X = U - W S``, its
  output ``O = (Q exp(c)) S + (Q K^T * D) X`` (``D[i, j] = exp(c_i - c_j)``, j <= i) and the
  next state ``S = exp(c_last) S + (K exp(c_last - c))^T X``.

The fp32 dots are IEEE, or tf32x3 on NVIDIA (three tf32 products, fp32 accuracy).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.platform import current
from ftlab.triton.q4_0_common import interpreted


@triton.jit
def _unit_rows(x, L2NORM: tl.constexpr):
    """Rows of ``x [R, D]`` (fp32) times rsqrt(sum x^2 + 1e-6) when L2NORM (transformers' l2norm)."""
    if L2NORM:
        x = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6))[:, None]
    return x


@triton.jit
def _unit(x, L2NORM: tl.constexpr):
    """``x [D]`` (fp32) times rsqrt(sum x^2 + 1e-6) when L2NORM."""
    if L2NORM:
        x = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) + 1e-6))
    return x


@triton.jit
def gated_delta_step_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, o_ptr, scale, HK: tl.constexpr,
                            HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BLOCK_K: tl.constexpr,
                            BLOCK_V: tl.constexpr, L2NORM: tl.constexpr):  # fmt: skip
    bh = tl.program_id(0)
    b = bh // HV
    h = bh % HV
    kh = h // (HV // HK)
    dk = tl.arange(0, BLOCK_K)
    dv = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mk = dk < DK
    mv = dv < DV
    q = tl.load(q_ptr + (b * HK + kh) * DK + dk, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + (b * HK + kh) * DK + dk, mask=mk, other=0.0).to(tl.float32)
    q = _unit(q, L2NORM) * scale
    k = _unit(k, L2NORM)
    v = tl.load(v_ptr + bh * DV + dv, mask=mv, other=0.0).to(tl.float32)
    decay = tl.exp(tl.load(g_ptr + bh))
    beta = tl.load(beta_ptr + bh)
    offs = bh.to(tl.int64) * DK * DV + dk[:, None] * DV + dv[None, :]
    smask = mk[:, None] & mv[None, :]
    s = tl.load(s_ptr + offs, mask=smask, other=0.0) * decay
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
    s = s + k[:, None] * delta[None, :]
    tl.store(s_ptr + offs, s, mask=smask)
    o = tl.sum(s * q[:, None], axis=0)
    tl.store(o_ptr + bh * DV + dv, o.to(o_ptr.dtype.element_ty), mask=mv)


@triton.jit
def _chunk_rows(ptr, b, t0, T, head, H: tl.constexpr, D: tl.constexpr, C: tl.constexpr, BLOCK: tl.constexpr,
                col0):  # fmt: skip
    """Rows t0 .. t0 + C of head ``head`` of a ``[B, T, H, D]`` tensor as fp32 ``[C, BLOCK]``
    (columns col0 ..), zeros past T and D."""
    t = t0 + tl.arange(0, C)
    d = col0 + tl.arange(0, BLOCK)
    offs = ((b * T + t).to(tl.int64)[:, None] * H + head) * D + d[None, :]
    return tl.load(ptr + offs, mask=(t < T)[:, None] & (d < D)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _block_decay(g_ptr, g_chunk, b, t0, i, T, h, HV: tl.constexpr, C: tl.constexpr):
    """The cumulative log decay from the chunk's start (at t0) of the 16 rows of its block ``i``
    (``g_chunk``: the chunk's C log decays)."""
    rows = tl.arange(0, 16)
    t = t0 + i * 16 + rows
    g = tl.load(g_ptr + (b * T + t).to(tl.int64) * HV + h, mask=t < T, other=0.0)
    before = tl.sum(tl.where(tl.arange(0, C) < i * 16, g_chunk, 0.0), axis=0)
    return before + tl.cumsum(g, axis=0)


@triton.jit
def chunk_prepare_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, T, NT, HK: tl.constexpr, HV: tl.constexpr,
                         DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_DV: tl.constexpr, L2NORM: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HV
    h = bh % HV
    kh = h // (HV // HK)
    t0 = n * C
    rows = tl.arange(0, 16)
    dk = tl.arange(0, BLOCK_K)
    dv = tl.arange(0, BLOCK_DV)
    below = rows[:, None] > rows[None, :]
    crow = tl.arange(0, C)
    g_chunk = tl.load(g_ptr + (b * T + t0 + crow).to(tl.int64) * HV + h, mask=t0 + crow < T, other=0.0)
    base = bh.to(tl.int64) * NT * C + t0
    for i in range(C // 16):
        ti = t0 + i * 16
        ki = _unit_rows(_chunk_rows(k_ptr, b, ti, T, kh, HK, DK, 16, BLOCK_K, 0), L2NORM)
        beta = tl.load(beta_ptr + (b * T + ti + rows).to(tl.int64) * HV + h, mask=ti + rows < T, other=0.0)
        ci = _block_decay(g_ptr, g_chunk, b, t0, i, T, h, HV, C)
        rw = ki * (beta * tl.exp(ci))[:, None]
        ru = _chunk_rows(v_ptr, b, ti, T, h, HV, DV, 16, BLOCK_DV, 0) * beta[:, None]
        for j in range(i):
            kj = _unit_rows(_chunk_rows(k_ptr, b, t0 + j * 16, T, kh, HK, DK, 16, BLOCK_K, 0), L2NORM)
            cj = _block_decay(g_ptr, g_chunk, b, t0, j, T, h, HV, C)
            lij = tl.dot(ki, tl.trans(kj), input_precision=PRECISION) * tl.exp(ci[:, None] - cj[None, :])
            lij = lij * beta[:, None]
            rj = base + j * 16 + rows
            wj = tl.load(w_ptr + rj[:, None] * DK + dk[None, :], mask=(dk < DK)[None, :], other=0.0)
            uj = tl.load(u_ptr + rj[:, None] * DV + dv[None, :], mask=(dv < DV)[None, :], other=0.0)
            rw -= tl.dot(lij, wj, input_precision=PRECISION)
            ru -= tl.dot(lij, uj, input_precision=PRECISION)
        gap = tl.exp(tl.where(below, ci[:, None] - ci[None, :], 0.0))
        lii = tl.where(below, tl.dot(ki, tl.trans(ki), input_precision=PRECISION) * gap * beta[:, None], 0.0)
        inv = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
        for r in range(1, 16):
            a = tl.sum(tl.where(rows[:, None] == r, lii, 0.0), axis=0)
            inv = tl.where(rows[:, None] == r, inv - tl.sum(a[:, None] * inv, axis=0)[None, :], inv)
        ri = base + i * 16 + rows
        tl.store(w_ptr + ri[:, None] * DK + dk[None, :], tl.dot(inv, rw, input_precision=PRECISION),
                 mask=(dk < DK)[None, :])  # fmt: skip
        tl.store(u_ptr + ri[:, None] * DV + dv[None, :], tl.dot(inv, ru, input_precision=PRECISION),
                 mask=(dv < DV)[None, :])  # fmt: skip
        tl.debug_barrier()


@triton.jit
def chunk_scan_kernel(q_ptr, k_ptr, g_ptr, w_ptr, u_ptr, s0_ptr, o_ptr, sn_ptr, scale, T, NT, HK: tl.constexpr,
                      HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr, BLOCK_K: tl.constexpr,
                      BLOCK_V: tl.constexpr, L2NORM: tl.constexpr, HAS_STATE: tl.constexpr,
                      PRECISION: tl.constexpr):  # fmt: skip
    bh = tl.program_id(0)
    b = bh // HV
    h = bh % HV
    kh = h // (HV // HK)
    rows = tl.arange(0, C)
    dk = tl.arange(0, BLOCK_K)
    dv = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mk = dk < DK
    mv = dv < DV
    soffs = bh.to(tl.int64) * DK * DV + dk[:, None] * DV + dv[None, :]
    smask = mk[:, None] & mv[None, :]
    if HAS_STATE:
        s = tl.load(s0_ptr + soffs, mask=smask, other=0.0)
    else:
        s = tl.zeros((BLOCK_K, BLOCK_V), dtype=tl.float32)
    upto = rows[:, None] >= rows[None, :]
    for n in range(NT):
        t0 = n * C
        live = t0 + rows < T
        q = _unit_rows(_chunk_rows(q_ptr, b, t0, T, kh, HK, DK, C, BLOCK_K, 0), L2NORM) * scale
        k = _unit_rows(_chunk_rows(k_ptr, b, t0, T, kh, HK, DK, C, BLOCK_K, 0), L2NORM)
        g = tl.load(g_ptr + (b * T + t0 + rows).to(tl.int64) * HV + h, mask=live, other=0.0)
        c = tl.cumsum(g, axis=0)
        c_last = tl.sum(g, axis=0)
        base = bh.to(tl.int64) * NT * C + t0 + rows
        w = tl.load(w_ptr + base[:, None] * DK + dk[None, :], mask=mk[None, :], other=0.0)
        u = tl.load(u_ptr + base[:, None] * DV + dv[None, :], mask=mv[None, :], other=0.0)
        x = u - tl.dot(w, s, input_precision=PRECISION)
        gap = tl.exp(tl.where(upto, c[:, None] - c[None, :], 0.0))
        attn = tl.where(upto, tl.dot(q, tl.trans(k), input_precision=PRECISION) * gap, 0.0)
        o = tl.dot(q * tl.exp(c)[:, None], s, input_precision=PRECISION)
        o += tl.dot(attn, x, input_precision=PRECISION)
        ooffs = ((b * T + t0 + rows).to(tl.int64)[:, None] * HV + h) * DV + dv[None, :]
        tl.store(o_ptr + ooffs, o.to(o_ptr.dtype.element_ty), mask=live[:, None] & mv[None, :])
        k_end = k * tl.exp(c_last - c)[:, None]
        s = s * tl.exp(c_last) + tl.dot(tl.trans(k_end), x, input_precision=PRECISION)
    tl.store(sn_ptr + soffs, s, mask=smask)


def _precision(device: torch.device) -> str:
    return "ieee" if interpreted() or current(device).kind != "cuda" else "tf32x3"


def _block_v(dv: int, programs: int) -> int:
    """BLOCK_V of the scan: 64 columns, or 32 (then 16) when too few programs fill the GPU."""
    bv = min(64, max(16, triton.next_power_of_2(dv)))
    while bv > 16 and programs * triton.cdiv(dv, bv) < 128:
        bv //= 2
    return bv


def gated_delta_rule(q, k, v, g, beta, state, scale: float, l2norm_qk: bool, chunk_size: int):
    """Backend entry of :func:`ftlab.ops.gated_delta_rule` (contiguous q, k, v; g and beta fp32)."""
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2:]
    c = chunk_size
    nt = triton.cdiv(t, c)
    bk = max(16, triton.next_power_of_2(dk))
    prec = _precision(q.device)
    w = torch.empty(b, hv, nt * c, dk, dtype=torch.float32, device=q.device)
    u = torch.empty(b, hv, nt * c, dv, dtype=torch.float32, device=q.device)
    common = dict(HK=hk, HV=hv, DK=dk, DV=dv, C=c, BLOCK_K=bk, L2NORM=l2norm_qk, PRECISION=prec)
    chunk_prepare_kernel[(nt, b * hv)](k, v, g, beta, w, u, t, nt, BLOCK_DV=max(16, triton.next_power_of_2(dv)),
                                       **common, num_warps=4)  # fmt: skip
    o = torch.empty(b, t, hv, dv, dtype=v.dtype, device=v.device)
    final = torch.empty(b, hv, dk, dv, dtype=torch.float32, device=v.device)
    bv = _block_v(dv, b * hv)
    chunk_scan_kernel[(b * hv, triton.cdiv(dv, bv))](q, k, g, w, u, state if state is not None else final, o, final,
                                                     float(scale), t, nt, BLOCK_V=bv, HAS_STATE=state is not None,
                                                     **common, num_warps=8 if prec == "tf32x3" else 4,
                                                     num_stages=1)  # fmt: skip
    return o, final


def gated_delta_step(q, k, v, g, beta, state, scale: float, l2norm_qk: bool):
    """Backend entry of :func:`ftlab.ops.gated_delta_step` (``state`` contiguous fp32, updated in place)."""
    b, hk, dk = q.shape
    hv, dv = v.shape[1:]
    o = torch.empty(b, hv, dv, dtype=v.dtype, device=v.device)
    bk = max(16, triton.next_power_of_2(dk))
    bv = min(max(16, triton.next_power_of_2(dv)), max(16, 4096 // bk))
    gated_delta_step_kernel[(b * hv, triton.cdiv(dv, bv))](q, k, v, g, beta, state, o, float(scale), HK=hk, HV=hv,
                                                            DK=dk, DV=dv, BLOCK_K=bk, BLOCK_V=bv, L2NORM=l2norm_qk,
                                                            num_warps=4)  # fmt: skip
    return o


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check): Qwen3-Next's
    16 key / 32 value heads of 128, chunks of 64, in each float dtype."""
    from ftlab.triton.compile_spec import spec

    prec = "tf32x3" if target.startswith("sm_") else "ieee"
    heads = {"HK": 16, "HV": 32, "DK": 128, "DV": 128, "BLOCK_K": 128, "L2NORM": True}
    specs = []
    for dt in ("fp32", "fp16", "bf16"):
        specs.append(spec(gated_delta_step_kernel, f"gated_delta_step_kernel[{dt}, 16/32 heads of 128]",
                          types={"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "g_ptr": "*fp32",
                                 "beta_ptr": "*fp32", "s_ptr": "*fp32", "o_ptr": f"*{dt}", "scale": "fp32"},
                          constexprs={**heads, "BLOCK_V": 32}))  # fmt: skip
        specs.append(spec(chunk_prepare_kernel, f"chunk_prepare_kernel[{dt}, chunk 64, 16/32 heads of 128]",
                          types={"k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "g_ptr": "*fp32", "beta_ptr": "*fp32",
                                 "w_ptr": "*fp32", "u_ptr": "*fp32"},
                          constexprs={**heads, "C": 64, "BLOCK_DV": 128, "PRECISION": prec}))  # fmt: skip
        specs.append(spec(chunk_scan_kernel, f"chunk_scan_kernel[{dt}, chunk 64, 16/32 heads of 128]",
                          types={"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "g_ptr": "*fp32", "w_ptr": "*fp32",
                                 "u_ptr": "*fp32", "s0_ptr": "*fp32", "o_ptr": f"*{dt}", "sn_ptr": "*fp32",
                                 "scale": "fp32"},
                          constexprs={**heads, "C": 64, "BLOCK_V": 32, "HAS_STATE": True, "PRECISION": prec},
                          num_warps=8 if prec == "tf32x3" else 4, options={"num_stages": 1}))  # fmt: skip
    return specs

"""The gated delta rule's error bounds (``ops.gated_delta_rule``, ``ops.gated_delta_step``): the
exact recurrence in f64 and the per-element bound on |computed - exact| derived from the rule's
arithmetic (:func:`gated_delta_tolerance`), of fp32 dots or of operands rounded to bf16. The case
functions that hold every backend to them: :mod:`ftlab.testing.gated_delta_rule`."""

from __future__ import annotations

import torch

from ftlab.reference.gated_delta_rule import G_FLOOR, L2NORM_EPS
from ftlab.testing.common import ulp

EPS32 = 2.0**-23


def gated_delta_exact(q, k, v, g, beta, state=None, scale=None, l2norm_qk=True, gates=None):
    """The recurrence in f64 on the CPU: ``(o [B, T, Hv, Dv], final_state)`` f64. ``gates =
    (a_neg, dt_bias)``: g and beta are the raw a and b (``ops.gated_delta_step``'s gates)."""
    return _exact_and_bounds(q, k, v, g, beta, state, scale, l2norm_qk, 1, gates)[:2]


def gated_delta_tolerance(
    q,
    k,
    v,
    g,
    beta,
    state=None,
    scale=None,
    l2norm_qk=True,
    chunk_size=1,
    gates=None,
    operands="fp32",
):
    """Per-element bounds ``(o [B, T, Hv, Dv], final_state [B, Hv, Dk, Dv])`` on |computed -
    exact| for one fp32 computation of the gated delta rule in chunks of ``chunk_size``
    (1: the recurrence, token by token), derived in f64 from the exact recurrence.
    ``operands="bf16"`` adds the terms of :func:`bf16_operand_terms` (a chunked form whose
    fp32 operands are each rounded to bf16 once, as fla's kernels and HIP's one-plane chunks).

    The update is ``S_t = e_t S_{t-1} + k_t delta_t^T`` with ``e_t = exp(g_t)`` and ``delta_t =
    beta_t (v_t - e_t S_{t-1}^T k_t)``, so each state column is bounded in 2-norm by ``A_t = e_t
    A_{t-1} + |k_t| |delta_t|`` (``A_0`` the initial columns' norms): A bounds every state, every
    in-chunk partial sum and, through it, every term of the chunked form. An error ``dS`` in the
    state becomes ``e_t (I - beta_t k_t k_t^T) dS``, whose 2-norm grows by at most ``e_t max(1,
    |1 - beta_t |k_t|^2|)`` (1 with L2-normalised keys and beta in [0, 2]): errors made at one
    token are carried, never amplified, when the rule is contractive. Each token adds a
    rounding error in its delta of ``rho`` eps32 times ``beta (|v| + |k| e A_{t-1})`` -- its
    dot products of up to ``Dk`` (state read) plus ``chunk_size`` (the triangular solve: the
    solve's inverse is the recurrence itself, so an error in one row reaches the later rows
    through the same contractive map) terms, the L2 norm and scale (Dk / 2 + a few), the
    products and sums (16); each term of a dot within 2 eps32 (tensor cores' tf32x3 splits each
    product into three, dropping a 2^-22 part, and may truncate as they accumulate; HIP's chunked
    prefill splits fp32 operands into three bf16 parts, 3 or 6 products a term, within the same),
    so ``rho = 2 (Dk + 2 chunk) + 16`` -- and the state formed at a chunk's end adds ``rho``
    eps32 of ``A``, a state formed token by token 6 eps32 of ``A`` a token (the decay, its exp,
    the outer product and the sum, each rounded once; added at every token, so that the bound
    of any chunk size also covers the recurrence, which HIP's prefill scan runs whatever the
    chunk size). In chunks the decays are ``exp(c_i - c_j)`` of fp32 cumulative sums over the chunk,
    whose exponents are off by up to ``(chunk + 2) eps32 (|c_i| + |c_j|)``: ``rho`` adds ``2 (chunk
    + 2) G`` with ``G`` the chunk's sum of |g|. The carried error ``E_t = growth_t E_{t-1} + rho
    (|k_t| m_t + [chunk end] A_t) + 6 A_t`` then bounds the state's column error, the output's
    ``|q_t| (E_t + rho A_t)`` eps32 (q scaled), the final state's ``(E_T + rho A_T)`` eps32. Outputs
    of fp16 / bf16 add the rounding to v's dtype, one ulp (Triton's interpreter truncates) at
    ``|exact| + bound``. ``gates = (a_neg, dt_bias)``: g and beta are the raw a and b, the gates'
    fp32 errors added (:func:`check_gated_delta_step_case`).

    A g below ``G_FLOOR`` (-inf, -1e30: a full forget) is computed as ``G_FLOOR``: its fp32 exp
    is 0, within 2^-158 of the exact ``exp(g)`` (far below fp32's smallest subnormal); the exact
    recurrence takes exp of the g given, and ``G`` the floored ``|g|``, which is what the chunks'
    cumulative sums hold. A NaN g has no bound (o from its token on is NaN):
    :func:`check_hostile_decays` holds what comes before it.
    """
    _, _, o_bound, s_bound = _exact_and_bounds(
        q, k, v, g, beta, state, scale, l2norm_qk, chunk_size, gates, operands
    )
    return o_bound, s_bound


def gated_delta_exact_and_tolerance(
    q,
    k,
    v,
    g,
    beta,
    state=None,
    scale=None,
    l2norm_qk=True,
    chunk_size=1,
    gates=None,
    operands="fp32",
):
    """:func:`gated_delta_exact` and :func:`gated_delta_tolerance` in one f64 pass:
    ``(o, final_state, o_bound, state_bound)``."""
    return _exact_and_bounds(q, k, v, g, beta, state, scale, l2norm_qk, chunk_size, gates, operands)


#: bf16's unit roundoff: a value rounded to nearest bf16 is within U_BF16 of itself, relatively
U_BF16 = 2.0**-8


def bf16_operand_terms(qd, kd, vd, gd, bd, state, carried, start, end):
    """The error terms of one chunk (tokens ``start .. end - 1``) of a chunked form whose fp32
    operands are each rounded to bf16 before their products (fp32 sums; bf16 inputs, which are
    exact), derived to first order in ``u`` = :data:`U_BF16` (round to nearest; each rounding
    within ``u`` of its value while it is a normal number -- below 2^-126 the error is absolute,
    as in the fp32 terms) for the two dataflows ftlab runs. Per value head, with ``S`` the exact
    state at the chunk's start and the computed one within ``E_j = carried`` of it in each
    column's 2-norm, ``e_i = exp(c_i)`` (c the chunk's cumulative sum of g), ``k_i, q_i`` the
    normalised rows (q scaled), ``ab = (I + L)^-1 diag(beta)``, ``attn_il = (q_i . k_l) e^(c_i -
    c_l)`` (l <= i), elementwise absolute values ``|.|``, ``m_ij = (|K| |S|)_ij + |k_i| E_j``
    (which bounds ``sum_d |k_id| |S~_dj|`` for the computed ``S~``), ``r = |V| + e m`` (which
    bounds R) and ``y = |ab| r`` (``|X| <= y`` for the chunk's deltas X):

    - HIP's one-plane chunks (``X = ab R``, ``R = V - e k S``): S rounded moves R by ``u e m``,
      R's own rounding by ``u r``, so R is within ``2 u r`` and X (ab rounded too) within ``3 u
      y``; o (S, attn and X rounded) within ``u e_i (|Q| |S| + |q_i| E)_ij + 5 u (|attn| y)_ij``;
      the state's new part ``sum_l k_l e^(c_last - c_l) X_l`` (that factor times X rounded)
      within ``4 u z`` componentwise, ``z = |K|^T (e^(c_last - c) y)``;
    - the WY form (Triton's: ``W = A diag(beta e^c) K`` and ``U = A diag(beta) V``, each from two
      rounded operands and kept in bf16 (rounded once more), ``X = U - W S``, kept in bf16 for
      the output): ``|W| <= |ab| diag(e) |K|``, so W S is within ``4 u y`` (S rounded too) and U
      within ``3 u y``: X within ``7 u y``; o within ``u e_i (|Q| |S| + |q_i| E)_ij + 9 u (|attn|
      y)_ij`` (attn and X rounded), the state's new part within ``8 u z``.

    Returned, the larger of each (one bound holds both): ``lo [B, Hv, n, Dv]`` (o's local term)
    and ``ls [B, Hv, Dv]`` (the 2-norm of z's columns times 8u: the state's, carried to later
    chunks as the fp32 terms' state error is). Products of two roundings are left to the caller's
    factor. f64 tensors: ``qd, kd [B, T, Hv, Dk]`` (normalised, q scaled, repeated to the value
    heads), ``vd [B, T, Hv, Dv]``, ``gd, bd [B, T, Hv]``, ``state [B, Hv, Dk, Dv]``, ``carried
    [B, Hv, Dv]``."""
    u = U_BF16
    c = gd[:, start:end].cumsum(1).transpose(1, 2)  # [B, Hv, n]
    bt = bd[:, start:end].transpose(1, 2)
    kc, qc, vc = (x[:, start:end].transpose(1, 2) for x in (kd, qd, vd))  # [B, Hv, n, D]
    n = end - start
    rows = torch.arange(n)
    diff = c[..., :, None] - c[..., None, :]  # c_i - c_l
    decay = torch.where(rows[:, None] > rows[None, :], diff, -torch.inf).exp()  # strictly lower
    # and the diagonal
    decay_on = torch.where(rows[:, None] >= rows[None, :], diff, -torch.inf).exp()
    eye = torch.eye(n, dtype=torch.float64)
    lmat = bt[..., :, None] * (kc @ kc.transpose(-1, -2)) * decay
    ab = torch.linalg.solve_triangular(
        eye + lmat, eye.expand_as(lmat), upper=False, unitriangular=True
    )
    ab = ab * bt[..., None, :]
    e, sabs, held = c.exp()[..., None], state.abs(), carried[:, :, None, :]
    m = kc.abs() @ sabs + kc.norm(dim=-1, keepdim=True) * held
    y = ab.abs() @ (vc.abs() + e * m)
    attn = (qc @ kc.transpose(-1, -2)) * decay_on
    lo = u * e * (qc.abs() @ sabs + qc.norm(dim=-1, keepdim=True) * held) + 9 * u * (attn.abs() @ y)
    z = kc.abs().transpose(-1, -2) @ ((c[..., -1:] - c).exp()[..., None] * y)  # [B, Hv, Dk, Dv]
    return lo, 8 * u * z.norm(dim=-2)


def _exact_and_bounds(
    q, k, v, g, beta, state, scale, l2norm_qk, chunk, gates=None, operands="fp32"
):
    if operands not in ("fp32", "bf16"):
        raise ValueError(f"operands must be 'fp32' or 'bf16', got {operands!r}")
    qd, kd, vd = q.double().cpu(), k.double().cpu(), v.double().cpu()
    gd, bd = g.double().cpu(), beta.double().cpu()
    gate_err = None
    # g and beta are the raw a and b: the gates exact, their fp32 error bounded
    if gates is not None:
        a_neg, dt_bias = (x.double().cpu() for x in gates)
        x = gd + dt_bias
        sp = torch.nn.functional.softplus(x)
        # g's error, beta's relative, in eps32
        gate_err = (
            a_neg.abs() * (4 + 2 * sp + x.abs()),
            4 + bd.abs(),
        )
        gd, bd = a_neg * sp, torch.sigmoid(bd)
    gf = gd.clamp(min=G_FLOOR)  # g floored, as the chunks' cumulative sums take it
    b, t, hk, dk = qd.shape
    hv, dv = vd.shape[-2:]
    scale = dk**-0.5 if scale is None else scale
    if l2norm_qk:
        qd = qd * torch.rsqrt((qd * qd).sum(-1, keepdim=True) + L2NORM_EPS)
        kd = kd * torch.rsqrt((kd * kd).sum(-1, keepdim=True) + L2NORM_EPS)
    qd = (qd * scale).repeat_interleave(hv // hk, dim=2)
    kd = kd.repeat_interleave(hv // hk, dim=2)
    s = (
        torch.zeros(b, hv, dk, dv, dtype=torch.float64)
        if state is None
        else state.double().cpu().clone()
    )
    amag = s.norm(dim=-2)
    err = torch.zeros_like(amag)
    o = torch.empty(b, t, hv, dv, dtype=torch.float64)
    o_bound = torch.empty_like(o)
    base = 2 * (dk + 2 * chunk) + 16
    bf16 = operands == "bf16"
    err_bf = torch.zeros_like(amag)  # the bf16 roundings' state error (column 2-norms), carried
    for i in range(t):
        start = i - i % chunk
        gsum = gf[:, start : start + chunk].abs().sum(1) if chunk > 1 else 0 * gf[:, 0]
        rho = (base + 2 * (chunk + 2) * gsum)[..., None]
        # the computed state is within EPS32 (err + rho A) + err_bf of s, per column
        if bf16 and i == start:
            lo, ls = bf16_operand_terms(
                qd,
                kd,
                vd,
                gf,
                bd,
                s,
                EPS32 * (err + rho * amag) + err_bf,
                start,
                min(start + chunk, t),
            )
        e = gd[:, i].exp()[..., None]
        kt, qt, bt = kd[:, i], qd[:, i], bd[:, i, :, None]
        knorm = kt.norm(dim=-1, keepdim=True)
        decayed = s * e[..., None]
        delta = bt * (vd[:, i] - (decayed * kt[..., None]).sum(-2))
        s = decayed + kt[..., None] * delta[..., None, :]
        m = bt * (vd[:, i].abs() + knorm * e * amag)
        # the gates' errors: g's, a decay error of the state carried through (I - beta k k^T);
        # beta's, of the delta
        gates_term = (
            0.0
            if gate_err is None
            else (
                gate_err[0][:, i, :, None]
                * e
                * amag
                * torch.clamp((1 - bt * knorm**2).abs(), min=1.0)
                + gate_err[1][:, i, :, None] * knorm * m
            )
        )
        amag = e * amag + knorm * delta.abs()
        growth = e * torch.clamp((1 - bt * knorm**2).abs(), min=1.0)
        end = (i % chunk == chunk - 1) or i == t - 1
        err = growth * err + rho * (knorm * m + (amag if end else 0.0)) + 6 * amag
        err = err + gates_term
        o[:, i] = (s * qt[..., None]).sum(-2)
        o_bound[:, i] = EPS32 * qt.norm(dim=-1, keepdim=True) * (err + rho * amag)
        if bf16:
            err_bf = growth * err_bf
            o_bound[:, i] += qt.norm(dim=-1, keepdim=True) * err_bf + lo[:, :, i - start]
            if end:
                err_bf = err_bf + ls
    s_total = EPS32 * (err + rho * amag) + err_bf if t else torch.zeros_like(amag)
    if bf16:  # products of two or more roundings, each within u of 1
        o_bound, s_total = (1 + 16 * U_BF16) * o_bound, (1 + 16 * U_BF16) * s_total
    s_bound = s_total[..., None, :].expand(b, hv, dk, dv)
    if v.dtype != torch.float32:
        o_bound = o_bound + ulp((o.abs() + 2 * o_bound).float(), v.dtype).double()
    return o, s, o_bound.float(), s_bound.float().contiguous()

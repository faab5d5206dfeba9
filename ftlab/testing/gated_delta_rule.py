"""Tolerance and case checks of the gated delta rule (``ops.gated_delta_rule``,
``ops.gated_delta_step``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftlab import ops
from ftlab.reference.gated_delta_rule import G_FLOOR, L2NORM_EPS
from ftlab.testing.common import assert_within, backends_for, ulp

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
    chunk size). In chunks the decays are ``exp(c_i - c_j)`` of fp32
    cumulative sums over the chunk, whose exponents are off by up to ``(chunk + 2) eps32 (|c_i|
    + |c_j|)``: ``rho`` adds ``2 (chunk + 2) G`` with ``G`` the chunk's sum of |g|. The carried
    error ``E_t = growth_t E_{t-1} + rho (|k_t| m_t + [chunk end] A_t) + 6 A_t`` then bounds the
    state's column error, the output's ``|q_t| (E_t + rho A_t)`` eps32 (q scaled), the final
    state's ``(E_T + rho A_T)`` eps32. Outputs of fp16 / bf16 add the rounding to v's dtype,
    one ulp (Triton's interpreter truncates) at ``|exact| + bound``. ``gates = (a_neg, dt_bias)``:
    g and beta are the raw a and b, the gates' fp32 errors added
    (:func:`check_gated_delta_step_case`).

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
    q, k, v, g, beta, state=None, scale=None, l2norm_qk=True, chunk_size=1, operands="fp32"
):
    """:func:`gated_delta_exact` and :func:`gated_delta_tolerance` in one f64 pass:
    ``(o, final_state, o_bound, state_bound)``."""
    return _exact_and_bounds(q, k, v, g, beta, state, scale, l2norm_qk, chunk_size, None, operands)


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
    decay_on = torch.where(
        rows[:, None] >= rows[None, :], diff, -torch.inf
    ).exp()  # and the diagonal
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
    if (
        gates is not None
    ):  # g and beta are the raw a and b: the gates exact, their fp32 error bounded
        a_neg, dt_bias = (x.double().cpu() for x in gates)
        x = gd + dt_bias
        sp = torch.nn.functional.softplus(x)
        gate_err = (
            a_neg.abs() * (4 + 2 * sp + x.abs()),
            4 + bd.abs(),
        )  # g's error, beta's relative, in eps32
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
        if (
            bf16 and i == start
        ):  # the computed state is within EPS32 (err + rho A) + err_bf of s, per column
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


def _assert_close(
    name: str, what: str, got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor
) -> None:
    assert got.shape == want.shape, (
        f"{name}: {what} shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    )
    last = got.shape[-1]
    assert_within(
        name, what, got.reshape(-1, last), want.reshape(-1, last), bound.reshape(-1, last)
    )


def check_gated_delta_rule_case(
    q,
    k,
    v,
    g,
    beta,
    state=None,
    scale=None,
    l2norm_qk=True,
    chunk_size=64,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
    precision: str = "fp32",
) -> None:
    """Every backend's gated_delta_rule (the reference included) against the exact recurrence
    within :func:`gated_delta_tolerance` (of ``precision``'s operands), and against the reference
    within twice that; the input state is left as it was."""
    exact_o, exact_s, o_bound, s_bound = _exact_and_bounds(
        q, k, v, g, beta, state, scale, l2norm_qk, chunk_size, None, precision
    )
    kw = {"scale": scale, "l2norm_qk": l2norm_qk, "chunk_size": chunk_size, "precision": precision}
    want_o, want_s = ops.gated_delta_rule(q, k, v, g, beta, state=state, **kw, backend="reference")
    _assert_close("reference", "o", want_o, exact_o.to(v.dtype), o_bound)
    _assert_close("reference", "final_state", want_s, exact_s.float(), s_bound)
    for name in backends_for("gated_delta_rule", torch.device(device), q.dtype, backends):
        if name == "reference":
            continue
        dev_state = None if state is None else state.to(device)
        before = None if state is None else dev_state.clone()
        moved = (x.to(device) for x in (q, k, v, g, beta))
        got_o, got_s = ops.gated_delta_rule(*moved, state=dev_state, **kw, backend=name)
        assert got_o.dtype == v.dtype and got_s.dtype == torch.float32
        _assert_close(name, "o", got_o, want_o, 2 * o_bound)
        _assert_close(name, "final_state", got_s, want_s, 2 * s_bound)
        if state is not None:
            assert torch.equal(dev_state, before), f"{name}: the input state was modified"


#: the hostile log decays of :func:`check_hostile_decays`
HOSTILE_DECAYS = ("nan", "-inf", "-1e30")


def check_hostile_decays(
    run, case, hostile, *, chunk_size, operands="fp32", scale=None, l2norm_qk=True, name="prefill"
) -> None:
    """A prefill ``run(q, k, v, g, beta, state) -> (o, final_state)`` (``ops.gated_delta_rule``'s
    arguments and results, any backend and chunk form) on ``case = (q, k, v, g, beta, state)``
    under ``hostile``, one of :data:`HOSTILE_DECAYS`, in value heads 0 and 1 (``Hv >= 2``; every
    sequence):

    - ``"nan"``: g NaN at token ``p = min(5, T - 1)`` of head 0 and ``+inf`` at token ``2T // 3``
      of head 1. Against a clean run of the same inputs, each head's o before its token is the
      same bits, and from it on, with the head's final state, NaN (not finite, for ``+inf``); the
      other heads are the same bits.
    - ``"-inf"``, ``"-1e30"``: a full forget at token ``T // 2`` of head 0 and at token 0 of head
      1, within :func:`gated_delta_tolerance` (``chunk_size``, ``operands``, ``scale``,
      ``l2norm_qk``) of the exact recurrence; and what came before a forget weighs nothing: with
      the initial state and head 0's values before its forget changed, head 0's o from its
      forget on, all of head 1's and both final states are the same bits.
    """
    if hostile not in HOSTILE_DECAYS:
        raise ValueError(f"hostile must be one of {HOSTILE_DECAYS}, got {hostile!r}")
    q, k, v, g, beta, state = case
    t, hv = g.shape[1], g.shape[2]
    assert hv >= 2 and t >= 1, f"{name}: the hostile cases need Hv >= 2, got g {tuple(g.shape)}"
    if hostile == "nan":
        clean_o, clean_s = run(q, k, v, g, beta, state)
        bad = g.clone()
        marks = ((0, min(5, t - 1), float("nan")), (1, (2 * t) // 3, float("inf")))
        for h, p, x in marks:
            bad[:, p, h] = x
        o, s = run(q, k, v, bad, beta, state)
        for h, p, x in marks:
            what = f"{name}: g = {x} at token {p} of head {h}"
            assert torch.equal(o[:, :p, h], clean_o[:, :p, h]), f"{what}: o before it changed"
            after = o[:, p:, h].isnan() if x != x else ~o[:, p:, h].isfinite()
            assert bool(after.all()), f"{what}: o finite at or after it"
            assert not bool(s[:, h].isfinite().any()), f"{what}: the final state finite"
        rest = (o[:, :, 2:], clean_o[:, :, 2:]), (s[:, 2:], clean_s[:, 2:])
        assert all(torch.equal(a, b) for a, b in rest), f"{name}: the other heads changed"
        return
    p = t // 2
    forget = g.clone()
    forget[:, p, 0] = forget[:, 0, 1] = float(hostile)
    o1, s1 = run(q, k, v, forget, beta, state)
    exact_o, exact_s, o_bound, s_bound = _exact_and_bounds(
        q, k, v, forget, beta, state, scale, l2norm_qk, chunk_size, None, operands
    )
    _assert_close(name, f"o with g = {hostile}", o1, exact_o.to(v.dtype), o_bound)
    _assert_close(name, f"final_state with g = {hostile}", s1, exact_s.float(), s_bound)
    v2 = v.clone()
    v2[:, :p, 0] = -v[:, :p, 0]
    o2, s2 = run(q, k, v2, forget, beta, torch.ones_like(s1) if state is None else -2 * state)
    kept = (o1[:, p:, 0], o2[:, p:, 0]), (o1[:, :, 1], o2[:, :, 1]), (s1[:, :2], s2[:, :2])
    assert all(torch.equal(a, b) for a, b in kept), f"{name}: what came before a forget weighed in"


def check_gated_delta_step_case(
    q,
    k,
    v,
    g,
    beta,
    state,
    scale=None,
    l2norm_qk=True,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
    gates=None,
    reset=None,
) -> None:
    """Every backend's gated_delta_step (one token, ``q [B, Hk, Dk]`` ...) against the exact
    step within :func:`gated_delta_tolerance` (chunk 1), and against the reference within twice
    that: the returned output and the state updated in place. ``gates = (a_neg, dt_bias)``: g
    and beta are the raw a and b (the exact gates in f64; the bound adds their fp32 errors, g
    within ``|a_neg| (4 + 2 softplus(x) + |x|)`` eps32 with ``x = a + dt_bias`` -- softplus as
    ``log(1 + exp(x))`` rounds ``1 + exp(x)`` once -- and beta within ``(4 + |b|)`` eps32 of
    itself: an exp whose argument is rounded first, as Triton's, is off by ``|b|`` eps32);
    ``reset`` (bool ``[B]``): those rows start from zeros, whatever their state holds."""
    seq = [x[:, None] for x in (q, k, v, g, beta)]
    start = (
        state if reset is None else torch.where(reset[:, None, None, None], torch.zeros(()), state)
    )
    exact_o, exact_s, o_bound, s_bound = _exact_and_bounds(*seq, start, scale, l2norm_qk, 1, gates)
    o_bound = o_bound[:, 0]
    kw = {"scale": scale, "l2norm_qk": l2norm_qk}
    if gates is not None or reset is not None:
        kw.update(gates=gates, reset=reset)
    want_s = state.clone()
    want_o = ops.gated_delta_step(q, k, v, g, beta, want_s, **kw, backend="reference")
    _assert_close("reference", "o", want_o, exact_o[:, 0].to(v.dtype), o_bound)
    _assert_close("reference", "state", want_s, exact_s.float(), s_bound)
    for name in backends_for("gated_delta_step", torch.device(device), q.dtype, backends):
        if name == "reference":
            continue
        got_s = state.to(device).clone()
        moved = {**kw}
        if gates is not None:
            moved["gates"] = tuple(x.to(device) for x in gates)
        if reset is not None:
            moved["reset"] = reset.to(device)
        got_o = ops.gated_delta_step(
            *(x.to(device) for x in (q, k, v, g, beta)), got_s, **moved, backend=name
        )
        assert got_o.dtype == v.dtype
        _assert_close(name, "o", got_o, want_o, 2 * o_bound)
        _assert_close(name, "state", got_s, want_s, 2 * s_bound)


def _assert_accuracy(
    o, state, exact_o, exact_s, state_rtol: float, o_factor: float, truncating: bool = False
) -> None:
    """The final state within ``state_rtol`` relative (Frobenius) error of the exact one, and a
    16-bit ``o`` within ``o_factor`` times the exact output's own rounding to o's dtype (norms;
    ``truncating``: toward zero, as Triton's interpreter casts, else to nearest)."""
    s_err = float((state.double().cpu() - exact_s).norm() / exact_s.norm().clamp(min=1e-300))
    assert s_err <= state_rtol, f"final state: relative error {s_err:.3g} > {state_rtol:g}"
    if o.dtype in (torch.float16, torch.bfloat16):
        rounded = exact_o.to(o.dtype).double()
        if truncating:  # bf16 only: the top half of fp32's bits
            assert o.dtype == torch.bfloat16, "truncation is modelled for bf16 outputs"
            rounded = (exact_o.float().view(torch.int32) & -65536).view(torch.float32).double()
        rounding = float((rounded - exact_o).norm())
        o_err = float((o.double().cpu() - exact_o).norm())
        assert o_err <= o_factor * rounding + 1e-300, (
            f"o: error {o_err:.4g} against {rounding:.4g} from rounding alone (allowed "
            f"{o_factor:g}x)"
        )


#: the state's relative (Frobenius) error that a chunked kernel carrying fp32 operands as three
#: bf16 parts stays under: such kernels reach ~5e-7 on the host harness's cases; two parts reach
#: ~4e-6, one part ~3e-3
THREE_PLANE_STATE_RTOL = 1e-5


def assert_three_plane_accuracy(
    o: torch.Tensor, state: torch.Tensor, exact_o: torch.Tensor, exact_s: torch.Tensor
) -> None:
    """An fp32-class chunked prefill (HIP's on the matrix cores, its fp32 operands in three bf16
    parts) against the exact recurrence (:func:`gated_delta_exact`), tighter than the derived
    bound, which allows far less precise kernels (one bf16 part of the state passes it on most
    shapes): the final state within :data:`THREE_PLANE_STATE_RTOL` relative error (Frobenius
    norm), and ``o`` (fp16 / bf16) no further from the exact output than the exact output
    rounded to o's dtype is, within 2% (in norm; one bf16 part gives 1.5-2.4x)."""
    _assert_accuracy(o, state, exact_o, exact_s, THREE_PLANE_STATE_RTOL, 1.02)


#: the state's relative (Frobenius) error that a chunked kernel rounding each fp32 operand to bf16
#: once (one plane) stays under: HIP's one-plane chunks reach 2-3.5e-3 on the host harness's cases
#: (a 1% error in the state update's factor gives 1e-2)
ONE_PLANE_STATE_RTOL = 6e-3


def assert_one_plane_accuracy(
    o: torch.Tensor,
    state: torch.Tensor,
    exact_o: torch.Tensor,
    exact_s: torch.Tensor,
    truncating: bool = False,
) -> None:
    """A bf16-operand chunked prefill (HIP's one-plane chunks, ``precision="bf16"``) against the
    exact recurrence, tighter than its derived bound (``gated_delta_tolerance(...,
    operands="bf16")``, which must cover every worst case): the final state within
    :data:`ONE_PLANE_STATE_RTOL` relative error (Frobenius norm), and ``o`` (fp16 / bf16) no
    further from the exact output than 3x the exact output's own rounding to o's dtype (in
    norm; the host harness's cases give 1.5-2.4x; ``truncating``: a bf16 o cast toward zero, as
    Triton's interpreter does, against the exact output truncated)."""
    _assert_accuracy(o, state, exact_o, exact_s, ONE_PLANE_STATE_RTOL, 3.0, truncating)

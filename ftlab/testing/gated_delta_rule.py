"""Case functions of the gated delta rule (``ops.gated_delta_rule``, ``ops.gated_delta_step``):
inputs as the models make them, every backend held to the exact recurrence within the derived
bound (:mod:`ftlab.testing.gated_delta_bounds`), hostile log decays, and the chunked kernels'
accuracy, tighter than the bound."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftlab import ops
from ftlab.testing.common import assert_within, backends_for
from ftlab.testing.gated_delta_bounds import gated_delta_exact_and_tolerance


def gated_delta_inputs(gen, b, t, hk, hv, dk, dv, dtype, *, with_state, decay=1.0):
    """q, k ``[B, T, Hk, Dk]`` and v ``[B, T, Hv, Dv]`` in ``dtype``, g (fp32 log decay <= 0,
    ``decay`` times a softplus) and beta (in (0, 1), ``dtype``) ``[B, T, Hv]``, an fp32 initial
    state ``[B, Hv, Dk, Dv]`` or None (``with_state``), drawn from ``gen`` as the model makes
    them."""
    q = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    k = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    v = torch.randn(b, t, hv, dv, generator=gen).to(dtype)
    g = -decay * torch.nn.functional.softplus(torch.randn(b, t, hv, generator=gen))
    beta = torch.sigmoid(torch.randn(b, t, hv, generator=gen)).to(dtype)
    state = torch.randn(b, hv, dk, dv, generator=gen) * 0.5 if with_state else None
    return q, k, v, g, beta, state


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
    exact_o, exact_s, o_bound, s_bound = gated_delta_exact_and_tolerance(
        q, k, v, g, beta, state, scale, l2norm_qk, chunk_size, operands=precision
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
    exact_o, exact_s, o_bound, s_bound = gated_delta_exact_and_tolerance(
        q, k, v, forget, beta, state, scale, l2norm_qk, chunk_size, operands=operands
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
    exact_o, exact_s, o_bound, s_bound = gated_delta_exact_and_tolerance(
        *seq, start, scale, l2norm_qk, 1, gates=gates
    )
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

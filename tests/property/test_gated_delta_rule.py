"""The gated delta rule (Gated DeltaNet linear attention): every backend against the exact
recurrence and the reference within the derived bound (ftlab.testing.gated_delta_bounds), prefill
and decode, in the Triton interpreter on the CPU and on a GPU; the reference against
transformers' Qwen3-Next functions; the chunked form against the recurrence; the bound against
the usual mistakes; bad arguments name themselves. The kernels' own launch forms:
test_gated_delta_rule_kernels.py."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import ops
from ftlab.reference import gated_delta_rule as ref
from ftlab.testing.gated_delta_rule import gated_delta_inputs as _inputs


@st.composite
def rule_case(
    draw,
    ts=(1, 3, 64, 65, 130),
    dims=(16, 32, 64),
    dtypes=(torch.float32, torch.bfloat16, torch.float16),
):
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    b = draw(st.sampled_from([1, 2]))
    t = draw(st.sampled_from(ts))
    hk = draw(st.sampled_from([1, 2]))
    hv = hk * draw(st.sampled_from([1, 2]))
    dk, dv = draw(st.sampled_from(dims)), draw(st.sampled_from(dims))
    dtype = draw(st.sampled_from(dtypes))
    decay = draw(st.sampled_from([0.01, 1.0, 8.0]))
    case = _inputs(gen, b, t, hk, hv, dk, dv, dtype, with_state=draw(st.booleans()), decay=decay)
    if seed % 4 == 0:  # a full forget in one case of four, by the seed (a draw changes the shapes)
        case[3][:, t // 2, 0] = (float("-inf"), -1e30)[seed // 4 % 2]
    return case, draw(st.sampled_from([16, 32, 64]))


def _model_gates(gen, b, hv, dtypes, state, gates=True, reset=True):
    """The models' decode form: raw a and b (in ``dtypes``' two dtypes; a spread that reaches
    softplus' x > 20 branch), the gates' a_neg = -exp(A_log) with A_log = log U[1, 16] and
    dt_bias, and a reset mask whose rows' state is made NaN / inf garbage (in place) that must
    not be read; each part only when asked (``gates`` False: a and b are g and beta)."""
    a = (torch.randn(b, hv, generator=gen) * 8).to(dtypes[0])
    braw = (torch.randn(b, hv, generator=gen) * 3).to(dtypes[1])
    a_neg = -torch.empty(hv).uniform_(1.0, 16.0, generator=gen)
    dt_bias = torch.randn(hv, generator=gen) * 4
    kw = {}
    if gates:
        kw["gates"] = (a_neg, dt_bias)
    else:  # a log decay <= 0 and a write strength in (0, 1)
        a, braw = (
            -torch.nn.functional.softplus(a.float()).to(dtypes[0]),
            torch.sigmoid(braw.float()).to(dtypes[1]),
        )
    if reset:
        kw["reset"] = torch.rand(b, generator=gen) < 0.5
        state[kw["reset"]] = float("nan")
        state[kw["reset"], 0, 0, 0] = float("inf")
    return a, braw, kw


@st.composite
def step_case(draw, dims=(16, 32, 64), dtypes=(torch.float32, torch.bfloat16, torch.float16)):
    """((q, k, v, g, beta, state), kwargs): the gates and the reset each drawn (_model_gates), a
    and b each in q's dtype or fp32."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    hk = draw(st.sampled_from([1, 2, 4]))
    hv = hk * draw(st.sampled_from([1, 2]))
    b, dk, dv = (
        draw(st.sampled_from([1, 3])),
        draw(st.sampled_from(dims)),
        draw(st.sampled_from(dims)),
    )
    dtype = draw(st.sampled_from(dtypes))
    q, k, v, g, beta, state = _inputs(gen, b, 1, hk, hv, dk, dv, dtype, with_state=True)
    g, beta, kw = g[:, 0], beta[:, 0], {}
    gates, reset = draw(st.booleans()), draw(st.booleans())
    if gates or reset:
        dtypes = (
            draw(st.sampled_from([dtype, torch.float32])),
            draw(st.sampled_from([dtype, torch.float32])),
        )
        g, beta, kw = _model_gates(gen, b, hv, dtypes, state, gates, reset)
    return (q[:, 0], k[:, 0], v[:, 0], g, beta, state), kw


@settings(max_examples=12)
@given(rule_case())
def test_gated_delta_rule_cpu(case):
    (q, k, v, g, beta, state), chunk = case
    ft.check_gated_delta_rule_case(q, k, v, g, beta, state, chunk_size=chunk)


@settings(max_examples=12)
@given(step_case())
def test_gated_delta_step_cpu(case):
    args, kw = case
    ft.check_gated_delta_step_case(*args, **kw)


@pytest.mark.gpu
@settings(max_examples=10, deadline=None)  # every new shape compiles four Triton kernels
@given(rule_case(ts=(1, 63, 64, 200, 1000), dims=(32, 64, 128)))
def test_gated_delta_rule_gpu(case):
    (q, k, v, g, beta, state), chunk = case
    ft.check_gated_delta_rule_case(q, k, v, g, beta, state, chunk_size=chunk, device="cuda")
    if q.dtype == torch.bfloat16 and chunk == 64:  # the chunks with bf16 operands, where they apply
        ft.check_gated_delta_rule_case(
            q, k, v, g, beta, state, chunk_size=chunk, device="cuda", precision="bf16"
        )


@pytest.mark.gpu
@settings(max_examples=12, deadline=None)
@given(step_case(dims=(32, 64, 128)))
def test_gated_delta_step_gpu(case):
    args, kw = case
    ft.check_gated_delta_step_case(*args, **kw, device="cuda")


@pytest.mark.parametrize("hv", [2, 4])
@pytest.mark.parametrize("with_state", [False, True])
def test_reference_matches_transformers(hv, with_state):
    """The reference's chunked form and its recurrence against transformers' Qwen3-Next
    torch_chunk_gated_delta_rule and torch_recurrent_gated_delta_rule (fp32, L2-normalised q
    and k, grouped value heads), within the derived bound of two fp32 computations."""
    tf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    gen = torch.Generator().manual_seed(hv + 10 * with_state)
    q, k, v, g, beta, state = _inputs(
        gen, 2, 100, 2, hv, 32, 16, torch.float32, with_state=with_state
    )
    o_bound, s_bound = ft.gated_delta_tolerance(q, k, v, g, beta, state, chunk_size=64)
    rec_o_bound, rec_s_bound = ft.gated_delta_tolerance(q, k, v, g, beta, state, chunk_size=1)
    for theirs, chunk in (
        (tf.torch_chunk_gated_delta_rule, 64),
        (tf.torch_recurrent_gated_delta_rule, 1),
    ):
        kw = {"chunk_size": 64} if chunk == 64 else {}
        want_o, want_s = theirs(
            q,
            k,
            v,
            g,
            beta,
            initial_state=state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            **kw,
        )
        theirs_o, theirs_s = (o_bound, s_bound) if chunk == 64 else (rec_o_bound, rec_s_bound)
        got_o, got_s = ops.gated_delta_rule(q, k, v, g, beta, state=state, backend="reference")
        for what, got, want, bound in (
            ("o", got_o, want_o, o_bound + theirs_o),
            ("state", got_s, want_s, s_bound + theirs_s),
        ):
            err = (got - want).abs()
            assert bool((err <= bound).all()), (
                f"{theirs.__name__} {what}: max excess {float((err - bound).max())}"
            )
        rec_o, rec_s = ref.gated_delta_rule_recurrent(q, k, v, g, beta, state, 32**-0.5, True)
        for what, got, want, bound in (
            ("o", rec_o, want_o, rec_o_bound + theirs_o),
            ("state", rec_s, want_s, rec_s_bound + theirs_s),
        ):
            err = (got - want).abs()
            assert bool((err <= bound).all()), f"recurrent vs {theirs.__name__} {what}"


def test_chunked_equals_recurrence_without_l2norm():
    """Unnormalised keys (|k| up to about 1.4, beta |k|^2 < 2: still contractive), another
    scale: the chunked reference and the recurrence agree within their two derived bounds."""
    gen = torch.Generator().manual_seed(7)
    q, k, v, g, beta, state = _inputs(gen, 1, 150, 1, 2, 16, 16, torch.float32, with_state=True)
    k = k / 4
    kw = {"scale": 0.3, "l2norm_qk": False}
    o, s = ops.gated_delta_rule(
        q, k, v, g, beta, state=state, chunk_size=32, **kw, backend="reference"
    )
    rec_o, rec_s = ref.gated_delta_rule_recurrent(q, k, v, g, beta, state, 0.3, False)
    o_bound, s_bound = ft.gated_delta_tolerance(q, k, v, g, beta, state, chunk_size=32, **kw)
    r_o_bound, r_s_bound = ft.gated_delta_tolerance(q, k, v, g, beta, state, chunk_size=1, **kw)
    assert bool(((o - rec_o).abs() <= o_bound + r_o_bound).all())
    assert bool(((s - rec_s).abs() <= s_bound + r_s_bound).all())
    exact_o, exact_s = ft.gated_delta_exact(q, k, v, g, beta, state, **kw)
    assert float((o.double() - exact_o).abs().max()) > 0  # fp32 does round
    # a chunk size's bound covers the recurrence too (HIP's prefill scans token by token)
    assert bool(((rec_o.double() - exact_o).abs() <= o_bound).all())
    assert bool(((rec_s.double() - exact_s).abs() <= s_bound).all())


def test_step_continues_the_sequence():
    """Prefill of T tokens then one decode step equals prefill of T + 1 tokens."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, g, beta, _ = _inputs(gen, 2, 9, 2, 4, 16, 32, torch.float32, with_state=False)
    _, s = ops.gated_delta_rule(q[:, :8], k[:, :8], v[:, :8], g[:, :8], beta[:, :8], chunk_size=16)
    o_last = ops.gated_delta_step(q[:, 8], k[:, 8], v[:, 8], g[:, 8], beta[:, 8], s)
    o_all, s_all = ops.gated_delta_rule(q, k, v, g, beta, chunk_size=16)
    o_bound, s_bound = ft.gated_delta_tolerance(q, k, v, g, beta, chunk_size=16)
    assert bool(((o_last - o_all[:, 8]).abs() <= 2 * o_bound[:, 8]).all())
    assert bool(((s - s_all).abs() <= 2 * s_bound).all())


def test_bad_arguments_name_themselves():
    q = torch.randn(1, 4, 2, 16)
    v = torch.randn(1, 4, 4, 8)
    g = -torch.rand(1, 4, 4)
    beta = torch.rand(1, 4, 4)
    with pytest.raises(ValueError, match="k must have q's shape"):
        ops.gated_delta_rule(q, q[:, :, :1], v, g, beta)
    with pytest.raises(TypeError, match="v must have q's dtype"):
        ops.gated_delta_rule(q, q, v.half(), g, beta)
    with pytest.raises(ValueError, match="multiple of"):
        ops.gated_delta_rule(q, q, torch.randn(1, 4, 3, 8), g[..., :3], beta[..., :3])
    with pytest.raises(ValueError, match="g must be"):
        ops.gated_delta_rule(q, q, v, g[..., :2], beta)
    with pytest.raises(TypeError, match="beta must be a floating-point"):
        ops.gated_delta_rule(q, q, v, g, beta.int())
    with pytest.raises(TypeError, match="state must be float32"):
        ops.gated_delta_rule(q, q, v, g, beta, state=torch.zeros(1, 4, 16, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="state must be"):
        ops.gated_delta_rule(q, q, v, g, beta, state=torch.zeros(1, 4, 8, 16))
    with pytest.raises(ValueError, match="chunk_size"):
        ops.gated_delta_rule(q, q, v, g, beta, chunk_size=48)
    with pytest.raises(
        ValueError, match=r"precision must be one of \('fp32', 'bf16'\), got 'fp16'"
    ):
        ops.gated_delta_rule(q, q, v, g, beta, precision="fp16")
    with pytest.raises(TypeError, match="l2norm_qk"):
        ops.gated_delta_rule(q, q, v, g, beta, l2norm_qk=1)
    with pytest.raises(ValueError, match="scale"):
        ops.gated_delta_rule(q, q, v, g, beta, scale=float("nan"))
    state = torch.zeros(1, 4, 8, 16).transpose(-1, -2)
    with pytest.raises(ValueError, match="state must be contiguous"):
        ops.gated_delta_step(q[:, 0], q[:, 0], v[:, 0], g[:, 0], beta[:, 0], state)
    with pytest.raises(ValueError, match="q must be 3-D"):
        ops.gated_delta_step(q, q[:, 0], v[:, 0], g[:, 0], beta[:, 0], state.contiguous())
    step = (q[:, 0], q[:, 0], v[:, 0], g[:, 0], beta[:, 0], state.contiguous())
    gates = (-torch.ones(4), torch.zeros(4))
    with pytest.raises(TypeError, match="gates must be None or a tuple"):
        ops.gated_delta_step(*step, gates=[*gates])
    with pytest.raises(TypeError, match="gates' a_neg must be float32"):
        ops.gated_delta_step(*step, gates=(gates[0].double(), gates[1]))
    with pytest.raises(ValueError, match=r"gates' dt_bias must be \[4\] \(Hv\)"):
        ops.gated_delta_step(*step, gates=(gates[0], torch.zeros(2)))
    with pytest.raises(TypeError, match="g must be float32 or q's dtype"):
        ops.gated_delta_step(*step[:3], g[:, 0].half(), *step[4:], gates=gates)
    with pytest.raises(TypeError, match="reset must be a bool tensor"):
        ops.gated_delta_step(*step, reset=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"reset must be \[B=1\], got shape \(2,\)"):
        ops.gated_delta_step(*step, reset=torch.zeros(2, dtype=torch.bool))


def test_gates_and_reset_are_the_models_arithmetic():
    """In the reference, the step with gates is bit for bit the step given step_gates' g and beta
    (the formula the layers used before it, held to transformers by the model oracle tests), and
    reset rows are a step from zeros, whatever NaN their state held."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, _, _, state = _inputs(gen, 4, 1, 2, 4, 16, 16, torch.float32, with_state=True)
    q, k, v = q[:, 0], k[:, 0], v[:, 0]
    clean = state.clone()
    a, braw, kw = _model_gates(gen, 4, 4, (torch.float32, torch.float32), state)
    kw["reset"] = torch.tensor([True, False, True, False])  # a mix, whatever the draw
    state = torch.where(kw["reset"][:, None, None, None], torch.full((), float("nan")), clean)
    g, beta = ref.step_gates(a, braw, *kw["gates"])
    fused = state.clone()
    o = ops.gated_delta_step(q, k, v, a, braw, fused, **kw, backend="reference")
    plain = torch.where(kw["reset"][:, None, None, None], torch.zeros(()), state)
    o2 = ops.gated_delta_step(q, k, v, g, beta, plain, backend="reference")
    assert torch.equal(o, o2) and torch.equal(fused, plain) and bool(torch.isfinite(fused).all())


def test_gate_bound_catches_gates_rounded_to_bf16():
    """The bound with the gates' errors (gates=) is tight enough to fail gates off by a bf16
    rounding -- far less than a dt_bias left out -- and holds the reference's own gated step."""
    gen = torch.Generator().manual_seed(9)
    q, k, v, _, _, state = _inputs(gen, 2, 1, 2, 2, 16, 16, torch.float32, with_state=True)
    a, braw = torch.randn(2, 1, 2, generator=gen) * 4, torch.randn(2, 1, 2, generator=gen) * 3
    gates = (-torch.empty(2).uniform_(1.0, 16.0, generator=gen), torch.randn(2, generator=gen) * 2)
    g, beta = (x.bfloat16().float() for x in ref.step_gates(a[:, 0], braw[:, 0], *gates))
    wrong = ops.gated_delta_step(
        q[:, 0], k[:, 0], v[:, 0], g, beta, state.clone(), backend="reference"
    )
    exact, _ = ft.gated_delta_exact(q, k, v, a, braw, state, gates=gates)
    bound, _ = ft.gated_delta_tolerance(q, k, v, a, braw, state, gates=gates)
    assert bool(((wrong.double() - exact[:, 0]).abs() > bound[:, 0].double()).any())
    right = ops.gated_delta_step(
        q[:, 0],
        k[:, 0],
        v[:, 0],
        a[:, 0],
        braw[:, 0],
        state.clone(),
        gates=gates,
        backend="reference",
    )
    assert bool(((right.double() - exact[:, 0]).abs() <= bound[:, 0].double()).all())


def test_input_state_untouched_and_empty_sequences():
    gen = torch.Generator().manual_seed(1)
    q, k, v, g, beta, state = _inputs(gen, 1, 5, 1, 1, 16, 16, torch.float32, with_state=True)
    before = state.clone()
    _, s = ops.gated_delta_rule(q, k, v, g, beta, state=state)
    assert torch.equal(state, before) and s.data_ptr() != state.data_ptr()
    o, s = ops.gated_delta_rule(q[:, :0], k[:, :0], v[:, :0], g[:, :0], beta[:, :0], state=state)
    assert o.shape == (1, 0, 1, 16) and torch.equal(s, state) and s.data_ptr() != state.data_ptr()


@pytest.mark.parametrize("decay", [0.01, 1.0, 8.0])
def test_bound_catches_mistakes(decay):
    """The derived bound is tight enough to fail the usual mistakes: the decay one token off,
    value heads mapped to key heads modulo Hk (not grouped), beta squared, g off by 5%."""
    gen = torch.Generator().manual_seed(11)
    q, k, v, g, beta, state = _inputs(
        gen, 1, 70, 2, 4, 32, 32, torch.float32, with_state=True, decay=decay
    )
    exact_o, _ = ft.gated_delta_exact(q, k, v, g, beta, state)
    o_bound, _ = ft.gated_delta_tolerance(q, k, v, g, beta, state, chunk_size=64)
    regrouped = torch.cat([v[:, :, 0::2], v[:, :, 1::2]], 2)
    for what, args in (
        ("g shifted", (q, k, v, g.roll(1, 1), beta)),
        ("heads modulo", (q, k, regrouped, g, beta)),
        ("beta squared", (q, k, v, g, beta**2)),
        ("g * 1.05", (q, k, v, g * 1.05, beta)),
    ):
        o, _ = ops.gated_delta_rule(*args, state=state, backend="reference")
        assert not bool(((o.double() - exact_o).abs() <= 2 * o_bound).all()), what

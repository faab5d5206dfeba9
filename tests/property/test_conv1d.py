"""causal_conv1d and causal_conv1d_update (the gated deltanet's causal depthwise conv): every
backend against the reference within the derived bound (new states bit for bit), on strided
views of a fused projection, with and without carried state, lengths, bias and SiLU, in the
Triton interpreter on the CPU and on a GPU; the reference is the model's F.conv1d; prefill in
chunks and decode steps chain to one prefill; bad arguments name themselves and write nothing."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import backends, ops

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _fused_view(gen, b, t, c, dtype, scale, view):
    """x [B, T, C]: a slice of a wider projection (the model's layout) or contiguous."""
    extra = 5 if view else 0
    full = (torch.randn(b, t, c + extra, generator=gen) * scale).to(dtype)
    return full[:, :, 2 : 2 + c] if view else full


@st.composite
def conv1d_case(draw, dtypes=DTYPES):
    b = draw(st.sampled_from([1, 2, 3]))
    t = draw(st.sampled_from([1, 2, 3, 5, 17, 40]))
    c = draw(st.sampled_from([1, 3, 8, 37, 70]))
    w = draw(st.sampled_from([2, 3, 4]))
    dtype = draw(st.sampled_from(dtypes))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 30.0]))
    x = _fused_view(gen, b, t, c, dtype, scale, draw(st.booleans()))
    weight = torch.randn(c, w, generator=gen).to(draw(st.sampled_from([torch.float32, dtype])))
    bias = torch.randn(c, generator=gen).to(weight.dtype) if draw(st.booleans()) else None
    state = (torch.randn(b, c, w - 1, generator=gen) * scale).to(dtype) if draw(st.booleans()) else None
    lengths = None
    if draw(st.booleans()):
        lengths = torch.randint(0, t + 1, (b,), generator=gen).to(draw(st.sampled_from([torch.int32, torch.int64])))
    return x, weight, bias, state, lengths, draw(st.sampled_from(["silu", None]))


@st.composite
def conv1d_update_case(draw, dtypes=DTYPES):
    b = draw(st.sampled_from([1, 2, 5]))
    c = draw(st.sampled_from([1, 3, 8, 37, 200]))
    w = draw(st.sampled_from([2, 3, 4]))
    dtype = draw(st.sampled_from(dtypes))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 30.0]))
    x = _fused_view(gen, b, 1, c, dtype, scale, draw(st.booleans()))[:, 0, :]
    weight = torch.randn(c, w, generator=gen)
    bias = torch.randn(c, generator=gen) if draw(st.booleans()) else None
    pool = (torch.randn(b + 1, c + 2, w - 1, generator=gen) * scale).to(dtype)
    state = pool[1:, 1 : c + 1] if draw(st.booleans()) else pool[:b, :c].contiguous()  # a slot view of a cache
    return x, weight, bias, state, draw(st.sampled_from(["silu", None]))


@given(conv1d_case())
def test_causal_conv1d_cpu(case):
    ft.check_causal_conv1d_case(*case)


@given(conv1d_update_case())
def test_causal_conv1d_update_cpu(case):
    ft.check_causal_conv1d_update_case(*case)


@pytest.mark.gpu
@given(conv1d_case())
def test_causal_conv1d_gpu(case):
    ft.check_causal_conv1d_case(*case, device="cuda")


@pytest.mark.gpu
@given(conv1d_update_case())
def test_causal_conv1d_update_gpu(case):
    ft.check_causal_conv1d_update_case(*case, device="cuda")


def test_reference_is_the_model_conv():
    """The reference equals the model's conv (F.conv1d over the state then x, groups = C, as
    transformers' causal_conv1d_update / causal_conv1d_fn), in f64 terms."""
    gen = torch.Generator().manual_seed(0)
    b, t, c, w = 2, 9, 6, 4
    x = torch.randn(b, t, c, generator=gen)
    weight = torch.randn(c, w, generator=gen)
    bias = torch.randn(c, generator=gen)
    state = torch.randn(b, c, w - 1, generator=gen)
    y, new_state = ops.causal_conv1d(x, weight, bias, state=state, backend="reference")
    xin = torch.cat([state, x.transpose(1, 2)], dim=-1).double()
    want = F.silu(F.conv1d(xin, weight.double()[:, None, :], bias.double(), groups=c)).transpose(1, 2)
    assert torch.allclose(y.double(), want, atol=1e-5), float((y.double() - want).abs().max())
    assert torch.equal(new_state, xin[:, :, -(w - 1) :].float())
    fresh, _ = ops.causal_conv1d(x, weight, bias, backend="reference")  # no state: zero padding, causal_conv1d_fn
    want = F.silu(F.conv1d(x.transpose(1, 2).double(), weight.double()[:, None, :], bias.double(), padding=w - 1,
                           groups=c)[:, :, :t]).transpose(1, 2)  # fmt: skip
    assert torch.allclose(fresh.double(), want, atol=1e-5)


def test_lengths_end_each_sequence():
    """Rows past a sequence's length are 0; its new state is the W-1 inputs ending at its
    length, reaching into the old state when the length is under W-1."""
    gen = torch.Generator().manual_seed(1)
    b, t, c, w = 3, 6, 4, 4
    x = torch.randn(b, t, c, generator=gen)
    weight = torch.randn(c, w, generator=gen)
    state = torch.randn(b, c, w - 1, generator=gen)
    lengths = torch.tensor([6, 1, 0])
    y, new_state = ops.causal_conv1d(x, weight, state=state, lengths=lengths, backend="reference")
    full, _ = ops.causal_conv1d(x, weight, state=state, backend="reference")
    assert torch.equal(y[0], full[0]) and torch.equal(y[1, :1], full[1, :1])
    assert not y[1, 1:].any() and not y[2].any()
    assert torch.equal(new_state[0], x[0, -3:].T)
    assert torch.equal(new_state[1], torch.cat([state[1, :, 1:], x[1, :1].T], dim=1))
    assert torch.equal(new_state[2], state[2])


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_chunks_and_decode_steps_chain(backend):
    """A prefill in two chunks (state carried) and then decode steps give the one-shot prefill's
    outputs and final state."""
    if backend not in backends.available_backends("causal_conv1d", torch.device("cpu"), torch.float32):
        pytest.skip(f"{backend} cannot serve CPU tensors in this process")
    gen = torch.Generator().manual_seed(2)
    b, t, c, w = 2, 11, 5, 4
    x = torch.randn(b, t, c, generator=gen)
    weight = torch.randn(c, w, generator=gen)
    bias = torch.randn(c, generator=gen)
    y, state = ops.causal_conv1d(x, weight, bias, backend=backend)
    y1, s1 = ops.causal_conv1d(x[:, :4], weight, bias, backend=backend)
    y2, s2 = ops.causal_conv1d(x[:, 4:8], weight, bias, state=s1, backend=backend)
    steps = [ops.causal_conv1d_update(x[:, i], weight, bias, s2, backend=backend) for i in range(8, t)]
    got = torch.cat([y1, y2, torch.stack(steps, 1)], dim=1)
    torch.testing.assert_close(got, y, rtol=1e-6, atol=1e-6)
    assert torch.equal(s2, state)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "hip"])
def test_update_is_graph_capturable(backend):
    """The decode step captures in a CUDA graph (no host work) and replays on the live state."""
    if backend not in backends.available_backends("causal_conv1d_update", torch.device("cuda"), torch.bfloat16):
        pytest.skip(f"{backend} cannot serve on this GPU")
    gen = torch.Generator().manual_seed(3)
    b, c, w = 2, 64, 4
    weight = torch.randn(c, w, generator=gen).cuda()
    bias = torch.randn(c, generator=gen).cuda()
    state = torch.randn(b, c, w - 1, generator=gen).bfloat16().cuda()
    x = torch.randn(b, c, generator=gen).bfloat16().cuda()
    start = state.clone()
    ops.causal_conv1d_update(x, weight, bias, state.clone(), backend=backend)  # build and load before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.causal_conv1d_update(x, weight, bias, state, backend=backend)
    state.copy_(start)
    graph.replay()
    want_state = start.clone()
    want = ops.causal_conv1d_update(x, weight, bias, want_state, backend="reference")
    torch.cuda.synchronize()
    assert torch.equal(state, want_state)
    torch.testing.assert_close(y.float(), want.float(), rtol=2**-7, atol=1e-3)


def test_bad_arguments_name_themselves():
    x = torch.randn(2, 5, 4)
    w = torch.randn(4, 4)
    state = torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match="x must be 3-D"):
        ops.causal_conv1d(torch.randn(5, 4), w)
    with pytest.raises(ValueError, match=r"weight must be \[C=4, W\]"):
        ops.causal_conv1d(x, torch.randn(4, 5))
    with pytest.raises(ValueError, match=r"weight must be \[C=4, W\]"):
        ops.causal_conv1d(x, torch.randn(3, 4))
    with pytest.raises(ValueError, match="bias must be"):
        ops.causal_conv1d(x, w, torch.randn(3))
    with pytest.raises(ValueError, match="state must be"):
        ops.causal_conv1d(x, w, state=torch.randn(2, 4, 4))
    with pytest.raises(TypeError, match="state must have x's dtype"):
        ops.causal_conv1d(x, w, state=state.half())
    with pytest.raises(ValueError, match="lengths must lie in"):
        ops.causal_conv1d(x, w, lengths=torch.tensor([5, 6]))
    with pytest.raises(ValueError, match="lengths must lie in"):
        ops.causal_conv1d(x, w, lengths=torch.tensor([-1, 2]))
    with pytest.raises(TypeError, match="lengths must be one of"):
        ops.causal_conv1d(x, w, lengths=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="activation must be"):
        ops.causal_conv1d(x, w, activation="gelu")
    with pytest.raises(TypeError, match="x must be one of"):
        ops.causal_conv1d(x.double(), w)
    before = state.clone()
    with pytest.raises(ValueError, match="x must be 2-D"):
        ops.causal_conv1d_update(x, w, None, state)
    with pytest.raises(TypeError, match="state must have x's dtype"):
        ops.causal_conv1d_update(x[:, 0], w, None, state.bfloat16())
    with pytest.raises(ValueError, match="unit last stride"):
        ops.causal_conv1d_update(x[:, 0], w, None, torch.randn(2, 3, 4).transpose(1, 2))
    with pytest.raises(ValueError, match="activation must be"):
        ops.causal_conv1d_update(x[:, 0], w, None, state, activation="relu")
    assert torch.equal(state, before)

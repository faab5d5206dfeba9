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
GARBAGE = (float("nan"), float("inf"), -float("inf"), 1e4)  # in the old state of a reset row


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
    state = (
        (torch.randn(b, c, w - 1, generator=gen) * scale).to(dtype) if draw(st.booleans()) else None
    )
    lengths = None
    if draw(st.booleans()):
        lengths = torch.randint(0, t + 1, (b,), generator=gen).to(
            draw(st.sampled_from([torch.int32, torch.int64]))
        )
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
    # a slot view of a cache
    state = pool[1:, 1 : c + 1] if draw(st.booleans()) else pool[:b, :c].contiguous()
    reset = None
    if draw(st.booleans()):  # some sequences start afresh: their old state is garbage, never read
        flags = torch.tensor(draw(st.lists(st.booleans(), min_size=b, max_size=b)))
        if draw(st.booleans()):  # a strided view
            flags = torch.stack([flags, ~flags], dim=1)[:, 0]
        reset = flags
        state[reset] = torch.tensor(GARBAGE, dtype=dtype)[
            torch.arange(c * (w - 1)) % len(GARBAGE)
        ].view(c, w - 1)
    return x, weight, bias, state, draw(st.sampled_from(["silu", None])), reset


@given(conv1d_case())
def test_causal_conv1d_cpu(case):
    ft.check_causal_conv1d_case(*case)


@given(conv1d_update_case())
def test_causal_conv1d_update_cpu(case):
    *args, reset = case
    ft.check_causal_conv1d_update_case(*args, reset=reset)


@pytest.mark.gpu
@given(conv1d_case())
def test_causal_conv1d_gpu(case):
    ft.check_causal_conv1d_case(*case, device="cuda")


@pytest.mark.gpu
@given(conv1d_update_case())
def test_causal_conv1d_update_gpu(case):
    *args, reset = case
    ft.check_causal_conv1d_update_case(*args, device="cuda", reset=reset)


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
    want = F.silu(F.conv1d(xin, weight.double()[:, None, :], bias.double(), groups=c)).transpose(
        1, 2
    )
    assert torch.allclose(y.double(), want, atol=1e-5), float((y.double() - want).abs().max())
    assert torch.equal(new_state, xin[:, :, -(w - 1) :].float())
    # no state: zero padding, causal_conv1d_fn
    fresh, _ = ops.causal_conv1d(x, weight, bias, backend="reference")
    want = F.silu(
        F.conv1d(
            x.transpose(1, 2).double(),
            weight.double()[:, None, :],
            bias.double(),
            padding=w - 1,
            groups=c,
        )[:, :, :t]
    ).transpose(1, 2)
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
    if backend not in backends.available_backends(
        "causal_conv1d", torch.device("cpu"), torch.float32
    ):
        pytest.skip(f"{backend} cannot serve CPU tensors in this process")
    gen = torch.Generator().manual_seed(2)
    b, t, c, w = 2, 11, 5, 4
    x = torch.randn(b, t, c, generator=gen)
    weight = torch.randn(c, w, generator=gen)
    bias = torch.randn(c, generator=gen)
    y, state = ops.causal_conv1d(x, weight, bias, backend=backend)
    y1, s1 = ops.causal_conv1d(x[:, :4], weight, bias, backend=backend)
    y2, s2 = ops.causal_conv1d(x[:, 4:8], weight, bias, state=s1, backend=backend)
    steps = [
        ops.causal_conv1d_update(x[:, i], weight, bias, s2, backend=backend) for i in range(8, t)
    ]
    got = torch.cat([y1, y2, torch.stack(steps, 1)], dim=1)
    torch.testing.assert_close(got, y, rtol=1e-6, atol=1e-6)
    assert torch.equal(s2, state)


def _reset_rows_are_a_zero_state(backend, device):
    """Rows flagged in ``reset`` (NaN / inf in their old state) give y and the new state of the op
    on a zero state; the other rows what they give without ``reset``, bit for bit."""
    if backend not in backends.available_backends(
        "causal_conv1d_update", torch.device(device), torch.float32
    ):
        pytest.skip(f"{backend} cannot serve {device} tensors in this process")
    gen = torch.Generator().manual_seed(4)
    b, c, w = 4, 37, 4
    weight = torch.randn(c, w, generator=gen).to(device)
    bias = torch.randn(c, generator=gen).to(device)
    for dtype in DTYPES:
        x = torch.randn(b, c, generator=gen).to(dtype).to(device)
        state = torch.randn(b, c, w - 1, generator=gen).to(dtype).to(device)
        for flags in ([True, False, True, False], [True] * b, [False] * b):
            reset = torch.tensor(flags, device=device)
            dirty = state.clone()
            dirty[reset] = float("nan")
            dirty[reset, :, 0] = float("inf")
            zeroed = torch.where(
                reset[:, None, None], torch.zeros((), dtype=dtype, device=device), state
            )
            want_state = zeroed.clone()
            want = ops.causal_conv1d_update(x, weight, bias, want_state, backend=backend)
            got = ops.causal_conv1d_update(x, weight, bias, dirty, backend=backend, reset=reset)
            assert torch.equal(got, want) and torch.equal(dirty, want_state), (
                backend,
                dtype,
                flags,
            )
            assert not dirty[reset, :, : w - 2].any() and torch.equal(dirty[reset, :, -1], x[reset])
            kept_state = state.clone()  # the rows not reset: as without the argument
            kept = ops.causal_conv1d_update(x, weight, bias, kept_state, backend=backend)
            assert torch.equal(got[~reset], kept[~reset]) and torch.equal(
                dirty[~reset], kept_state[~reset]
            )


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_update_reset_rows_are_a_zero_state(backend):
    _reset_rows_are_a_zero_state(backend, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["reference", "triton", "hip"])
def test_update_reset_rows_are_a_zero_state_gpu(backend):
    _reset_rows_are_a_zero_state(backend, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "hip"])
@pytest.mark.parametrize("with_reset", [False, True])
def test_update_is_graph_capturable(backend, with_reset):
    """The decode step captures in a CUDA graph (no host work) and replays on the live state (and
    the live reset flags, set after the capture)."""
    if backend not in backends.available_backends(
        "causal_conv1d_update", torch.device("cuda"), torch.bfloat16
    ):
        pytest.skip(f"{backend} cannot serve on this GPU")
    gen = torch.Generator().manual_seed(3)
    b, c, w = 2, 64, 4
    weight = torch.randn(c, w, generator=gen).cuda()
    bias = torch.randn(c, generator=gen).cuda()
    state = torch.randn(b, c, w - 1, generator=gen).bfloat16().cuda()
    x = torch.randn(b, c, generator=gen).bfloat16().cuda()
    reset = torch.zeros(b, dtype=torch.bool, device="cuda") if with_reset else None
    start = state.clone()
    # build, load
    ops.causal_conv1d_update(x, weight, bias, state.clone(), backend=backend, reset=reset)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.causal_conv1d_update(x, weight, bias, state, backend=backend, reset=reset)
    state.copy_(start)
    if with_reset:
        reset[1] = True
    graph.replay()
    want_state = start.clone()
    want = ops.causal_conv1d_update(x, weight, bias, want_state, backend="reference", reset=reset)
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


def test_bad_reset_names_itself():
    """reset must be a bool tensor [B] (on x's device: not testable without a GPU); nothing is
    written when it is not."""
    x, w, state = torch.randn(2, 4), torch.randn(4, 4), torch.randn(2, 4, 3)
    before = state.clone()
    with pytest.raises(TypeError, match="reset must be a torch.Tensor, got list"):
        ops.causal_conv1d_update(x, w, None, state, reset=[True, False])
    for bad in (
        torch.tensor([1, 0]),
        torch.tensor([1, 0], dtype=torch.uint8),
        torch.tensor([1.0, 0.0]),
    ):
        with pytest.raises(TypeError, match=f"reset must be a bool tensor, got {bad.dtype}"):
            ops.causal_conv1d_update(x, w, None, state, reset=bad)
    for shape in ((3,), (2, 1), (1,), ()):
        with pytest.raises(ValueError, match=r"reset must be \[B=2\], got shape"):
            ops.causal_conv1d_update(x, w, None, state, reset=torch.ones(shape, dtype=torch.bool))
    assert torch.equal(state, before)

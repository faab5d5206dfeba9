"""router_topk (docs/OPS.md section 3): the router's linear layer and route_topk in one op. Every
backend's logits within the derived bound of the reference's, its routes the route_topk of
its own logits; the hip kernel's one-launch form (the last block routes) on the GPU, eager and
replayed from a graph.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import ops
from ftlab.testing.common import assert_within


@st.composite
def router_cases(draw, max_tokens: int = 33, hs=(8, 100, 256)):
    t = draw(st.sampled_from([1, 2, 5, max_tokens]))
    h = draw(st.sampled_from(hs))  # 100: not 8 a load, the scalar path
    e = draw(st.sampled_from([8, 60, 128, 300]))  # 300: past 128, 32 logits a lane
    k = draw(st.sampled_from([1, 2, 8]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(t, h, generator=gen)
    w = torch.randn(e, h, generator=gen) * h**-0.5
    kind = draw(st.sampled_from(["random", "ties", "one-expert", "strided"]))
    if kind == "ties":  # equal rows: equal logits, the lower ids first
        w[1::2] = w[0::2][: e // 2]
    if kind == "one-expert":
        w[3] = x[0] * 10.0 / h
    x, w = x.to(dtype), w.to(dtype)
    if kind == "strided":  # x a column slice of a wider tensor: rows not 16-byte aligned
        x = torch.randn(t, h + 3, generator=gen).to(dtype)[:, :h]
    return x, w, k, draw(st.booleans())


@settings(max_examples=25)
@given(router_cases())
def test_router_topk_backends_cpu(case):
    ft.check_router_case(*case, device="cpu", backends=["reference", "triton"])


def test_router_topk_is_route_topk_of_the_linear_layer():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 64, generator=gen), torch.randn(16, 64, generator=gen)
    logits, weights, ids = ops.router_topk(x, w, 3, backend="reference")
    torch.testing.assert_close(logits, x @ w.T, rtol=1e-6, atol=1e-6)
    want_w, want_ids = ops.route_topk(logits, 3, backend="reference")
    assert torch.equal(ids, want_ids) and torch.equal(weights, want_w)


def test_the_logit_bound_catches_two_ulps():
    gen = torch.Generator().manual_seed(1)
    x, w = (
        torch.randn(2, 256, generator=gen).bfloat16(),
        torch.randn(128, 256, generator=gen).bfloat16(),
    )
    ref, _, _ = ops.router_topk(x, w, 8, backend="reference")
    bound = ft.router_logits_tolerance(x, w, ref)
    off = ref.float() + 2 * ft.common.ulp(ref.float(), torch.bfloat16) * torch.sign(ref.float())
    with pytest.raises(AssertionError, match="logits off"):
        assert_within("mutant", "logits", off, ref, bound)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: ops.router_topk(torch.randn(2, 8), torch.randn(4, 8).half(), 2),
            TypeError,
            "weight",
        ),
        (lambda: ops.router_topk(torch.randn(2, 8), torch.randn(4, 6), 2), ValueError, "x's H = 8"),
        (lambda: ops.router_topk(torch.randn(2, 8), torch.randn(4, 8), 5), ValueError, "top_k"),
        (
            lambda: ops.router_topk(torch.randn(8), torch.randn(4, 8), 2),
            ValueError,
            "x must be 2-D",
        ),
        (
            lambda: ops.router_topk(torch.randn(2, 8), torch.randn(4, 8), 2, 1),
            TypeError,
            "renormalize",
        ),
    ],
)
def test_router_topk_rejects_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.gpu
@settings(max_examples=40, deadline=None)
@given(router_cases(max_tokens=300, hs=(8, 100, 256, 2048)))
def test_router_topk_gpu(case):
    ft.check_router_case(*case, device="cuda")


@pytest.mark.gpu
def test_router_topk_past_one_launch_of_tokens_gpu():
    """More tokens than one HIP launch holds (65535): the launches in turn, the counters reused."""
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(65535 + 37, 8, generator=gen), torch.randn(8, 8, generator=gen)
    ft.check_router_case(x, w, 2, True, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["hip", "triton"])
def test_router_topk_graph_replay_equals_eager(backend):
    """The captured call replayed on new inputs (the hip counters reset by each call's last
    block)."""
    from ftlab import backends

    dev = torch.device("cuda")
    if backend not in backends.available_backends("router_topk", dev, torch.bfloat16):
        pytest.skip(f"{backend} is not available here")
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(8, 2048, device=dev, generator=gen).bfloat16()
    w = (torch.randn(128, 2048, device=dev, generator=gen) * 2048**-0.5).bfloat16()
    out = ops.router_topk(x, w, 8, backend=backend)  # warm-up: builds, allocates the counters
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.router_topk(x, w, 8, backend=backend)
    for i in range(5):
        x.copy_(torch.randn(x.shape, device=dev, generator=gen))
        graph.replay()
        want = ops.router_topk(x, w, 8, backend=backend)
        for got, ref in zip(out, want, strict=True):
            assert torch.equal(got, ref), f"replay {i}"
        ref_logits, _, _ = ops.router_topk(x, w, 8, backend="reference")
        assert_within(
            backend,
            f"replay {i} logits",
            out[0],
            ref_logits,
            ft.router_logits_tolerance(x, w, ref_logits),
        )

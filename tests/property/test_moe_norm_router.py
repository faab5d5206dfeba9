"""add_rmsnorm_router_topk (a layer's residual add and RMSNorm, then the router of the normed rows):
in every backend the bits of that backend's add_rmsnorm then router_topk -- hip's one launch
included, which recomputes the norm in every router block -- on the CPU (reference, the Triton
interpreter) and on a GPU, past the one-launch limits (tokens, H, a misaligned row, an fp32 norm
weight) too; bad arguments name themselves and write nothing."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import ops


@st.composite
def norm_router_cases(draw, tokens=(1, 2, 5, 8, 9), hs=(8, 100, 256, 2048)):
    t = draw(st.sampled_from(tokens))  # 9: past hip's one-launch tokens
    # 100: not a whole 16-byte piece count in bf16; 8200: past hip's LDS row
    h = draw(st.sampled_from(hs))
    e = draw(st.sampled_from([8, 60, 128, 300]))  # 300: 32 logits a lane
    k = draw(st.sampled_from([1, 2, 8]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 50.0]))
    x = (torch.randn(t, h, generator=gen) * scale).to(dtype)
    residual = (
        None
        if draw(st.integers(0, 4)) == 0
        else (torch.randn(t, h, generator=gen) * scale).to(dtype)
    )
    # rows not 16-byte aligned: not one launch
    if residual is not None and draw(st.integers(0, 4)) == 0:
        residual = (torch.randn(t, h + 3, generator=gen) * scale).to(dtype)[:, 3:]
    nw_dtype = draw(st.sampled_from([dtype, dtype, torch.float32]))
    norm_w = (torch.rand(h, generator=gen) + 0.5).to(nw_dtype)
    w = (torch.randn(e, h, generator=gen) * h**-0.5).to(dtype)
    eps = draw(st.sampled_from([1e-6, 1e-5]))
    return x, residual, norm_w, eps, w, k, draw(st.booleans())


@settings(max_examples=15, deadline=None)
@given(norm_router_cases(hs=(8, 100, 256)))
def test_norm_router_is_norm_then_router_cpu(case):
    ft.check_norm_router_case(*case, backends=["reference", "triton"])


@pytest.mark.gpu
@settings(max_examples=60, deadline=None)
@given(norm_router_cases(tokens=(1, 2, 5, 8, 9, 40), hs=(8, 100, 256, 2048, 4096, 8192, 8200)))
def test_norm_router_is_norm_then_router_gpu(case):
    ft.check_norm_router_case(*case, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["hip", "triton"])
def test_norm_router_graph_replay_equals_eager_gpu(backend):
    """Captured at the decode shape (one token, H 2048, 128 experts, top 8) and replayed over new
    inputs: the eager call's bits each time (hip: the routing counters reset by the kernel)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(1, 2048, device="cuda", generator=g).bfloat16()
    r = torch.randn(1, 2048, device="cuda", generator=g).bfloat16()
    nw = torch.rand(2048, device="cuda", generator=g).bfloat16() + 0.5
    w = (torch.randn(128, 2048, device="cuda", generator=g) * 0.02).bfloat16()
    ops.add_rmsnorm_router_topk(x, r, nw, 1e-6, w, 8, backend=backend)  # warm-up: counters, JIT
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.add_rmsnorm_router_topk(x, r, nw, 1e-6, w, 8, backend=backend)
    for _ in range(4):
        x.copy_(torch.randn(1, 2048, device="cuda", generator=g))
        r.copy_(torch.randn(1, 2048, device="cuda", generator=g))
        graph.replay()
        torch.cuda.synchronize()
        want = ops.add_rmsnorm_router_topk(x, r, nw, 1e-6, w, 8, backend=backend)
        assert all(torch.equal(a, b) for a, b in zip(out, want, strict=True))


def test_bad_arguments_name_themselves():
    x, r, nw, w = torch.randn(2, 16), torch.randn(2, 16), torch.ones(16), torch.randn(8, 16)
    cases = [
        (dict(residual=torch.randn(2, 8)), ValueError, "residual must have x's shape"),
        (dict(norm_w=torch.ones(8)), ValueError, r"weight must be \[H=16\]"),
        (dict(eps=-1.0), ValueError, "eps"),
        (dict(w=torch.randn(8, 8)), ValueError, r"weight must be \[E, H\] with x's H = 16"),
        (dict(w=w.half()), TypeError, "weight must have the dtype of x"),
        (dict(k=9), ValueError, "top_k"),
        (dict(renorm=1), TypeError, "renormalize must be a bool"),
        (dict(x=torch.randn(2, 16).int()), TypeError, "x must be"),
    ]
    for change, error, match in cases:
        args = dict(x=x, residual=r, norm_w=nw, eps=1e-6, w=w, k=2, renorm=True) | change
        with pytest.raises(error, match=match):
            ops.add_rmsnorm_router_topk(
                args["x"],
                args["residual"],
                args["norm_w"],
                args["eps"],
                args["w"],
                args["k"],
                args["renorm"],
            )

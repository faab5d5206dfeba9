"""add_rmsnorm_q4_0_matmul (a layer's residual add and RMSNorm, then its first Q4_0 projection): in
every backend the bits of that backend's add_rmsnorm then q4_0_matmul -- hip's one launch (the
fused matvec computing the norm in every block) included -- on the CPU (reference, the Triton
interpreter) and on a GPU, past the one-launch limits (rows, K, a misaligned residual, an fp32
norm weight, fp32 x) too; bad arguments name themselves."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import ops


@st.composite
def norm_matvec_cases(draw, rows=(1, 2), ks=(256, 512), ns=(8, 40)):
    m = draw(st.sampled_from(rows))
    k = draw(st.sampled_from(ks))  # 4096: past the one-launch K; 288: not a whole superblock
    n = draw(st.sampled_from(ns))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 50.0]))
    x = (torch.randn(m, k, generator=gen) * scale).to(dtype)
    residual = (
        None
        if draw(st.integers(0, 4)) == 0
        else (torch.randn(m, k, generator=gen) * scale).to(dtype)
    )
    if residual is not None and draw(st.integers(0, 4)) == 0:  # not 16-byte aligned: not one launch
        residual = (torch.randn(m, k + 3, generator=gen) * scale).to(dtype)[:, 3:]
    norm_w = (torch.rand(k, generator=gen) + 0.5).to(
        draw(st.sampled_from([dtype, dtype, torch.float32]))
    )
    w = ops.quantize_q4_0(torch.randn(n, k, generator=gen) * 0.05)
    return x, residual, norm_w, draw(st.sampled_from([1e-6, 1e-5])), w


@settings(max_examples=12, deadline=None)
@given(norm_matvec_cases())
def test_norm_matvec_is_norm_then_matmul_cpu(case):
    ft.check_norm_matmul_case(*case, backends=["reference", "triton"])


@pytest.mark.gpu
@settings(max_examples=60, deadline=None)
@given(
    norm_matvec_cases(rows=(1, 1, 2, 9), ks=(256, 512, 1024, 2048, 288, 4096), ns=(8, 300, 5120))
)
def test_norm_matvec_is_norm_then_matmul_gpu(case):
    ft.check_norm_matmul_case(*case, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["hip", "triton"])
def test_norm_matvec_graph_replay_equals_eager_gpu(backend):
    """Captured at the decode shape (one row, K 2048, the stacked q/k/v's 5120 rows) and replayed
    over new inputs: the eager call's bits each time."""
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(1, 2048, device="cuda", generator=g).bfloat16()
    r = torch.randn(1, 2048, device="cuda", generator=g).bfloat16()
    nw = torch.rand(2048, device="cuda", generator=g).bfloat16() + 0.5
    w = ops.quantize_q4_0(torch.randn(5120, 2048, device="cuda", generator=g) * 0.02)
    ops.add_rmsnorm_q4_0_matmul(x, r, nw, 1e-6, w, backend=backend)  # warm-up: JIT
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.add_rmsnorm_q4_0_matmul(x, r, nw, 1e-6, w, backend=backend)
    for _ in range(4):
        x.copy_(torch.randn(1, 2048, device="cuda", generator=g))
        r.copy_(torch.randn(1, 2048, device="cuda", generator=g))
        graph.replay()
        torch.cuda.synchronize()
        want = ops.add_rmsnorm_q4_0_matmul(x, r, nw, 1e-6, w, backend=backend)
        assert all(torch.equal(a, b) for a, b in zip(out, want, strict=True))


def test_bad_arguments_name_themselves():
    x, r, nw = torch.randn(1, 64), torch.randn(1, 64), torch.ones(64)
    w = ops.quantize_q4_0(torch.randn(8, 64))
    cases = [
        (dict(residual=torch.randn(1, 32)), ValueError, "residual must have x's shape"),
        (dict(norm_w=torch.ones(32)), ValueError, r"weight must be \[H=64\]"),
        (dict(eps=float("nan")), ValueError, "eps"),
        (dict(w=torch.randn(8, 64)), TypeError, "w must be a ftlab.quant.Q4_0Weight"),
        (
            dict(w=ops.quantize_q4_0(torch.randn(8, 32))),
            ValueError,
            r"w must be a 2-D Q4_0Weight \[N, K\] with x's K = 64",
        ),
        (dict(x=torch.randn(1, 64).int()), TypeError, "x must be"),
    ]
    for change, error, match in cases:
        args = dict(x=x, residual=r, norm_w=nw, eps=1e-6, w=w) | change
        with pytest.raises(error, match=match):
            ops.add_rmsnorm_q4_0_matmul(
                args["x"], args["residual"], args["norm_w"], args["eps"], args["w"]
            )
    with pytest.raises(ValueError, match="path"):
        ops.add_rmsnorm_q4_0_matmul(x, r, nw, 1e-6, w, path="fast")


def test_empty_rows_and_outputs():
    """No rows, or no output columns: y and s as add_rmsnorm gives them, an empty product."""
    w = ops.quantize_q4_0(torch.randn(8, 64))
    for name in ("reference", "triton"):
        y, s, out = ops.add_rmsnorm_q4_0_matmul(
            torch.randn(0, 64), torch.randn(0, 64), torch.ones(64), 1e-6, w, backend=name
        )
        assert y.shape == s.shape == (0, 64) and out.shape == (0, 8)
        x, r = torch.randn(1, 64), torch.randn(1, 64)
        y, s, out = ops.add_rmsnorm_q4_0_matmul(
            x, r, torch.ones(64), 1e-6, ops.quantize_q4_0(torch.randn(0, 64)), backend=name
        )
        want_y, want_s = ops.add_rmsnorm(x, r, torch.ones(64), 1e-6, backend=name)
        assert torch.equal(y, want_y) and torch.equal(s, want_s) and out.shape == (1, 0)

"""gated_rmsnorm and output_gate: every backend against the reference within the derived
bound, on views of a fused projection, in the Triton interpreter on the CPU and on a GPU; the
reference against transformers' Qwen3NextRMSNormGated and gated attention output (which round
to the input dtype in between: a few ulps apart, bounded); bad arguments name themselves."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import ops
from ftlab.testing.common import ulp

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@st.composite
def gated_rmsnorm_case(draw, dtypes=DTYPES):
    n = draw(st.sampled_from([1, 2, 5]))
    h = draw(st.sampled_from([1, 2, 4]))
    d = draw(st.sampled_from([4, 16, 64, 128]))
    dtype = draw(st.sampled_from(dtypes))
    zdtype = draw(st.sampled_from((dtype, *DTYPES)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 300.0]))
    x = (torch.randn(n, h, d, generator=gen) * scale).to(dtype)
    z = (torch.randn(n, h * d * 2, generator=gen) * 3).to(zdtype)
    z = (
        z[:, h * d :].view(n, h, d)
        if draw(st.booleans())
        else z[:, : h * d].reshape(n, h, d).clone()
    )
    weight = (1 + 0.5 * torch.randn(d, generator=gen)).to(draw(st.sampled_from(DTYPES)))
    return x, z, weight, draw(st.sampled_from([1e-6, 1e-5]))


@st.composite
def output_gate_case(draw, dtypes=DTYPES):
    n = draw(st.sampled_from([1, 2, 7]))
    f = draw(st.sampled_from([1, 16, 100, 1500]))
    dtype = draw(st.sampled_from(dtypes))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    attn = (torch.randn(n, f, generator=gen) * draw(st.sampled_from([1e-3, 1.0, 300.0]))).to(dtype)
    q = (torch.randn(n, 3 * f, generator=gen) * 4).to(dtype)
    # the gate slice of a fused projection
    gate = q[:, f : 2 * f] if draw(st.booleans()) else q[:, :f].clone()
    return attn, gate


@given(gated_rmsnorm_case())
def test_gated_rmsnorm_cpu(case):
    ft.check_gated_rmsnorm_case(*case)


@given(output_gate_case())
def test_output_gate_cpu(case):
    ft.check_output_gate_case(*case)


@pytest.mark.gpu
@given(gated_rmsnorm_case())
def test_gated_rmsnorm_gpu(case):
    ft.check_gated_rmsnorm_case(*case, device="cuda")


@pytest.mark.gpu
@given(output_gate_case())
def test_output_gate_gpu(case):
    ft.check_output_gate_case(*case, device="cuda")


def _hf_gated_norm(x, z, weight, eps):
    """transformers' Qwen3NextRMSNormGated.forward, written out (weight in the model dtype)."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight.to(dtype) * h.to(dtype)
    return (h * F.silu(z.float())).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_is_the_model_gated_norm(dtype):
    """ftlab rounds once; transformers rounds x * r and then weight * that to the input dtype
    before the gate: three roundings against one, each within half an ulp relatively, so the two
    lie within 4 ulps of each other (plus the fp32 terms), and ftlab within the tolerance of
    the exact value."""
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(6, 4, 128, generator=gen) * 3).to(dtype)
    z = (torch.randn(6, 4, 128, generator=gen) * 3).to(dtype)
    w = (1 + 0.5 * torch.randn(128, generator=gen)).to(dtype)
    got = ops.gated_rmsnorm(x, z, w, 1e-6, backend="reference")
    hf = _hf_gated_norm(x, z, w, 1e-6)
    exact = (
        x.double()
        * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
        * w.double()
        * F.silu(z.double())
    )
    bound = ft.gated_rmsnorm_tolerance(x, z, w, 1e-6).double()
    assert bool(((got.double() - exact).abs() <= bound).all())
    steps = 4 if dtype != torch.float32 else 0
    hf_bound = steps * ulp(exact.abs().float() * 1.01, dtype).double() + 3 * bound
    assert bool(((got.double() - hf.double()).abs() <= hf_bound).all())


def test_reference_is_the_model_output_gate():
    """attn * sigmoid(gate) of the gated attention layers, rounded once."""
    gen = torch.Generator().manual_seed(5)
    attn = torch.randn(3, 64, generator=gen).bfloat16()
    gate = torch.randn(3, 64, generator=gen).bfloat16()
    want = (attn.double() * torch.sigmoid(gate.double())).bfloat16()
    got = ops.output_gate(attn, gate, backend="reference")
    assert bool(
        (
            (got.double() - want.double()).abs() <= ulp(want.abs().float(), torch.bfloat16).double()
        ).all()
    )


def test_bad_arguments_name_themselves():
    x = torch.randn(2, 3, 8)
    w = torch.ones(8)
    with pytest.raises(ValueError, match="x must be 3-D"):
        ops.gated_rmsnorm(torch.randn(2, 8), torch.randn(2, 8), w, 1e-6)
    with pytest.raises(ValueError, match="z must have x's shape"):
        ops.gated_rmsnorm(x, torch.randn(2, 3, 4), w, 1e-6)
    with pytest.raises(ValueError, match=r"weight must be \[D=8\]"):
        ops.gated_rmsnorm(x, x, torch.ones(4), 1e-6)
    with pytest.raises(TypeError, match="z must be one of"):
        ops.gated_rmsnorm(x, x.double(), w, 1e-6)
    with pytest.raises(ValueError, match="eps"):
        ops.gated_rmsnorm(x, x, w, float("nan"))
    a = torch.randn(4, 16)
    with pytest.raises(ValueError, match="attn must be 2-D"):
        ops.output_gate(x, x)
    with pytest.raises(ValueError, match="gate must have attn's shape"):
        ops.output_gate(a, torch.randn(4, 8))
    with pytest.raises(TypeError, match="gate must have attn's dtype"):
        ops.output_gate(a, a.half())


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "hip"])
def test_graph_capturable(backend):
    """Both ops capture in a CUDA graph (no host work) and replay on new inputs."""
    from ftlab import backends

    dev = torch.device("cuda")
    for op in ("gated_rmsnorm", "output_gate"):
        if backend not in backends.available_backends(op, dev, torch.bfloat16):
            pytest.skip(f"{backend} cannot serve {op} on this GPU")
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(4, 2, 128, generator=gen).bfloat16().to(dev)
    z = torch.randn(4, 2, 128, generator=gen).bfloat16().to(dev)
    w = torch.randn(128, generator=gen).to(dev)
    ops.gated_rmsnorm(x, z, w, 1e-6, backend=backend)  # build and load before capture
    ops.output_gate(x[:, 0], z[:, 0], backend=backend)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.gated_rmsnorm(x, z, w, 1e-6, backend=backend)
        g = ops.output_gate(x[:, 0], z[:, 0], backend=backend)
    x.copy_(torch.randn(4, 2, 128, generator=gen).bfloat16().to(dev))
    graph.replay()
    torch.cuda.synchronize()
    want_y = ops.gated_rmsnorm(x, z, w, 1e-6, backend="reference")
    want_g = ops.output_gate(x[:, 0], z[:, 0], backend="reference")
    torch.testing.assert_close(y.float(), want_y.float(), rtol=2**-7, atol=1e-3)
    torch.testing.assert_close(g.float(), want_g.float(), rtol=2**-7, atol=1e-3)

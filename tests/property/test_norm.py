"""add_rmsnorm (the residual add fused with the next RMSNorm): every backend against the
reference -- s bit for bit, y within the derived bound -- with and without a residual, in each
float dtype, with weights of another dtype, on row views with any row stride (aligned or not),
H a power of two or not, short and long rows, in the Triton interpreter on the CPU and on a GPU
(also captured in a CUDA graph and on a side stream); the reference is the model's add then
``layers.rms_norm``, bit for bit; bad arguments name themselves."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import backends, ops
from ftlab.bitview import bits_equal
from ftlab.models import layers

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
GPU_BACKENDS = ("triton", "hip")


def _rows(gen, n, h, dtype, scale, pad=0, off=0):
    """``[n, h]`` of ``dtype``, a view with row stride ``h + pad + off`` starting ``off``
    elements into its buffer (contiguous when both are 0)."""
    buf = (torch.randn(n, h + pad + off, generator=gen) * scale).to(dtype)
    return buf[:, off : off + h]


@st.composite
def add_rmsnorm_case(draw, dtypes=DTYPES):
    n = draw(st.sampled_from([1, 2, 5, 33]))
    h = draw(st.sampled_from([7, 96, 1536, 2048]))
    dtype = draw(st.sampled_from(dtypes))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 300.0]))
    pad, off = draw(st.sampled_from([(0, 0), (0, 0), (8, 0), (1, 0), (0, 1), (7, 8)]))
    x = _rows(gen, n, h, dtype, scale, pad, off)
    residual = None
    if draw(st.booleans()):
        residual = _rows(
            gen,
            n,
            h,
            dtype,
            scale * draw(st.sampled_from([0.1, 1.0, 10.0])),
            *draw(st.sampled_from([(0, 0), (8, 0), (3, 1)])),
        )
    wdtype = draw(st.sampled_from((dtype, dtype, *DTYPES)))
    weight = (1 + 0.5 * torch.randn(h, generator=gen)).to(wdtype)
    return x, residual, weight, draw(st.sampled_from([1e-6, 1e-5, 0.0]))


@given(add_rmsnorm_case())
def test_add_rmsnorm_cpu(case):
    ft.check_add_rmsnorm_case(*case)


@pytest.mark.gpu
@given(add_rmsnorm_case())
def test_add_rmsnorm_gpu(case):
    ft.check_add_rmsnorm_case(*case, device="cuda")


def _long_case(h, dtype, residual, wdtype, off=0):
    gen = torch.Generator().manual_seed(h + off)
    x = _rows(gen, 3, h, dtype, 2.0, 0, off)
    r = _rows(gen, 3, h, dtype, 1.0, 0, off) if residual else None
    return x, r, (1 + 0.5 * torch.randn(h, generator=gen)).to(wdtype), 1e-6


LONG = [
    (8192, torch.bfloat16, True, torch.bfloat16, 0),
    (8192, torch.float32, False, torch.float32, 0),
    (10000, torch.bfloat16, True, torch.float32, 0),
    (12288, torch.float16, False, torch.float16, 0),
    (12288, torch.float32, True, torch.bfloat16, 1),
    (5000, torch.bfloat16, True, torch.bfloat16, 1),
]


@pytest.mark.parametrize("h, dtype, residual, wdtype, off", LONG)
def test_long_rows_cpu(h, dtype, residual, wdtype, off):
    """Rows past one block of registers (Triton: two passes over blocks; HIP: pieces past the
    register cache read back)."""
    ft.check_add_rmsnorm_case(*_long_case(h, dtype, residual, wdtype, off))


@pytest.mark.gpu
@pytest.mark.parametrize("h, dtype, residual, wdtype, off", LONG)
def test_long_rows_gpu(h, dtype, residual, wdtype, off):
    ft.check_add_rmsnorm_case(*_long_case(h, dtype, residual, wdtype, off), device="cuda")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("wdtype", DTYPES)
@pytest.mark.parametrize("with_residual", [True, False])
def test_reference_is_the_model_code(dtype, wdtype, with_residual):
    """The reference is what the model computes, bit for bit: ``s = x + residual`` (torch's add),
    then ``ftlab.models.layers.rms_norm(s, weight, eps)``."""
    gen = torch.Generator().manual_seed(3)
    x = _rows(gen, 6, 96, dtype, 3.0, 5, 0)
    residual = _rows(gen, 6, 96, dtype, 3.0) if with_residual else None
    w = (1 + 0.5 * torch.randn(96, generator=gen)).to(wdtype)
    y, s = ops.add_rmsnorm(x, residual, w, 1e-6, backend="reference")
    want_s = x + residual if with_residual else x
    assert bits_equal(s, want_s) and bits_equal(y, layers.rms_norm(want_s, w, 1e-6))
    assert (s is x) == (not with_residual) and y.is_contiguous() and s.dtype == y.dtype == dtype


def test_rounding_is_once_from_the_rounded_sum():
    """s is the fp32 sum rounded once; y is computed from that rounded s (not the fp32 sum) and
    rounded once: within half an ulp (plus the fp32 terms) of the exact value on the rounded s."""
    gen = torch.Generator().manual_seed(5)
    x, r = _rows(gen, 4, 512, torch.bfloat16, 4.0), _rows(gen, 4, 512, torch.bfloat16, 0.01)
    w = (1 + 0.5 * torch.randn(512, generator=gen)).float()
    y, s = ops.add_rmsnorm(x, r, w, 1e-6, backend="reference")
    assert bits_equal(s, (x.float() + r.float()).bfloat16())
    sd = s.double()
    exact = sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    half_ulp = ft.add_rmsnorm_tolerance(s, w, 1e-6).double() / 2  # half an ulp plus the fp32 terms
    assert bool(((y.double() - exact).abs() <= half_ulp).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_bound_holds_and_catches_bugs(dtype):
    """The reference lies within half the bound of the exact value on the rounded s (its fp32
    error plus half an ulp); a mean over H - 1, or (16-bit x) an fp32 weight rounded to x's dtype
    and applied after a first rounding (two more roundings), lie outside it somewhere."""
    gen = torch.Generator().manual_seed(7)
    h = 96
    x, r = _rows(gen, 64, h, dtype, 3.0), _rows(gen, 64, h, dtype, 1.0)
    w = 1 + torch.arange(h) / (3 * h)  # thirds: far from every dtype's grid
    y, s = ops.add_rmsnorm(x, r, w, 1e-6, backend="reference")
    bound = ft.add_rmsnorm_tolerance(s, w, 1e-6).double()
    sd = s.double()
    exact = sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert bool(((y.double() - exact).abs() <= bound / 2).all())

    def caught(bug):
        return not bool(((bug.double() - y.double()).abs() <= bound).all())

    sf = s.float()
    mean_h1 = sf.pow(2).sum(-1, keepdim=True) / (h - 1)
    assert caught((sf * torch.rsqrt(mean_h1 + 1e-6) * w).to(dtype))
    if dtype != torch.float32:
        normed = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
        assert caught(normed * w.to(dtype))


def test_column_strided_views_are_copied():
    """x and residual with a non-unit element stride (a transposed buffer) give what their
    contiguous copies give; the inputs are left as they were."""
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(96, 5, generator=gen)).bfloat16().t()
    r = (torch.randn(96, 5, generator=gen)).bfloat16().t()
    w = torch.randn(96, generator=gen).bfloat16()
    before = (x.clone(), r.clone())
    ft.check_add_rmsnorm_case(x, r, w, 1e-6)
    for name in backends.available_backends("add_rmsnorm", x.device, x.dtype):
        y, s = ops.add_rmsnorm(x, r, w, 1e-6, backend=name)
        y2, s2 = ops.add_rmsnorm(x.contiguous(), r.contiguous(), w, 1e-6, backend=name)
        assert bits_equal(y, y2) and bits_equal(s, s2), name
        y, s = ops.add_rmsnorm(x, None, w, 1e-6, backend=name)
        y2, _ = ops.add_rmsnorm(x.contiguous(), None, w, 1e-6, backend=name)
        assert s is x and bits_equal(y, y2), name
    assert bits_equal(x, before[0]) and bits_equal(r, before[1])


def test_no_rows():
    for name in backends.available_backends("add_rmsnorm", torch.device("cpu"), torch.float16):
        x = torch.empty(0, 64, dtype=torch.float16)
        y, s = ops.add_rmsnorm(x, x.clone(), torch.ones(64), 1e-6, backend=name)
        assert y.shape == s.shape == (0, 64) and y.dtype == s.dtype == torch.float16, name


def test_bad_arguments_name_themselves():
    x = torch.randn(2, 8)
    w = torch.ones(8)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        ops.add_rmsnorm([[1.0]], None, w, 1e-6)
    with pytest.raises(TypeError, match="x must be one of float32, float16, bfloat16, got"):
        ops.add_rmsnorm(x.int(), None, w, 1e-6)
    with pytest.raises(ValueError, match=r"x must be 2-D \[N, H\] with H > 0, got shape \(8,\)"):
        ops.add_rmsnorm(w, None, w, 1e-6)
    with pytest.raises(ValueError, match=r"x must be 2-D \[N, H\] with H > 0, got shape \(2, 0\)"):
        ops.add_rmsnorm(torch.randn(2, 0), None, torch.ones(0), 1e-6)
    with pytest.raises(TypeError, match="residual must be a torch.Tensor, got float"):
        ops.add_rmsnorm(x, 1.0, w, 1e-6)
    with pytest.raises(ValueError, match=r"residual must have x's shape \(2, 8\) \(or be"):
        ops.add_rmsnorm(x, torch.randn(2, 4), w, 1e-6)
    with pytest.raises(TypeError, match="residual must have x's dtype torch.float32, got torch.bf"):
        ops.add_rmsnorm(x, x.bfloat16(), w, 1e-6)
    with pytest.raises(ValueError, match=r"weight must be \[H=8\], got shape \(4,\)"):
        ops.add_rmsnorm(x, x, torch.ones(4), 1e-6)
    with pytest.raises(TypeError, match="weight must be one of float32, float16, bfloat16, got"):
        ops.add_rmsnorm(x, x, w.double(), 1e-6)
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        ops.add_rmsnorm(x, x, None, 1e-6)
    for bad in (float("nan"), float("inf"), -1e-6):
        with pytest.raises(ValueError, match=r"eps must be a finite number >= 0.0, got"):
            ops.add_rmsnorm(x, x, w, bad)
    for bad in ("1e-6", True, None):
        with pytest.raises(TypeError, match=r"eps must be a finite number >= 0.0, got"):
            ops.add_rmsnorm(x, x, w, bad)
    meta = torch.empty(2, 8, device="meta")
    with pytest.raises(ValueError, match="residual must be on x's device meta, got cpu"):
        ops.add_rmsnorm(meta, x, torch.ones(8, device="meta"), 1e-6)
    with pytest.raises(ValueError, match="weight must be on x's device meta, got cpu"):
        ops.add_rmsnorm(meta, None, w, 1e-6)
    with pytest.raises(ValueError, match="backend must be 'auto' or one of"):
        ops.add_rmsnorm(x, x, w, 1e-6, backend="no_such_backend")


def test_a_failed_call_writes_nothing():
    x, r, w = torch.randn(3, 16), torch.randn(3, 16), torch.ones(16)
    before = [t.clone() for t in (x, r, w)]
    with pytest.raises(ValueError):
        ops.add_rmsnorm(x, r, w, -1.0)
    assert all(bits_equal(a, b) for a, b in zip(before, (x, r, w), strict=True))


def _gpu_backend(backend):
    dev = torch.device("cuda")
    if backend not in backends.available_backends("add_rmsnorm", dev, torch.bfloat16):
        pytest.skip(f"{backend} cannot serve add_rmsnorm on this GPU")
    return dev


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("h", [2048, 1536, 96, 7, 10000])
def test_graph_capture_replay_gpu(backend, with_residual, h):
    """Captured in a CUDA graph (no host work, no allocation but the outputs), replayed on new
    inputs written in place: bit for bit what an eager call gives on them."""
    dev = _gpu_backend(backend)
    gen = torch.Generator(device=dev).manual_seed(11)
    x = torch.randn(8, h, generator=gen, device=dev).bfloat16()
    r = torch.randn(8, h, generator=gen, device=dev).bfloat16() if with_residual else None
    w = torch.randn(h, generator=gen, device=dev).float()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # build and load before capture, as torch recommends
        ops.add_rmsnorm(x, r, w, 1e-6, backend=backend)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, s = ops.add_rmsnorm(x, r, w, 1e-6, backend=backend)
    for _ in range(3):
        x.copy_(torch.randn(8, h, generator=gen, device=dev))
        if r is not None:
            r.copy_(torch.randn(8, h, generator=gen, device=dev))
        graph.replay()
        want_y, want_s = ops.add_rmsnorm(x, r, w, 1e-6, backend=backend)
        torch.cuda.synchronize()
        assert bits_equal(y, want_y) and bits_equal(s, want_s)
        assert (s is x) == (r is None)
    res = None if r is None else r.cpu()
    ft.check_add_rmsnorm_case(x.cpu(), res, w.cpu(), 1e-6, device=dev, backends=[backend])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_side_stream_gpu(backend):
    """The kernels launch on torch's current stream: inputs written by a long side-stream kernel
    are seen by a call queued behind it on that stream."""
    dev = _gpu_backend(backend)
    x = torch.zeros(64, 4096, device=dev, dtype=torch.bfloat16)
    r = torch.zeros_like(x)
    w = torch.ones(4096, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        big = torch.randn(4096, 4096, device=dev)
        for _ in range(8):  # keep the side stream busy so a wrong-stream launch would race
            big = big @ big / 64
        x.copy_(torch.randn(64, 4096, device=dev) + big[:64].sum() * 0)
        r.copy_(torch.randn(64, 4096, device=dev))
        y, s = ops.add_rmsnorm(x, r, w, 1e-6, backend=backend)
    side.synchronize()
    want_y, want_s = ops.add_rmsnorm(x.cpu(), r.cpu(), w.cpu(), 1e-6, backend="reference")
    assert bits_equal(s, want_s)
    bound = ft.add_rmsnorm_tolerance(want_s, w, 1e-6)
    assert bool(((y.float().cpu() - want_y.float()).abs() <= bound).all())

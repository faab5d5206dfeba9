"""quant_matmul on GGUF Q8_0 and the K-quants (docs/OPS.md section 11): the int8 reference is
the dot of the dequantized weights with the Q8_1 activations; every backend within
ftlab.testing.quant_matmul_tolerance of the reference (int8) or of the f64 product (dequant).
CPU: reference + Triton interpreter on small shapes; GPU (``gpu``): Triton and HIP, big shapes.
Kernel by kernel: hip's one-row matvecs in test_quant_matmul_hip_mv.py and test_quant_matmul_mv1.py,
Triton's in test_quant_matmul_triton_mv.py, the Triton dequant GEMM in
test_quant_matmul_dequant_gemm.py."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import backends, ops
from ftlab.quant import QTYPES, QuantWeight
from ftlab.reference import q4_0 as ref_q4_0
from ftlab.reference import quant_matmul as ref
from ftlab.reference.quants import dequantize
from ftlab.testing.quant_matmul import random_quant_weight

GPU = ["triton", "hip"]


@settings(max_examples=15)
@given(ft.quant_matmul_cases(ms=(1, 3), paths=("int8",)), st.sampled_from(ft.KQUANT_TYPES))
def test_int8_reference_is_the_dot_of_dequantized_values(case, qtype):
    """sum of the terms == dequantize(W) . dequantize(Q8_1(x)) up to fp32 rounding: the integer
    sub-block dots and the scales are those of the blocks' values."""
    w = random_quant_weight(7, qtype, case.w.shape[0], 512)
    x = case.x.float()[:, :1].expand(-1, 512) * torch.linspace(-1, 1, 512)
    x8 = ref_q4_0.quantize_q8_1(x)
    terms, parts = ref.block_terms(x8, w)
    want = x8.dequantize().double() @ dequantize(w, torch.float32).double().T
    bound = (terms.shape[-1] + 4) * 2.0**-23 * parts.sum(-1) + 1e-30
    assert bool(((terms.double().sum(-1) - want).abs() <= bound).all())


# 9 rows: two int8 passes of 8 rows, the second part-full
@given(ft.quant_matmul_cases(ms=(1, 3, 8, 9)))
def test_quant_matmul_cpu(case):
    ft.check_quant_matmul_case(case, "cpu")


@pytest.mark.parametrize("qtype", ft.KQUANT_TYPES)
@pytest.mark.parametrize("path", ["int8", "dequant"])
def test_zero_weights_give_zero(qtype, path):
    w = QuantWeight(
        torch.zeros(5, QTYPES[qtype].row_bytes(256), dtype=torch.uint8), (5, 256), qtype
    )
    x = torch.randn(3, 256)
    for name in backends.available_backends("quant_matmul", x.device, x.dtype, path):
        assert torch.equal(ops.quant_matmul(x, w, path=path, backend=name), torch.zeros(3, 5))


@pytest.mark.parametrize("qtype", ft.KQUANT_TYPES)
def test_extreme_scales_fp32(qtype):
    """Every scale the largest finite fp16: outputs far beyond fp16's range stay finite in fp32."""
    w = random_quant_weight(3, qtype, 9, 256, specials=(0x7BFF,), zero_rows=0)
    for path in ("int8", "dequant"):
        case = ft.QuantMatmulCase(torch.randn(2, 256) * 30, w, path)
        outs = ft.check_quant_matmul_case(case, "cpu")
        assert all(bool(torch.isfinite(o).all()) for o in outs.values())


@pytest.mark.parametrize(
    "rows, path", [(1, "auto"), (8, "auto"), (9, "auto"), (2, "dequant"), (20, "int8")]
)
def test_auto_path_and_q4_0_delegation(rows, path):
    x = torch.randn(rows, 64)
    w4 = ops.quantize_q4_0(torch.randn(6, 64))
    assert torch.equal(ops.quant_matmul(x, w4, path=path), ops.q4_0_matmul(x, w4, path=path))
    w8 = ops.quantize(torch.randn(6, 64), "Q8_0")
    chosen = "int8" if path == "auto" and rows <= backends.DECODE_MAX_TOKENS else path
    chosen = "dequant" if chosen == "auto" else chosen
    assert torch.equal(
        ops.quant_matmul(x, w8, path=path, backend="reference"), ref.quant_matmul(x, w8, chosen)
    )


def _unknown_type():
    w = random_quant_weight(0, "Q8_0", 2, 64)
    w.qtype = "IQ2_XS"
    return w


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (
            lambda: ops.quant_matmul(torch.randn(2, 512), random_quant_weight(0, "Q4_K", 3, 256)),
            ValueError,
            r"x must have K = 256 columns \(w is \(3, 256\)\), got 512",
        ),
        (
            lambda: ops.quant_matmul(
                torch.randn(2, 256, dtype=torch.float64), random_quant_weight(0, "Q6_K", 3, 256)
            ),
            TypeError,
            "x must be",
        ),
        (
            lambda: ops.quant_matmul(torch.randn(2, 256), torch.zeros(3, 256)),
            TypeError,
            "w must be a ftlab.quant.QuantWeight, got Tensor",
        ),
        (
            lambda: ops.quant_matmul(torch.randn(2, 64), _unknown_type()),
            ValueError,
            "w.qtype must be one of",
        ),
        (
            lambda: ops.quant_matmul(
                torch.randn(2, 2, 256), random_quant_weight(0, "Q5_K", 3, 256)
            ),
            ValueError,
            "x must be 2-D",
        ),
        (
            lambda: ops.quant_matmul(
                torch.randn(2, 256), random_quant_weight(0, "Q5_K", 3, 256), path="fp8"
            ),
            ValueError,
            "path must be 'auto' or one of",
        ),
        (
            lambda: ops.quant_matmul(
                torch.randn(2, 256),
                QuantWeight(torch.zeros(2, 3, 144, dtype=torch.uint8), (2, 3, 256), "Q4_K"),
            ),
            ValueError,
            r"w must be a 2-D QuantWeight",
        ),
    ],
)
def test_bad_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.gpu
@settings(max_examples=40)
@given(ft.quant_matmul_cases(ms=(1, 2, 5, 8, 17, 64), max_n=300, ks=(256, 512, 2048, 4096)))
def test_quant_matmul_gpu(case):
    ft.check_quant_matmul_case(
        case, "cuda", backends=["reference", *GPU] if case.path == "int8" else None
    )


@functools.cache
def _big_weight(qtype, n, k):
    return random_quant_weight(n + k, qtype, n, k).to("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ft.KQUANT_TYPES)
@pytest.mark.parametrize("n, k", [(2048, 4096), (5120, 2048), (151936, 2048)])
@pytest.mark.parametrize("m", [1, 8, 512])
def test_quant_matmul_big_shapes_gpu(qtype, n, k, m):
    w = _big_weight(qtype, n, k)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    for path in ("int8", "dequant"):
        if m == 512 and path == "int8" and n > 8192:
            continue  # the int8 reference of 512 x 151936 runs on the host for minutes
        ft.check_quant_matmul_case(ft.QuantMatmulCase(x, w, path), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ft.KQUANT_TYPES)
@pytest.mark.parametrize(
    "backend, path", [("triton", "int8"), ("triton", "dequant"), ("hip", "int8")]
)
@pytest.mark.parametrize("m", [1, 8, 64])
def test_graph_replay_gpu(qtype, backend, path, m):
    """A captured quant_matmul replayed with new activations equals the eager result, bit for
    bit."""
    w = random_quant_weight(m, qtype, 200, 512).to("cuda")
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 512, device="cuda", generator=g, dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.quant_matmul(x, w, path=path, backend=backend)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.quant_matmul(x, w, path=path, backend=backend)
    for _ in range(3):
        x.copy_(torch.randn(m, 512, device="cuda", generator=g, dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, ops.quant_matmul(x, w, path=path, backend=backend))

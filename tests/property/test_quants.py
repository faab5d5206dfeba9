"""dequantize of GGUF Q8_0 and the K-quants (docs/OPS.md section 7): the reference equals
gguf-py bit for bit on random blocks with every kind of fp16 scale, and every backend equals
the reference."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import ops
from ftlab.quant import QTYPES, Q4_0Weight, QuantWeight, quant_weight

gguf = pytest.importorskip("gguf")
GPU = ["triton", "hip"]


@given(ft.quant_weights())
def test_reference_equals_gguf_py(w):
    want = gguf.quants.dequantize(w.data.numpy(), gguf.GGMLQuantizationType[w.qtype]).astype(
        np.float32
    )
    got = ops.dequantize(w, backend="reference").numpy()
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@given(ft.quant_weights(), st.sampled_from(ft.FLOAT_DTYPES))
def test_dequantize_cpu(w, dtype):
    ft.check_quant_dequantize_case(w, dtype, "cpu")


@pytest.mark.gpu
@given(ft.quant_weights(max_rows=64, max_blocks=8), st.sampled_from(ft.FLOAT_DTYPES))
def test_dequantize_gpu(w, dtype):
    ft.check_quant_dequantize_case(w, dtype, "cuda", backends=["reference", *GPU])


@given(ft.q8_0_values())
def test_q8_0_quantize_reference_equals_gguf_py(w):
    want = gguf.quants.quantize(w.float().numpy(), gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(ops.quantize(w, "Q8_0", backend="reference").data.numpy(), want)


@given(ft.q8_0_values())
def test_q8_0_quantize_cpu(w):
    q = ft.check_q8_0_quantize_case(w, "cpu")
    # the round trip: within half a step of the fp32 scale, plus 127 times the scale's fp16
    # rounding (q is computed with d in fp32, the block stores d in fp16)
    back = ops.dequantize(q, backend="reference").view(*q.blocks.shape[:-1], 32).double()
    x = w.float().view_as(back).double()
    d32 = x.abs().amax(-1, keepdim=True) / 127
    d16 = q.blocks[..., :2].contiguous().view(torch.float16).double()
    bound = d32 * 0.5 * (1 + 1e-6) + 127 * (d32 - d16).abs() + 1e-45
    assert bool(((back - x).abs() <= bound).all())


@pytest.mark.gpu
@given(ft.q8_0_values(max_rows=200, max_blocks=40))
def test_q8_0_quantize_gpu(w):
    ft.check_q8_0_quantize_case(w, "cuda", backends=["reference", *GPU])


def test_q8_0_refuses_non_finite_and_names_the_types():
    w = torch.randn(2, 64)
    w[1, 40] = float("inf")
    with pytest.raises(ValueError, match=r"w must be finite for Q8_0, got inf at \(1, 40\)"):
        ops.quantize(w, "Q8_0")
    with pytest.raises(ValueError, match=r"qtype must be one of \('Q4_0', 'Q8_0'\), got 'Q6_K'"):
        ops.quantize(torch.randn(2, 256), "Q6_K")
    assert isinstance(ops.quantize(torch.randn(2, 64), "Q4_0"), Q4_0Weight)


def test_q4_0_goes_to_its_own_op():
    w = ops.quantize_q4_0(torch.randn(3, 64))
    assert torch.equal(ops.dequantize(w), ops.dequantize_q4_0(w))
    assert isinstance(quant_weight(w.data, (3, 64), "Q4_0"), Q4_0Weight)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (
            lambda: ops.dequantize(torch.zeros(2, 34, dtype=torch.uint8)),
            TypeError,
            "w must be a ftlab.quant.QuantWeight",
        ),
        (
            lambda: ops.dequantize(
                QuantWeight(torch.zeros(1, 34, dtype=torch.uint8), (1, 32), "Q8_0"), torch.int8
            ),
            TypeError,
            "dtype must be one of float32, float16, bfloat16",
        ),
        (
            lambda: QuantWeight(torch.zeros(1, 34, dtype=torch.uint8), (1, 32), "Q3_K"),
            ValueError,
            "qtype must be one of",
        ),
        (
            lambda: QuantWeight(torch.zeros(1, 144, dtype=torch.uint8), (1, 128), "Q4_K"),
            ValueError,
            "multiple of 256",
        ),
        (
            lambda: QuantWeight(torch.zeros(1, 143, dtype=torch.uint8), (1, 256), "Q4_K"),
            ValueError,
            r"\(1, 144\)",
        ),
        (
            lambda: QuantWeight(torch.zeros(1, 18, dtype=torch.uint8), (1, 32), "Q4_0"),
            TypeError,
            "Q4_0Weight",
        ),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_layouts_match_gguf():
    for name, qt in QTYPES.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == (qt.block, qt.nbytes), name

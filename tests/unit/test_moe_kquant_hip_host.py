"""moe_experts' HIP kernels on Q8_0 / K-quant banks (ftlab/hip/csrc/moe_kquant.hip) run on the CPU:
the device code compiled by the host C++ compiler against the host port.h of tests/unit/moe_vec_host
(a thread per GPU thread), the gate/up and down launches chained as ftlab/hip/moe.py chains them
(Q8_1 of x, then of h, by the reference quantizer), held to the int8 reference within
ftlab.testing.experts_tolerance. Catches layout and indexing mistakes without a GPU; the GPU
tests (test_moe.py, ``gpu``) run the real thing."""

import ctypes

import pytest
import torch
from host_build import CSRC, HOST_PORT, ROOT, build_harness

import ftlab.testing as ft
from ftlab import ops
from ftlab.reference.q4_0 import quantize_q8_1

CODE = {"Q8_0": 0, "Q4_K": 1, "Q5_K": 2, "Q6_K": 3, "Q4_0": 4}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    sources = [
        CSRC / n
        for n in (
            "q4_0_common.h",
            "moe_common.h",
            "quant_units.h",
            "quant_vec.h",
            "quant_records.h",
            "moe_kquant.hip",
        )
    ]
    sources += [HOST_PORT, ROOT / "tests/unit/moe_hip_host/harness_moe.cpp"]
    # the host port.h beside the real device headers, which include it
    return build_harness(tmp_path_factory.mktemp("moe_hip_host"), sources, "harness_moe.cpp")


@pytest.mark.parametrize(
    "gate, down, ids",
    [("Q4_K", "Q6_K", [[1, 0]]), ("Q5_K", "Q8_0", [[0, -1]]), ("Q4_0", "Q4_K", [[-1, 1]])],
)
def test_moe_kquant_hip_kernels_on_the_host(harness, gate, down, ids):
    """One token of top-2 over 2 experts (an invalid slot in two of the cases): every bank type's
    unit, as gate/up and as down between them."""
    gen = torch.Generator().manual_seed(len(gate + down))
    e, h, inter, t, k = 2, 256, 256, 1, 2
    x = torch.randn(t, h, generator=gen)
    weights, ids = torch.rand(t, k, generator=gen), torch.tensor(ids, dtype=torch.int32)
    gu = (
        ops.quantize_q4_0(torch.randn(e, 2 * inter, h, generator=gen) / 16)
        if gate == "Q4_0"
        else ft.random_quant_bank(1, gate, e, 2 * inter, h, magnitude=0.25)
    )
    dn = ft.random_quant_bank(2, down, e, h, inter, magnitude=0.25)

    def ptr(v):
        return ctypes.c_void_p(v.data_ptr())

    def i64(*vs):
        return [ctypes.c_int64(v) for v in vs]

    x8 = quantize_q8_1(x)
    hbuf = torch.full((t * k, inter), float("nan"))
    harness.run_gate_up(
        CODE[gate],
        ptr(x8.q),
        ptr(x8.d),
        ptr(x8.s),
        ptr(gu.data),
        *i64(gu.data.stride(0), gu.data.stride(1)),
        ptr(ids),
        ptr(hbuf),
        *i64(e, h, inter, t, k),
    )
    h8 = quantize_q8_1(hbuf)
    y = torch.full((t, h), float("nan"))
    harness.run_down(
        CODE[down],
        ptr(h8.q),
        ptr(h8.d),
        ptr(h8.s),
        ptr(dn.data),
        *i64(dn.data.stride(0), dn.data.stride(1)),
        ptr(ids),
        ptr(weights),
        ptr(y),
        *i64(e, h, inter, t, k),
    )
    want = ops.moe_experts(x, gu, dn, weights, ids, path="int8", backend="reference")
    bound = ft.experts_tolerance(x, gu, dn, weights, ids, "int8", want)
    assert bool(((y - want).abs() <= bound).all()), float((y - want).abs().max())

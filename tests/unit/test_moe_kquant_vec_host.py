"""moe_experts' HIP decode kernels on K-quant banks, the "vec" pair (moe_gate_up_kq_vec_kernel and
moe_down_kq_vec_kernel in ftlab/hip/csrc/moe_kquant.hip), and quant_matmul's one-launch one-row
matvecs (quant_mv1_fused_kernel and its staged form quant_mv1_staged_kernel, ftlab/hip/csrc/quant_mv_fused.hip), run on the CPU: the real device headers
(q4_0_common.h, moe_common.h, quant_units.h, quant_vec.h) compiled by the host C++ compiler
against the host port.h of tests/unit/moe_vec_host (a thread per GPU thread, a barrier per
32-lane group for the shuffles), the two launches chained as moe_kquant_launch.hip chains them,
held to the int8 reference within ftlab.testing.experts_tolerance (quant_matmul_tolerance for the
matvec). Catches layout, indexing and reduction mistakes without a GPU; the GPU tests
(test_moe_kquant.py, test_quant_matmul.py, ``gpu``) run the real thing."""

import ctypes

import pytest
import torch
from host_build import CSRC, HOST_PORT, ROOT, build_harness

import ftlab.testing as ft
from ftlab import ops
from ftlab.testing.quant_matmul import (
    FINITE_SPECIAL_F16,
    quant_matmul_tolerance,
    random_quant_weight,
)

CODE = {"Q4_K": 1, "Q5_K": 2, "Q6_K": 3}
FP = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    sources = [CSRC / n for n in ("q4_0_common.h", "moe_common.h", "quant_units.h", "quant_vec.h", "quant_records.h",
                                  "moe_kquant.hip", "quant_mv_fused.hip")]  # fmt: skip
    # the host port.h beside the real device headers, which include it
    return build_harness(tmp_path_factory.mktemp("moe_vec_host"),
                         [*sources, HOST_PORT, ROOT / "tests/unit/moe_vec_host/harness_vec.cpp"], "harness_vec.cpp")  # fmt: skip


@pytest.mark.parametrize(
    "gate, down, hidden, inter, ids, dtype",
    [
        # Q4_K_M's mix; I = 768: three super-blocks a down row (a part-filled step), an invalid slot
        ("Q4_K", "Q6_K", 512, 768, [[2, -1, 0], [1, 3, 2]], torch.bfloat16),
        # H = 2304: nine super-blocks a gate/up row, past the held activations (the long-row walk)
        ("Q5_K", "Q4_K", 2304, 256, [[1, 0]], torch.float32),
        # Q6_K gate/up (2-byte aligned super-blocks), Q5_K down, a token with every slot invalid
        ("Q6_K", "Q5_K", 256, 512, [[3, 0], [-1, -1]], torch.float16),
        # ten slots (a down block's groups take two slots each: j, j + 8), one of them invalid
        ("Q4_K", "Q4_K", 256, 256, [[4, 0, 9, 1, 11, -1, 2, 7, 3, 5]], torch.bfloat16),
    ],
)
def test_moe_kquant_vec_kernels_on_the_host(harness, gate, down, hidden, inter, ids, dtype):
    gen = torch.Generator().manual_seed(hidden + inter)
    ids = torch.tensor(ids, dtype=torch.int32)
    e = max(4, int(ids.max()) + 1)
    t, k = ids.shape
    weights = torch.rand(t, k, generator=gen)
    x = (torch.randn(t, hidden, generator=gen) * 2).to(dtype)
    gu = ft.random_quant_bank(hidden, gate, e, 2 * inter, hidden, magnitude=4 * hidden**-0.5)
    dn = ft.random_quant_bank(inter, down, e, hidden, inter, magnitude=4 * inter**-0.5)
    assert gu.data.data_ptr() % 16 == 0 and dn.data.data_ptr() % 16 == 0  # the kernels' alignment
    hq = torch.zeros(t * k, inter, dtype=torch.int8)
    hd, hs = torch.zeros(t * k, inter // 32), torch.zeros(t * k, inter // 32)
    y = torch.full((t, hidden), float("nan"), dtype=dtype)

    def ptr(v):
        return ctypes.c_void_p(v.data_ptr())

    harness.run_vec(FP[dtype], CODE[gate], CODE[down], ptr(x), ptr(gu.data),
                    ctypes.c_int64(gu.data.stride(0)), ctypes.c_int64(gu.data.stride(1)), ptr(dn.data),
                    ctypes.c_int64(dn.data.stride(0)), ctypes.c_int64(dn.data.stride(1)), ptr(ids), ptr(weights),
                    ptr(hq), ptr(hd), ptr(hs), ptr(y), e, hidden, inter, t, k)  # fmt: skip
    want = ops.moe_experts(x, gu, dn, weights, ids, path="int8", backend="reference")
    bound = ft.experts_tolerance(x, gu, dn, weights, ids, "int8", want)
    assert want.dtype == y.dtype
    err = (y.float() - want.float()).abs()
    assert bool((err <= bound).all()), float(err.max())
    # h as Q8_1 blocks: an invalid slot's blocks are zero
    for p, i in enumerate(ids.flatten().tolist()):
        if i < 0:
            assert not hq[p].any() and not hd[p].any() and not hs[p].any()


@pytest.mark.parametrize(
    "qtype, n, k, dtype, staged",
    [
        ("Q4_K", 37, 2048, torch.bfloat16, False),  # two steps held in registers, rows walked past the grid
        ("Q5_K", 21, 768, torch.float32, False),  # three super-blocks: a part-filled step
        ("Q6_K", 29, 1792, torch.bfloat16, False),  # seven: Q6_K's 2-byte aligned rows, a part-filled second step
        ("Q5_K", 9, 512, torch.float16, False),  # fp16 x and y (scales drawn small: the sums stay in fp16's range)
        ("Q6_K", 11, 2560, torch.bfloat16, False),  # ten super-blocks: the long-row walk, activations from LDS
        ("Q4_K", 5, 4096, torch.float32, False),  # an o_proj's K
        # the staged kernel: 100 rows over 16 groups (six or seven a group: its three-slot ring wraps twice)
        ("Q6_K", 100, 2048, torch.bfloat16, True),
        ("Q4_K", 53, 1280, torch.float16, True),  # five super-blocks: a part-filled second step
        ("Q5_K", 11, 768, torch.float32, True),  # fewer rows than groups: idle groups
    ],
)
def test_quant_mv_fused_on_the_host(harness, qtype, n, k, dtype, staged):
    # the special fp16 scales (up to 65504) give sums past fp16's range: subnormal ones for fp16
    specials = (0x0001, 0x03FF, 0x0400) if dtype == torch.float16 else FINITE_SPECIAL_F16
    w = random_quant_weight(n + k, qtype, n, k, specials=specials)
    assert w.data.data_ptr() % 16 == 0  # the kernel's alignment
    x = (torch.randn(1, k, generator=torch.Generator().manual_seed(n)) * 3).to(dtype)
    y = torch.full((1, n), float("nan"), dtype=dtype)
    harness.run_fused(FP[dtype], CODE[qtype], ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.data.data_ptr()),
                      ctypes.c_int64(w.data.shape[1]), ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(n), k, 2,
                      int(staged))  # fmt: skip
    exact, bound = quant_matmul_tolerance(x.float(), w, "int8", dtype)
    err = (y.float() - exact).abs()
    assert bool((err <= bound).all()), float(err.max())

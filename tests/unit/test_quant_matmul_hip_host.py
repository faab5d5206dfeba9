"""quant_matmul's HIP kernels (ftlab/hip/csrc/quant_matmul.hip, quant_matmul_tiled.hip) run on the
CPU: the device code compiled with the real q4_0_common.h by the host C++ compiler against the host
port.h of tests/unit/host (harness: tests/unit/hip_host), the matvec lane by lane and the GEMM with
a thread per GPU thread, held to the int8 reference within ftlab.testing.quant_matmul_tolerance.
Catches layout and indexing mistakes without a GPU; the GPU tests (test_quant_matmul.py,
test_quant_matmul_hip_mv.py, ``gpu``) run the real thing."""

import ctypes

import pytest
import torch
from host_build import CSRC, HOST_PORT, ROOT, build_harness

from ftlab.reference.q4_0 import quantize_q8_1
from ftlab.testing.quant_matmul import quant_matmul_tolerance, random_quant_weight

CODE = {"Q8_0": 0, "Q4_K": 1, "Q5_K": 2, "Q6_K": 3}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    sources = [
        CSRC / n
        for n in (
            "q4_0_common.h",
            "quant_units.h",
            "quant_vec.h",
            "quant_matmul.hip",
            "quant_matmul_tiled.hip",
        )
    ]
    # the host port.h beside the real device headers, which include it
    return build_harness(
        tmp_path_factory.mktemp("hip_host"),
        [*sources, HOST_PORT, ROOT / "tests/unit/hip_host/harness.cpp"],
        "harness.cpp",
    )


@pytest.mark.parametrize("qtype", list(CODE))
@pytest.mark.parametrize(
    "m, n, k",
    [
        (1, 9, 256),
        (1, 37, 2048),
        (1, 13, 2304),
        (3, 5, 2304),
        (8, 7, 512),
        (17, 70, 512),
        (70, 3, 2048),
    ],
)
def test_hip_kernels_on_the_host(harness, qtype, m, n, k):
    _check_on_the_host(harness, qtype, m, n, k, 0)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize(
    "m, n, k", [(1, 6, 768), (1, 37, 2048), (1, 7, 1792), (1, 5, 2560), (1, 29, 3584)]
)
def test_hip_vec_on_the_host(harness, qtype, m, n, k):
    """The one-row matvec's "vec" variant: eight lanes to a super-block, 16-byte pieces (K <= 2048:
    a lane's activations held across rows; beyond: walked two steps at a time). The harness runs
    12 groups, so N = 37 and 29 walk several rows a group; K = 1792 is seven super-blocks (a
    part-filled second step; Q6_K rows of 1470 bytes, so super-blocks start at every even offset
    mod 16), 2560 ten (a part-filled first step of the second pair), 3584 fourteen (a part-filled
    second step there)."""
    _check_on_the_host(harness, qtype, m, n, k, 1)


def _check_on_the_host(harness, qtype: str, m: int, n: int, k: int, variant: int) -> None:
    w = random_quant_weight(m * n + k, qtype, n, k)
    assert variant != 1 or w.data.data_ptr() % 16 == 0  # the vec kernel's w alignment
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + n)) * 3
    x8 = quantize_q8_1(x)
    y = torch.zeros(m, n)

    def ptr(t):
        return ctypes.c_void_p(t.data_ptr())

    harness.run(
        CODE[qtype],
        ptr(w.data),
        ctypes.c_int64(w.data.shape[1]),
        ptr(x8.q),
        ptr(x8.d),
        ptr(x8.s),
        ptr(y),
        ctypes.c_int64(m),
        ctypes.c_int64(n),
        ctypes.c_int64(k),
        ctypes.c_int(variant),
    )
    exact, bound = quant_matmul_tolerance(x, w, "int8", torch.float32)
    assert bool(((y - exact).abs() <= bound).all()), (y - exact).abs().max()


# (qtype, m, n, k, g, K splits, grid blocks): K a multiple of the super but not of the region
# (g supers), N not a multiple of the rows of a region, Q6_K rows with an odd number of 210-byte
# supers (2-byte aligned ones), fewer blocks than row sets (the grid walks them), splits with
# empty ranges, every M; w starts and ends 16-byte aligned, as the launcher requires.
TILED = [
    ("Q4_K", 1, 37, 768, 2, 1, 1),
    ("Q4_K", 8, 9, 1280, 4, 2, 2),
    ("Q5_K", 2, 35, 512, 1, 1, 1),
    ("Q5_K", 7, 6, 768, 8, 1, 1),
    ("Q6_K", 3, 40, 768, 1, 2, 1),
    ("Q6_K", 5, 11, 2048, 4, 1, 1),
    ("Q6_K", 8, 8, 256, 32, 1, 2),
    ("Q8_0", 4, 18, 384, 2, 1, 1),
    ("Q8_0", 6, 6, 640, 16, 1, 1),
    ("Q4_K", 1, 6, 2304, 1, 4, 1),
    ("Q8_0", 2, 10, 1152, 2, 3, 2),
]


@pytest.mark.parametrize("qtype, m, n, k, g, splits, grid", TILED)
def test_tiled_matvec_on_the_host(harness, qtype, m, n, k, g, splits, grid):
    w = random_quant_weight(m * n + k + g, qtype, n, k)
    assert w.data.numel() % 16 == 0
    buf = torch.zeros(w.data.numel() + 32, dtype=torch.uint8)
    base = (-buf.data_ptr()) % 16
    buf[base : base + w.data.numel()] = w.data.flatten()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + n + g)) * 3
    x8 = quantize_q8_1(x)
    part = torch.full((splits, m, n), float("nan"))

    def ptr(t, at=0):
        return ctypes.c_void_p(t.data_ptr() + at)

    harness.run_tiled(
        CODE[qtype],
        ptr(buf, base),
        ctypes.c_int64(w.data.shape[1]),
        ptr(x8.q),
        ptr(x8.d),
        ptr(x8.s),
        ptr(part),
        ctypes.c_int64(m),
        ctypes.c_int64(n),
        ctypes.c_int64(k),
        ctypes.c_int(g),
        ctypes.c_int(splits),
        ctypes.c_int(grid),
    )
    y = part.sum(0)
    exact, bound = quant_matmul_tolerance(x, w, "int8", torch.float32)
    assert bool(((y - exact).abs() <= bound).all()), (y - exact).abs().max()

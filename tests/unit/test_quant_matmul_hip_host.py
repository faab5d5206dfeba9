"""quant_matmul's HIP kernels (ftlab/hip/csrc/quant_matmul.hip) run on the CPU: the device code
compiled by the host C++ compiler against stand-ins for the GPU helpers (tests/unit/hip_host),
the matvec lane by lane and the GEMM with a thread per GPU thread, held to the int8 reference
within ftlab.testing.quant_matmul_tolerance. Catches layout and indexing mistakes without a GPU;
the GPU tests (test_quant_matmul.py, ``gpu``) run the real thing."""

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ftlab.reference.q4_0 import quantize_q8_1
from ftlab.testing.quant_matmul import quant_matmul_tolerance, random_quant_weight

ROOT = Path(__file__).resolve().parents[2]
CODE = {"Q8_0": 0, "Q4_K": 1, "Q5_K": 2, "Q6_K": 3}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    build = tmp_path_factory.mktemp("hip_host")
    for src in (
        ROOT / "ftlab/hip/csrc/quant_matmul.hip",
        *(ROOT / "tests/unit/hip_host").iterdir(),
    ):
        shutil.copy(
            src, build / src.name
        )  # beside the stand-in q4_0_common.h, which it then includes
    lib = build / "harness.so"
    res = subprocess.run([cxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-x", "c++",
                          str(build / "harness.cpp"), "-o", str(lib)], capture_output=True, text=True)  # fmt: skip
    if res.returncode:
        if "_Float16" in res.stderr or "barrier" in res.stderr:
            pytest.skip(f"{cxx} lacks C++20 barriers or _Float16")
        raise AssertionError(res.stderr[-3000:])
    return ctypes.CDLL(str(lib))


@pytest.mark.parametrize("qtype", list(CODE))
@pytest.mark.parametrize(
    "m, n, k", [(1, 9, 256), (3, 5, 2304), (8, 7, 512), (17, 70, 512), (70, 3, 2048)]
)
def test_hip_kernels_on_the_host(harness, qtype, m, n, k):
    w = random_quant_weight(m * n + k, qtype, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + n)) * 3
    x8 = quantize_q8_1(x)
    y = torch.zeros(m, n)

    def ptr(t):
        return ctypes.c_void_p(t.data_ptr())

    harness.run(CODE[qtype], ptr(w.data), ctypes.c_int64(w.data.shape[1]), ptr(x8.q), ptr(x8.d), ptr(x8.s), ptr(y),
                ctypes.c_int64(m), ctypes.c_int64(n), ctypes.c_int64(k))  # fmt: skip
    exact, bound = quant_matmul_tolerance(x, w, "int8", torch.float32)
    assert bool(((y - exact).abs() <= bound).all()), (y - exact).abs().max()

"""The HIP grouped GEMM on the matrix cores (ftlab/hip/csrc/moe_gemm.hip, moe_gemm_mma_kernel: fp16
/ bf16 expert banks, 16 x 16 x 16 products through mma.h) run on the CPU in the fragment and
accumulator layouts of the AMD targets, their instructions emulated (mma.h's FTLAB_MMA_EMULATE:
CDNA's MFMA in wave64, RDNA4's and RDNA3's WMMA in wave32) -- layouts that no GPU of ours runs. The
device code and the real headers compiled by the host C++ compiler against the host port.h of
tests/unit/host (harness: tests/unit/moe_hip_host/harness_gemm.cpp), a thread per GPU thread. Rows
come sorted by expert as moe_align makes them (the reference's), padded to block_m; each output is
held to the f64 product within the fp32 sum's bound over K plus the output's rounding. On NVIDIA the
GPU tests (tests/property/test_moe.py, ``gpu``) run the mma.sync layout."""

import ctypes

import pytest
import torch
from host_build import CSRC, HOST_PORT, ROOT, build_harness

from ftlab.reference.moe import moe_align
from ftlab.testing.common import ulp

LAYOUTS = {
    "cdna-mfma": ["PORT_WARP_SIZE=64", "FTLAB_MMA_EMULATE=1"],
    "rdna4-wmma": ["PORT_WARP_SIZE=32", "FTLAB_MMA_EMULATE=2"],
    "rdna3-wmma": ["PORT_WARP_SIZE=32", "FTLAB_MMA_EMULATE=3"],
}
EPS32 = 2.0**-24


@pytest.fixture(scope="module", params=list(LAYOUTS))
def harness(request, tmp_path_factory):
    sources = [
        CSRC / "q4_0_common.h",
        CSRC / "mma.h",
        CSRC / "moe_common.h",
        CSRC / "moe_gemm.hip",
        HOST_PORT,
        ROOT / "tests/unit/moe_hip_host/harness_gemm.cpp",
    ]
    build = tmp_path_factory.mktemp(f"moe_gemm_host_{request.param}")
    lib = build_harness(build, sources, "harness_gemm.cpp", LAYOUTS[request.param])
    i32, i64, ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    lib.run_mma.argtypes = [
        i32,
        i32,
        i32,
        ptr,
        i64,
        ptr,
        i64,
        i64,
        ptr,
        ptr,
        ptr,
        ptr,
        ptr,
        i64,
        i32,
        i64,
        i64,
        i32,
    ]
    return lib


def _ptr(t: torch.Tensor):
    return ctypes.c_void_p(t.data_ptr())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gated, bm", [(True, 32), (False, 64), (True, 64)])
def test_grouped_gemm_on_the_matrix_cores(harness, dtype, gated, bm):
    """Tokens 40 x top-2 over 3 experts (one expert idle; ~27 rows an expert, so several row tiles
    and partly filled blocks), K = 192 (three K steps), N = 80 (a partial block of columns);
    gate/up: h = silu(x . gate) * (x . up) in x's dtype; down: the pair's weight times h . w in
    fp32."""
    gen = torch.Generator().manual_seed(bm + gated)
    tokens, top_k, experts, k, n = 40, 2, 4, 192, 80
    ids = torch.randint(0, experts - 1, (tokens, top_k), generator=gen)  # expert 3 gets no rows
    pairs = tokens * top_k
    sorted_ids, expert_ids, npad = moe_align(ids, experts, bm)
    rows_in = tokens if gated else pairs  # gate/up reads token p // top_k, down reads pair p
    a = (torch.randn(rows_in, k, generator=gen) * 0.5).to(dtype)
    bank = (torch.randn(experts, (2 if gated else 1) * n, k, generator=gen) * 0.1).to(dtype)
    wts = torch.rand(pairs, generator=gen)
    out = torch.full((pairs, n), float("nan"), dtype=dtype if gated else torch.float32)
    harness.run_mma(
        int(dtype == torch.bfloat16),
        int(gated),
        bm,
        _ptr(a),
        a.stride(0),
        _ptr(bank),
        bank.stride(0),
        bank.stride(1),
        _ptr(sorted_ids),
        _ptr(expert_ids),
        _ptr(npad),
        _ptr(wts),
        _ptr(out),
        pairs,
        top_k,
        n,
        k,
        expert_ids.numel(),
    )
    e = ids.reshape(-1)
    x = a.double()[torch.arange(pairs) // top_k] if gated else a.double()
    w = bank.double()[e]  # [pairs, (2) N, K]
    prod = torch.einsum("pk,pnk->pn", x, w)
    mag = torch.einsum("pk,pnk->pn", x.abs(), w.abs()) * k * EPS32  # the fp32 sum over K
    if gated:
        g, u, eg, eu = prod[:, :n], prod[:, n:], mag[:, :n], mag[:, n:]
        want = g * torch.sigmoid(g) * u
        # silu's slope is within 1.1; silu, its product and the exp within a few eps32 of the result
        bound = (
            1.1 * eg * u.abs()
            + (g * torch.sigmoid(g)).abs() * eu
            + eg * eu
            + 8 * EPS32 * want.abs()
        )
        bound = bound + ulp((want.abs() + bound).float(), dtype).double()
    else:
        want = wts.double()[:, None] * prod
        bound = wts.double()[:, None] * mag + 2 * EPS32 * want.abs()
    err = (out.double() - want).abs()
    assert not out.isnan().any(), "an output the kernel should have written was left"
    assert bool((err <= bound).all()), float((err / bound).max())

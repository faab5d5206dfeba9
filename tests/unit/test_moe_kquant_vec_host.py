"""moe_experts' HIP decode kernels on K-quant banks, the "vec" pair (moe_gate_up_kq_vec_kernel and
moe_down_kq_vec_kernel in ftlab/hip/csrc/moe_kquant.hip), and quant_matmul's one-launch one-row
matvecs (quant_mv1_fused_kernel, its staged form quant_mv1_staged_kernel and the long rows'
quant_mv1_sliced_kernel, ftlab/hip/csrc/quant_matmul_mv1.hip), run on the CPU: the real device
headers (q4_0_common.h, moe_common.h, quant_units.h, quant_vec.h) compiled by the host C++ compiler
against the host port.h of tests/unit/moe_vec_host (a thread per GPU thread, a barrier per 32-lane
group for the shuffles), the two launches chained as moe_kquant_launch.hip chains them, held to the
int8 reference within ftlab.testing.experts_tolerance (quant_matmul_tolerance for the matvec).
Catches layout, indexing and reduction mistakes without a GPU; the GPU tests (test_moe_kquant.py,
test_quant_matmul_hip_mv.py, test_quant_matmul_mv1.py, ``gpu``) run the real thing."""

import ctypes
import mmap

import pytest
import torch
from host_build import CSRC, HOST_PORT, ROOT, build_harness

import ftlab.testing as ft
from ftlab import ops
from ftlab.quant import quant_weight
from ftlab.testing.q4_0 import matmul_tolerance as q4_0_matmul_tolerance
from ftlab.testing.quant_matmul import (
    FINITE_SPECIAL_F16,
    quant_matmul_tolerance,
    random_quant_weight,
)

CODE = {"Q4_K": 1, "Q5_K": 2, "Q6_K": 3, "Q4_0": 4, "Q8_0": 5}
FP = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


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
            "quant_matmul_mv1.hip",
        )
    ]
    # the host port.h beside the real device headers, which include it
    return build_harness(
        tmp_path_factory.mktemp("moe_vec_host"),
        [*sources, HOST_PORT, ROOT / "tests/unit/moe_vec_host/harness_vec.cpp"],
        "harness_vec.cpp",
    )


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

    harness.run_vec(
        FP[dtype],
        CODE[gate],
        CODE[down],
        ptr(x),
        ptr(gu.data),
        ctypes.c_int64(gu.data.stride(0)),
        ctypes.c_int64(gu.data.stride(1)),
        ptr(dn.data),
        ctypes.c_int64(dn.data.stride(0)),
        ctypes.c_int64(dn.data.stride(1)),
        ptr(ids),
        ptr(weights),
        ptr(hq),
        ptr(hd),
        ptr(hs),
        ptr(y),
        e,
        hidden,
        inter,
        t,
        k,
    )
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
    "qtype, n, k, dtype, variant",
    [
        # two steps held in registers, rows walked past the grid
        (
            "Q4_K",
            37,
            2048,
            torch.bfloat16,
            "fused",
        ),
        ("Q5_K", 21, 768, torch.float32, "fused"),  # three super-blocks: a part-filled step
        # seven: Q6_K's 2-byte aligned rows, a part-filled second step
        (
            "Q6_K",
            29,
            1792,
            torch.bfloat16,
            "fused",
        ),
        # fp16 x and y (scales drawn small: the sums stay in fp16's range)
        (
            "Q5_K",
            9,
            512,
            torch.float16,
            "fused",
        ),
        # ten super-blocks: the long-row walk, activations from LDS
        (
            "Q6_K",
            11,
            2560,
            torch.bfloat16,
            "fused",
        ),
        ("Q4_K", 5, 4096, torch.float32, "fused"),  # an o_proj's K
        # the staged kernel: 100 rows over 16 groups (six or seven a group: its three-slot ring
        # wraps twice)
        ("Q6_K", 100, 2048, torch.bfloat16, "staged"),
        ("Q4_K", 53, 1280, torch.float16, "staged"),  # five super-blocks: a part-filled second step
        ("Q5_K", 11, 768, torch.float32, "staged"),  # fewer rows than groups: idle groups
        # the sliced kernel, 2 blocks. K = 14336: 56 super-blocks, 8 groups a row (slices 0..6 full,
        # slice 7 empty), one row a round; 19 rows: 10 and 9 rounds a block (a second set of rounds,
        # short of eight)
        ("Q4_K", 19, 14336, torch.bfloat16, "sliced"),
        # 48: 8 groups, two slices empty; 19 / 18 rounds: 3 sets
        (
            "Q6_K",
            37,
            12288,
            torch.float32,
            "sliced",
        ),
        # 24: 4 groups a row (the fourth slice empty), 2 rows a round
        (
            "Q5_K",
            13,
            6144,
            torch.float32,
            "sliced",
        ),
        # 16: 2 groups a row, 4 rows a round: 6 rounds a block
        (
            "Q5_K",
            45,
            4096,
            torch.float16,
            "sliced",
        ),
        # nine super-blocks: the second slice holds one
        (
            "Q6_K",
            7,
            2304,
            torch.bfloat16,
            "sliced",
        ),
        # a group a row: 8 rows a round, 5 and 4 rounds a block
        (
            "Q4_K",
            70,
            1024,
            torch.float32,
            "sliced",
        ),
        ("Q4_K", 3, 1024, torch.float32, "sliced"),  # 3 rows: the second block has none
        # Q4_0 / Q8_0 in groups of eight blocks (the last block's piece is 16-byte aligned and ends
        # the group)
        ("Q4_0", 37, 2048, torch.bfloat16, "fused"),
        ("Q4_0", 11, 2560, torch.float32, "fused"),  # the long-row walk
        ("Q4_0", 100, 2048, torch.float16, "staged"),
        ("Q4_0", 19, 14336, torch.bfloat16, "sliced"),
        # 20 groups of eight blocks: 4 groups a row, the third half full
        (
            "Q4_0",
            21,
            5120,
            torch.bfloat16,
            "sliced",
        ),
        ("Q8_0", 29, 1792, torch.bfloat16, "fused"),
        ("Q8_0", 9, 4608, torch.float32, "fused"),
        ("Q8_0", 23, 12288, torch.float16, "sliced"),
        # the sliced kernel given x's Q8_1 (no records: each lane reads its slice's activations from
        # memory)
        ("Q4_K", 19, 14336, torch.bfloat16, "sliced_q8"),
        ("Q6_K", 13, 6144, torch.float32, "sliced_q8"),
        ("Q5_K", 45, 4096, torch.float16, "sliced_q8"),
        ("Q4_0", 21, 5120, torch.bfloat16, "sliced_q8"),
        ("Q8_0", 70, 1024, torch.float32, "sliced_q8"),
    ],
)
def test_quant_mv_fused_on_the_host(harness, qtype, n, k, dtype, variant):
    """Each case within its int8 bound; the weights end at an unreadable page (a read past them
    faults), y is followed by NaN that must stay (no write past N), and the threads that add the
    slices' sums sleep after every block barrier (the host port.h's stress mode), so that the
    other groups run ahead into the next set of sums."""
    # the special fp16 scales (up to 65504) give sums past fp16's range: subnormal ones for fp16
    specials = (0x0001, 0x03FF, 0x0400) if dtype == torch.float16 else FINITE_SPECIAL_F16
    w = random_quant_weight(n + k, qtype, n, k, specials=specials)
    w = quant_weight(_fenced(w.data), w.shape, qtype)
    assert w.data.data_ptr() % 16 == 0  # the kernel's alignment
    # fp16: x drawn smaller the longer the row (the same at K = 512), so the sums stay in its range
    scale = 3 * min(1.0, (512 / k) ** 0.5) if dtype == torch.float16 else 3
    x = (torch.randn(1, k, generator=torch.Generator().manual_seed(n)) * scale).to(dtype)
    y_all = torch.full((1, n + 64), float("nan"), dtype=dtype)
    y = y_all[:, :n]
    # "sliced_q8" reads it (the others quantize x themselves)
    x8 = ops.quantize_q8_1(x, backend="reference")
    status = harness.run_fused(
        FP[dtype],
        CODE[qtype],
        *(ctypes.c_void_p(t.data_ptr()) for t in (x, x8.q, x8.d, x8.s)),
        ctypes.c_void_p(w.data.data_ptr()),
        ctypes.c_int64(w.data.shape[1]),
        ctypes.c_void_p(y.data_ptr()),
        ctypes.c_int64(n),
        k,
        2,
        ("fused", "staged", "sliced", "sliced_q8").index(variant),
        64,
    )
    assert status == 0
    assert bool(y_all[:, n:].isnan().all())  # nothing written past row N - 1
    if qtype == "Q4_0":
        exact = ops.q4_0_matmul(x.float(), w, path="int8", backend="reference")
        bound = q4_0_matmul_tolerance(x.float(), w, "int8", dtype)
    else:
        exact, bound = quant_matmul_tolerance(x.float(), w, "int8", dtype)
    err = (y.float() - exact).abs()
    assert bool((err <= bound).all()), float(err.max())


def test_no_staged_q8_0_on_the_host(harness):
    """The device build has no staged Q8_0 kernel (its LDS slots would pass 48 KiB): the harness
    refuses it as the launcher does."""
    x, y = torch.zeros(1, 256), torch.zeros(1, 1)
    w = torch.zeros(1, 272, dtype=torch.uint8)
    none = ctypes.c_void_p(0)
    assert (
        harness.run_fused(
            0,
            CODE["Q8_0"],
            ctypes.c_void_p(x.data_ptr()),
            none,
            none,
            none,
            ctypes.c_void_p(w.data_ptr()),
            ctypes.c_int64(272),
            ctypes.c_void_p(y.data_ptr()),
            ctypes.c_int64(1),
            256,
            1,
            1,
            0,
        )
        == -1
    )


_MAPS = []  # the fenced buffers' mappings, kept for the session


def _fenced(data: torch.Tensor) -> torch.Tensor:
    """``data`` copied into anonymous memory whose next page is made unreadable (mprotect
    PROT_NONE), the copy 16-byte aligned and ending at most 15 bytes before that page: a kernel
    that reads past the last row's bytes (beyond those few) faults."""
    page = mmap.PAGESIZE
    nbytes = data.numel()
    size = -(-(nbytes + 16) // page) * page + page
    buf = mmap.mmap(-1, size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    # PROT_NONE
    assert libc.mprotect(ctypes.c_void_p(base + size - page), page, 0) == 0, ctypes.get_errno()
    start = (size - page - nbytes) // 16 * 16
    _MAPS.append(buf)
    out = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=start).view(data.shape)
    out.copy_(data)
    return out

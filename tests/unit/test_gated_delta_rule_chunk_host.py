"""The chunked gated delta rule prefill's HIP kernels (ftlab/hip/csrc/gated_delta_rule_chunk.hip:
the prep and the scan on mma.h's 16 x 16 x 16 bf16 product, fp32 operands in three bf16 planes) run
on the CPU: the device code, mma.h and the real q4_0_common.h compiled by the host C++ compiler
against the host port.h of tests/unit/host (harness:
tests/unit/gated_delta_rule_host/harness_chunk.cpp), a thread per GPU thread, in four builds
(LAYOUTS): mma.h's scalar path, and the fragment and accumulator layouts of CDNA's MFMA (wave64),
RDNA4's and RDNA3's WMMA with the instruction emulated -- the AMD layouts, which no GPU of ours
runs, each caught a planted mistake in mma.h's rows, columns or fragment offsets. Held to the exact
recurrence within ftlab.testing.gated_delta_tolerance(chunk_size=64) -- the bound every chunked
backend meets -- with bf16 q, k, v. The planes' arithmetic on the host is that of the GPU (bf16
parts of fp32 values, fp32 sums); the GPU's products sum in another order, which the bound allows.
The bound is loose enough to pass a state kept in one bf16 plane, so the cases also hold the three
planes' fp32-class accuracy (ftlab.testing.assert_three_plane_accuracy). The one-plane kernels
(``precision="bf16"``: each fp32 operand rounded to bf16 once) are held to the bound with
``operands="bf16"`` and to ftlab.testing.assert_one_plane_accuracy. The GPU tests
(tests/property/test_gated_delta_rule_hip_chunk.py, ``gpu``) run the real thing."""

import ctypes
import mmap

import pytest
import torch
from host_build import CSRC, HOST_PORT, ROOT, build_harness

import ftlab.testing as ft
from ftlab.testing.gated_delta_bounds import gated_delta_exact_and_tolerance

#: the harness's builds: mma.h's scalar path in 32-lane groups (8 a block, 8 accumulators a lane
#: of a tile), and the AMD matrix instructions' own fragment layouts, the instruction emulated
#: (mma.h's FTLAB_MMA_EMULATE): CDNA's MFMA in wave64 (4 groups, 4 accumulators), RDNA4's and
#: RDNA3's WMMA in wave32 -- the layouts no GPU of ours runs
LAYOUTS = {
    "scalar": ["PORT_WARP_SIZE=32"],
    "cdna-mfma": ["PORT_WARP_SIZE=64", "FTLAB_MMA_EMULATE=1"],
    "rdna4-wmma": ["PORT_WARP_SIZE=32", "FTLAB_MMA_EMULATE=2", "FTLAB_CK_LEAN=1"],
    "rdna3-wmma": ["PORT_WARP_SIZE=32", "FTLAB_MMA_EMULATE=3", "FTLAB_CK_LEAN=1"],
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The harness of a layout, built once a module."""
    sources = [
        CSRC / "q4_0_common.h",
        CSRC / "mma.h",
        CSRC / "gated_delta_rule_chunk.h",
        CSRC / "gated_delta_rule_chunk.hip",
        CSRC / "gated_delta_rule_chunk_prep.hip",
        HOST_PORT,
        ROOT / "tests/unit/gated_delta_rule_host/harness_chunk.cpp",
    ]
    built = {}

    def get(layout: str):
        if layout not in built:
            build = tmp_path_factory.mktemp(f"gated_delta_rule_chunk_host_{layout}")
            built[layout] = build_harness(build, sources, "harness_chunk.cpp", LAYOUTS[layout])
        return built[layout]

    return get


@pytest.fixture
def harness(request, builds):
    """The harness in the layout named by the test's ``harness`` parameter."""
    return builds(request.param)


def _ptr(t: torch.Tensor):
    return ctypes.c_void_p(t.data_ptr())


def _fenced(x: torch.Tensor) -> torch.Tensor:
    """x copied to the end of anonymous memory whose next page is unreadable (mprotect PROT_NONE):
    a kernel that reads an element past x's last faults."""
    page, nbytes = mmap.PAGESIZE, x.numel() * x.element_size()
    size = -(-nbytes // page) * page + page
    buf = mmap.mmap(-1, size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    assert libc.mprotect(ctypes.c_void_p(base + size - page), page, 0) == 0, ctypes.get_errno()
    out = torch.frombuffer(buf, dtype=torch.uint8, offset=size - page - nbytes, count=nbytes)
    out = out.view(x.dtype).view(x.shape)
    out.copy_(x)
    return out


def _inputs(b, t, hk, hv, dk, dv, l2norm, seed, gscale, state):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, hk, dk, generator=gen).bfloat16()
    k = (torch.randn(b, t, hk, dk, generator=gen) * (1.0 if l2norm else dk**-0.5)).bfloat16()
    v = torch.randn(b, t, hv, dv, generator=gen).bfloat16()
    g = -torch.nn.functional.softplus(torch.randn(b, t, hv, generator=gen)) * gscale
    beta = torch.sigmoid(torch.randn(b, t, hv, generator=gen))
    s0 = torch.randn(b, hv, dk, dv, generator=gen) * 0.5 if state else torch.zeros(b, hv, dk, dv)
    return (*(_fenced(x) for x in (q, k, v, g, beta)), s0)


def _run(harness, q, k, v, g, beta, s0, scale, l2norm, late=0, planes=3):
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2:]
    nt = (t + 63) // 64
    # scratch of NaN, as long as the planes need: a read of what the prep did not write shows
    ab = _fenced(torch.full((b * hv * nt * planes * 64 * 64,), float("nan"), dtype=torch.bfloat16))
    attn, sc = _fenced(ab.clone()), torch.full((b * hv * nt * 4 * 64,), float("nan"))
    o = torch.full((b, t, hv, dv), float("nan")).bfloat16()
    got = _fenced(s0)  # the state read as far as its last element, no further
    harness.run_chunk(
        _ptr(q),
        _ptr(k),
        _ptr(v),
        _ptr(g),
        _ptr(beta),
        _ptr(got),
        _ptr(o),
        _ptr(ab),
        _ptr(attn),
        _ptr(sc),
        b,
        t,
        hk,
        hv,
        dk,
        dv,
        ctypes.c_float(scale),
        int(l2norm),
        late,
        planes,
    )
    return o, got


#: (b, t, hk, hv, dk, dv, l2norm, seed, gscale, state); the first three run in every layout, the
#: rest in the scalar build only (the emulated instructions are slower on the host, and these cases
#: vary the data, not the tiles' layout)
CASES = [
    (1, 64, 1, 2, 128, 32, True, 0, 1.0, True),  # one whole chunk, Qwen3.6's head sizes
    (1, 150, 1, 2, 128, 40, True, 1, 1.0, True),  # a partial last chunk, a partial column block
    (1, 5, 1, 6, 16, 8, True, 7, 1.0, True),  # T < 16; six value heads a key head: two prep blocks
    (1, 130, 2, 2, 100, 37, False, 3, 1.0, True),  # Dk < 128 padded, no norm
    (2, 70, 1, 1, 32, 16, True, 5, 0.01, False),  # slow decay, from zeros, two sequences
    (1, 66, 2, 8, 64, 32, True, 9, 3.0, True),  # eight value heads over two key heads, fast decay
]
#: three planes: the first three cases in every layout, the rest in the scalar build; one plane:
#: every case in the scalar build, the second (a partial chunk and column block) in the others
PARAMS = [
    (layout, case, 3)
    for layout in LAYOUTS
    for i, case in enumerate(CASES)
    if i < 3 or layout == "scalar"
] + [
    (layout, case, 1)
    for layout in LAYOUTS
    for i, case in enumerate(CASES)
    if i == 1 or layout == "scalar"
]


@pytest.mark.parametrize("harness, case, planes", PARAMS, indirect=["harness"])
def test_chunked_prefill_on_the_host(harness, case, planes):
    b, t, hk, hv, dk, dv, l2norm, seed, gscale, state = case
    q, k, v, g, beta, s0 = _inputs(b, t, hk, hv, dk, dv, l2norm, seed, gscale, state)
    scale = dk**-0.5
    o, got = _run(harness, q, k, v, g, beta, s0, scale, l2norm, planes=planes)
    exact_o, exact_s, o_bound, s_bound = gated_delta_exact_and_tolerance(
        q, k, v, g, beta, s0, scale, l2norm, 64, operands="fp32" if planes == 3 else "bf16"
    )
    err_o, err_s = (o.double() - exact_o).abs(), (got.double() - exact_s).abs()
    assert bool((err_o <= o_bound).all()), float((err_o / o_bound).max())
    assert bool((err_s <= s_bound).all()), float((err_s / s_bound).max())
    (ft.assert_three_plane_accuracy if planes == 3 else ft.assert_one_plane_accuracy)(
        o, got, exact_o, exact_s
    )
    # one plane's error, not three's (~1e-7): the template the harness asked for ran
    if planes == 1:
        assert float((got.double() - exact_s).norm() / exact_s.norm()) > 1e-4


# 32 / 64 lanes, lean
@pytest.mark.parametrize(
    "harness, planes",
    [("scalar", 3), ("cdna-mfma", 3), ("rdna3-wmma", 3), ("cdna-mfma", 1)],
    indirect=["harness"],
)
def test_chunked_prefill_with_late_readers(harness, planes):
    """The stress mode: the first 64 threads of a block (a wave of gfx9, two warps elsewhere) sleep
    after every barrier, so a phase that wrote LDS another still read -- the scan's regions alias
    across its four phases -- would show; the bits must equal an ordinary run's."""
    q, k, v, g, beta, s0 = _inputs(1, 80, 1, 2, 64, 40, True, 11, 1.0, True)
    o, s = _run(harness, q, k, v, g, beta, s0, 0.125, True, planes=planes)
    o_late, s_late = _run(harness, q, k, v, g, beta, s0, 0.125, True, late=64, planes=planes)
    assert torch.equal(o.view(torch.int16), o_late.view(torch.int16))
    assert torch.equal(s, s_late)


#: the hostile decays: every one in the scalar build at both precisions (Qwen3.6's Dk, six value
#: heads over two prep blocks, three chunks), one each in two AMD layouts on a smaller case
HOSTILE = [("scalar", p, h, (1, 150, 1, 6, 128, 40)) for p in (3, 1) for h in ft.HOSTILE_DECAYS]
HOSTILE += [
    ("cdna-mfma", 3, "nan", (1, 70, 1, 2, 64, 32)),
    ("rdna3-wmma", 1, "-inf", (1, 70, 1, 2, 64, 32)),
]


@pytest.mark.parametrize("harness, planes, hostile, dims", HOSTILE, indirect=["harness"])
def test_hostile_decays_on_the_host(harness, planes, hostile, dims):
    """A NaN or +inf g reaches its token and the later ones only (the earlier ones the same bits),
    -inf and -1e30 are full forgets within the bound (ft.check_hostile_decays): the prep's floor
    and its selects of L and fk, the scan carrying the NaN through fq, fx and e^c_last."""
    case = _inputs(*dims, True, 13, 1.0, True)
    scale = dims[4] ** -0.5

    def run(q, k, v, g, beta, state):
        inputs = (_fenced(x) for x in (q, k, v, g, beta))
        return _run(harness, *inputs, state, scale, True, planes=planes)

    operands = "fp32" if planes == 3 else "bf16"
    name = f"{planes} planes"
    ft.check_hostile_decays(
        run, case, hostile, chunk_size=64, operands=operands, scale=scale, name=name
    )

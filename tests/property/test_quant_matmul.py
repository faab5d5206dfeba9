"""quant_matmul on GGUF Q8_0 and the K-quants (docs/OPS.md section 11): the int8 reference is
the dot of the dequantized weights with the Q8_1 activations; every backend within
ftlab.testing.quant_matmul_tolerance of the reference (int8) or of the f64 product (dequant).
CPU: reference + Triton interpreter on small shapes; GPU (``gpu``): Triton and HIP, big shapes."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import backends, ops
from ftlab.backends import calls
from ftlab.quant import QTYPES, QuantWeight
from ftlab.reference import q4_0 as ref_q4_0
from ftlab.reference import quant_matmul as ref
from ftlab.reference.quants import dequantize
from ftlab.testing.common import assert_within
from ftlab.testing.quant_matmul import quant_matmul_tolerance, random_quant_weight

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


@given(
    ft.quant_matmul_cases(ms=(1, 3, 8, 9))
)  # 9 rows: two int8 passes of 8 rows, the second part-full
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


def _hip_or_refused(x, w, variant, **kw):
    """hip's quant_matmul of x by ``variant`` ("held", "staged", "sliced": mv1's stagings), or
    None where the planner's tables say it cannot serve -- and then the entry must refuse it."""
    from ftlab.hip import quant_matmul as hip_qmm

    name, staging = (
        ("mv1", variant)
        if variant in ("held", "staged", "sliced", "sliced_q8")
        else (variant, None)
    )
    if name is not None and backends.why_not(
        "quant_matmul", "hip", name, calls.matmul(x, w), staging=staging
    ):
        with pytest.raises(backends.BackendUnavailable):
            hip_qmm.quant_matmul(x, w, "int8", variant=name, staging=staging, **kw)
        return None
    return hip_qmm.quant_matmul(x, w, "int8", variant=name, staging=staging, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ft.KQUANT_TYPES)
@pytest.mark.parametrize(
    "variant, g, splits, offset",
    [
        ("lanes", None, None, 0),
        ("vec", None, None, 0),
        ("vec", None, None, 4),
        ("tiled", 1, 1, 0),
        ("tiled", 2, None, 0),
        ("tiled", 4, 1, 0),
        ("tiled", 4, None, 0),
        ("tiled", 8, 2, 0),
        ("tiled", 32, None, 0),
        (None, None, None, 4),
        ("held", None, None, 0),
        ("held", None, None, 4),
        ("staged", None, None, 0),
        ("sliced", None, None, 0),
        ("sliced", None, None, 4),
    ],
)
def test_hip_matvec_variants_gpu(qtype, variant, g, splits, offset):
    """Every HIP matvec variant and region shape, with and without K splits (None: the default
    rule, which splits at this N), M = 1..8, N not a multiple of G = 1's 32 rows, K not a
    multiple of G supers, Q6_K rows of an odd number of supers (N a multiple of 8 keeps their
    total 16-byte aligned); and the default route on a weight view 4 bytes past an aligned
    address (tiled, vec and mv1 need 16: the planner gives it lanes). A variant that cannot take
    a call (tiled at one row, the one-row kernels at several, staged past K = 2048, an unaligned
    view) is refused, never swapped."""
    n, k = 304, 2304
    w = random_quant_weight(n + len(qtype), qtype, n, k)
    buf = torch.zeros(w.data.numel() + 16, dtype=torch.uint8, device="cuda")
    buf[offset : offset + w.data.numel()] = w.data.flatten().to("cuda")
    wv = QuantWeight(buf[offset : offset + w.data.numel()].view(n, -1), (n, k), qtype)
    for m in range(1, 9):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to("cuda") * 3
        y = _hip_or_refused(x, wv, variant, g=g, splits=splits)
        if y is not None:
            exact, bound = quant_matmul_tolerance(x, wv, "int8", torch.float32)
            assert bool(((y - exact).abs() <= bound).all()), (m, (y - exact).abs().max())


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ft.KQUANT_TYPES)
@pytest.mark.parametrize("variant", ["lanes", "vec", "held", "staged", "sliced"])
@pytest.mark.parametrize("k", [1280, 2048, 4096, 5120])
def test_hip_m1_variants_gpu(qtype, variant, k):
    """hip's one-row matvecs where their branches differ: K = 1280 (lanes partly idle; Q6_K
    super-blocks at every even offset mod 16) and 2048 (activations held in registers), 4096 and
    5120 (walked; vec: two whole step pairs, then one with its second step empty); within the
    int8 bound. mv1 "held" (one launch, x quantized in every block) walks the same branches;
    "staged" takes K = 1280 (Q4_K / Q5_K) and 2048 and is refused elsewhere, as vec is on Q8_0."""
    w = random_quant_weight(k + len(qtype), qtype, 300, k).to("cuda")
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k)).to("cuda") * 3
    y = _hip_or_refused(x, w, variant)
    if y is not None:
        exact, bound = quant_matmul_tolerance(x, w, "int8", torch.float32)
        assert bool(((y - exact).abs() <= bound).all()), (y - exact).abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n, k", [(4608, 2048), (2048, 4096), (37, 8192)])
def test_hip_fused_matvec_dtypes_gpu(qtype, dtype, n, k):
    """The one-launch matvec in x's 16-bit dtype at the decode projections' shapes (and K at its
    8192 limit): y in x's dtype within the int8 bound (which adds the output's rounding), and for
    Q4_K / Q5_K the bits of the three-launch "vec" path (the same Q8_1 of x, terms and sums) rounded
    to that dtype (Q6_K's one-launch kernels cut a super-block in quads, not vec's eighths: other
    partial sums, held to the bound only)."""
    from ftlab.hip import quant_matmul as hip_qmm

    w = random_quant_weight(n + k, qtype, n, k, specials=(0x0001, 0x0400)).to("cuda")
    scale = 3.0 if dtype == torch.bfloat16 else 0.02  # fp16: sums well inside its range (65504)
    x = (torch.randn(1, k, generator=torch.Generator().manual_seed(k)) * scale).to("cuda", dtype)
    assert backends.why_not("quant_matmul", "hip", "mv1", calls.matmul(x, w)) is None
    y = hip_qmm.quant_matmul(x, w, "int8", variant="mv1", staging="held")
    assert y.dtype == dtype and y.shape == (1, n)
    exact, bound = quant_matmul_tolerance(x.float(), w, "int8", dtype)
    assert bool(((y.float() - exact).abs() <= bound).all()), (y.float() - exact).abs().max()
    assert torch.equal(
        y, hip_qmm.quant_matmul(x, w, "int8", variant="mv1", staging="held")
    )  # the same bits again
    if qtype != "Q6_K":
        assert torch.equal(y, hip_qmm.quant_matmul(x, w, "int8", variant="vec"))


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n, k", [(37, 2048), (20000, 2048), (5120, 768)])
def test_hip_staged_matvec_gpu(qtype, dtype, n, k):
    """The staged one-row matvec (rows copied into LDS slots asynchronously): the bits of "fused"
    (the same sums in the same order) and within the int8 bound, at a few rows (most groups idle),
    20000 rows (each group walks ~5 rows: its three-slot ring wraps) and K = 768 (three
    super-blocks, a part-filled step; Q6_K's 630-byte rows are not whole 16-byte pieces, so it takes
    "fused" there)."""
    from ftlab.hip import quant_matmul as hip_qmm

    w = random_quant_weight(n + k, qtype, n, k, specials=(0x0001, 0x0400)).to("cuda")
    scale = 0.02 if dtype == torch.float16 else 3.0  # fp16: sums well inside its range (65504)
    x = (torch.randn(1, k, generator=torch.Generator().manual_seed(k)) * scale).to("cuda", dtype)
    serves = qtype != "Q6_K" or k == 2048  # Q6_K's rows are whole 16-byte pieces at K = 2048 only
    if not serves:  # refused, never swapped
        with pytest.raises(backends.BackendUnavailable, match="16-byte pieces"):
            hip_qmm.quant_matmul(x, w, "int8", variant="mv1", staging="staged")
        return
    y = hip_qmm.quant_matmul(x, w, "int8", variant="mv1", staging="staged")
    assert y.dtype == dtype and y.shape == (1, n)
    exact, bound = quant_matmul_tolerance(x.float(), w, "int8", dtype)
    assert bool(((y.float() - exact).abs() <= bound).all()), (y.float() - exact).abs().max()
    assert torch.equal(y, hip_qmm.quant_matmul(x, w, "int8", variant="mv1", staging="held"))


@pytest.mark.gpu
def test_hip_staged_matvec_entry_checks_gpu():
    """quant_mv_staged's own checks: K up to 2048, rows of whole 16-byte pieces."""
    from ftlab import jit

    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    module = jit.module_for("quant_matmul", x.device)
    w = random_quant_weight(0, "Q4_K", 64, 4096).to("cuda")
    y = torch.empty(1, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"up to 2048 \(the staged matvec\), got K = 4096"):
        module.quant_mv_staged(x, w.data, 1, y)
    w6 = random_quant_weight(0, "Q6_K", 64, 1024).to("cuda")
    with pytest.raises(ValueError, match="multiple of 16 bytes .*got 840 bytes a row"):
        module.quant_mv_staged(x[:, :1024].contiguous(), w6.data, 3, y)
    with pytest.raises(ValueError, match=r"w must be \[N, 1152\] for K = 2048"):
        module.quant_mv_staged(x[:, :2048].contiguous(), w6.data, 1, y)
    w8 = random_quant_weight(0, "Q8_0", 64, 2048).to("cuda")  # Q8_0 has no staged form
    with pytest.raises(ValueError, match=r"Q6_K or Q4_0 weights \(codes 1..4\), got code 5"):
        module.quant_mv_staged(x[:, :2048].contiguous(), w8.data, 5, y)


@pytest.mark.gpu
def test_one_row_plan_gpu():
    """A one-row K-quant matvec's plan on this GPU: hip's one-launch kernels on the int8 path
    (auto included) for a projection-sized weight and the Q4_K and Q6_K lm_heads, never on the
    dequant path (hip has none); Q8_0 on NVIDIA Triton's (hip's default there is three
    launches)."""
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    proj = random_quant_weight(1, "Q4_K", 512, 2048).to("cuda")
    big4 = QuantWeight(
        torch.zeros(65536, 1152, dtype=torch.uint8, device="cuda"), (65536, 2048), "Q4_K"
    )
    big6 = QuantWeight(
        torch.zeros(65536, 1680, dtype=torch.uint8, device="cuda"), (65536, 2048), "Q6_K"
    )
    nvidia = torch.version.hip is None
    for path in ("auto", "int8"):
        for w in (proj, big4, big6):
            got = backends.plan("quant_matmul", calls.matmul(x, w), path=path)
            assert got.backend == "hip" and got.variant == "mv1", got
    q8 = random_quant_weight(2, "Q8_0", 512, 2048).to("cuda")
    assert backends.plan("quant_matmul", calls.matmul(x, q8), path="int8").backend == (
        "triton" if nvidia else "hip"
    )
    assert backends.plan("quant_matmul", calls.matmul(x, proj), path="dequant").backend != "hip"


@pytest.mark.gpu
def test_hip_fused_matvec_entry_checks_gpu():
    """quant_mv_fused's checks name the argument, what it expects and what came."""
    from ftlab import jit

    w = random_quant_weight(0, "Q4_K", 64, 512).to("cuda")
    x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
    module = jit.module_for("quant_matmul", x.device)
    y = torch.empty(1, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="codes 1..5\\), got code 0"):
        module.quant_mv_fused(x, w.data, 0, y)
    with pytest.raises(ValueError, match="codes 1..5\\), got code 6"):
        module.quant_mv_fused(x, w.data, 6, y)
    with pytest.raises(ValueError, match=r"w must be \[N, 420\] for K = 512"):
        module.quant_mv_fused(x, w.data, 3, y)
    with pytest.raises(
        ValueError, match=r"K a multiple of 256 up to 8192 \(the fused matvec\), got K = 384"
    ):
        module.quant_mv_fused(x[:, :384].contiguous(), w.data, 1, y)
    with pytest.raises(ValueError, match="in x's dtype"):
        module.quant_mv_fused(x, w.data, 1, y.float())


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


def test_dequant_gemm_rows_misaligned_or_strided_cpu(monkeypatch):
    """x as a view with a row stride that is not a multiple of 16 and a start that is not
    16-byte aligned: the kernel is launched on an aligned copy (rows_16; the compile check's
    specialization assumes it) and gives the contiguous input's result; an aligned contiguous x
    is launched as it is."""
    import ftlab.triton.quant_matmul as tqm
    from ftlab.triton.q4_0_common import rows_16

    launched = []
    real = tqm.quant_dequant_gemm_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(x, *args, **kwargs):
                launched.append((x.data_ptr(), x.stride(0)))
                return real[grid](x, *args, **kwargs)

            return launch

    monkeypatch.setattr(tqm, "quant_dequant_gemm_kernel", Spy())
    w = ft.random_quant_bank(11, "Q4_K", 1, 40, 256)
    w = QuantWeight(w.data[0], (40, 256), "Q4_K")
    big = torch.randn(5, 256 + 3, generator=torch.Generator().manual_seed(2)).to(torch.float16)
    x = big[:, 1:257]
    assert x.data_ptr() % 16 != 0 and x.stride(0) % 16 != 0
    c = x.contiguous()
    want = ops.quant_matmul(c, w, path="dequant", backend="triton")
    got = ops.quant_matmul(x, w, path="dequant", backend="triton")
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert launched[0] == (c.data_ptr(), 256)  # the contiguous one as it is
    assert launched[1][0] % 16 == 0 and launched[1][1] % 16 == 0 and launched[1][0] != x.data_ptr()
    y = rows_16(x)
    assert y.data_ptr() % 16 == 0 and y.stride(0) % 16 == 0 and torch.equal(y, x)
    assert rows_16(c) is c


@pytest.mark.parametrize(
    "qtype, n, k", [("Q4_K", 40, 512), ("Q5_K", 72, 256), ("Q6_K", 40, 512), ("Q8_0", 40, 96)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dequant_gemm_pair_steps_cpu(qtype, n, k, dtype):
    """The dense GEMM's 64-weight steps (BLOCK_K 64: dequant_pair; the interpreter's table takes
    32-column steps) within the dequant bound of the exact product, with a partial column block
    (N % 32 != 0) and, for Q8_0, K % 64 == 32 (a last step of one block)."""
    import ftlab.triton.quant_matmul as tqm

    w = ft.random_quant_bank(5, qtype, 1, n, k)
    w = QuantWeight(w.data[0], (n, k), qtype)
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(k)).to(dtype)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}
    got = tqm.quant_dequant_gemm(x, w, cfg)
    want, bound = quant_matmul_tolerance(x, w, "dequant", dtype)
    assert bool(((got.double() - want).abs() <= bound).all()), float(
        (got.double() - want).abs().max()
    )
    torch.testing.assert_close(
        got, tqm.quant_dequant_gemm(x, w), rtol=0, atol=0
    )  # = the 32-column steps


@pytest.mark.parametrize(
    "qtype, n, k", [("Q4_K", 40, 512), ("Q5_K", 33, 256), ("Q6_K", 40, 512), ("Q8_0", 40, 96)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dequant_gemm_scales_per_weight_cpu(monkeypatch, qtype, n, k, dtype):
    """The dense GEMM with each weight's scales decoded for it (dequant_tile without ROW_SCALES:
    RDNA's steps) gives, in 32-column steps, bit for bit what the steps with each row's scales
    decoded once give (the interpreter's), and in 64-column steps (two blocks or sub-blocks a
    step) stays within the dequant bound of the exact product; a partial column block included."""
    import ftlab.triton.quant_matmul as tqm

    w = ft.random_quant_bank(5, qtype, 1, n, k)
    w = QuantWeight(w.data[0], (n, k), qtype)
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(k)).to(dtype)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
    once_a_row = tqm.quant_dequant_gemm(x, w, cfg)
    monkeypatch.setattr(tqm, "row_scales", lambda arch: False)
    torch.testing.assert_close(
        tqm.quant_dequant_gemm(x, w, cfg), once_a_row, rtol=0, atol=0, equal_nan=True
    )
    got = tqm.quant_dequant_gemm(x, w, {**cfg, "BLOCK_K": 64})
    want, bound = quant_matmul_tolerance(x, w, "dequant", dtype)
    assert bool(((got.double() - want).abs() <= bound).all()), float(
        (got.double() - want).abs().max()
    )


@pytest.mark.parametrize("n, k", [(40, 96), (33, 256)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dequant_gemm_q4_0_pair_steps_cpu(n, k, dtype):
    """Q4_0 weights in the dense GEMM's 64-weight steps (dequant_pair's Q4_0 branch; what
    q4_0_matmul's Triton dequant path takes where GEMM_CONFIGS["q4_0"] has tiles) within the
    dequant bound of the exact product, K % 64 == 32 included; without BLOCK_K 64 tiles the
    GEMM refuses Q4_0 (its other steps do not decode it)."""
    import ftlab.triton.quant_matmul as tqm

    gen = torch.Generator().manual_seed(n + k)
    w = ops.quantize_q4_0(torch.randn(n, k, generator=gen) * k**-0.5)
    x = torch.randn(7, k, generator=gen).to(dtype)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}
    got = tqm.quant_dequant_gemm(x, w, cfg)
    want = ops.q4_0_matmul(x, w, path="dequant", backend="reference")
    assert_within(
        "triton", "Q4_0 64-weight steps", got, want, ft.matmul_tolerance(x, w, "dequant", dtype)
    )
    with pytest.raises(ValueError, match="64-weight steps only"):
        tqm.quant_dequant_gemm(x, w)  # the interpreter has no Q4_0 tiles
    with pytest.raises(ValueError, match="64-weight steps only"):
        tqm.quant_dequant_gemm(x, w, {**cfg, "BLOCK_K": 32})
    assert tqm.q4_0_config(torch.bfloat16, "sm_90")["BLOCK_K"] == 64
    assert (
        tqm.q4_0_config(torch.float32, "sm_90") is None
        and tqm.q4_0_config(torch.float16, "gfx1100") is None
    )

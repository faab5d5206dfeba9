"""hip's quant_matmul matvecs (``ftlab.hip.quant_matmul``, docs/OPS.md section 11) on the GPU,
variant by variant: the three-launch ones (lanes, vec, tiled regions with and without K
splits) and the one-launch "mv1" (held, staged, sliced) at one to eight rows, in 16-bit and fp32
activations, within the int8 bound (ftlab.testing.quant_matmul_tolerance); a variant that
cannot take a call is refused, never swapped; the entries' own checks; the planner's choice of
a one-row matvec. mv1's sliced stagings at the long rows they are for, and on Q4_0 / Q8_0:
test_quant_matmul_mv1.py."""

import pytest
import torch

import ftlab.testing as ft
from ftlab import backends
from ftlab.backends import calls
from ftlab.quant import QuantWeight
from ftlab.testing.quant_matmul import quant_matmul_tolerance, random_quant_weight


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
    # the same bits again
    assert torch.equal(y, hip_qmm.quant_matmul(x, w, "int8", variant="mv1", staging="held"))
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

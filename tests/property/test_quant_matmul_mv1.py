"""hip's one-launch one-row matvec ("mv1") on long rows and on Q4_0 / Q8_0
(``ftlab.hip.quant_matmul``:
its "sliced" stagings, and its held / staged / sliced ones on groups of eight Q4_0 / Q8_0 blocks:
csrc/quant_matmul_mv1.hip, csrc/quant_records.h), on the GPU, within the int8 bounds. The host
harness (tests/unit/test_moe_kquant_vec_host.py) runs the same kernels on the CPU."""

import pytest
import torch

from ftlab import backends, ops
from ftlab.backends import calls
from ftlab.testing.quant_matmul import quant_matmul_tolerance, random_quant_weight


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "n, k", [(4096, 14336), (2048, 4096), (37, 16384), (20000, 2304), (300, 1024)]
)
@pytest.mark.parametrize("staging", ["sliced", "sliced_q8"])
def test_hip_sliced_matvec_gpu(qtype, dtype, n, k, staging):
    """The sliced one-row matvec (a row's slices of 8 super-blocks held by 1, 2, 4 or 8 lane
    groups): within the int8 bound at the long rows it is for (14336: 56 super-blocks, 8 groups a
    row, slices 0..6 full and slice 7 empty; 16384 at its limit, 37 blocks of one row each),
    4096 (2 groups a row), 2304 (2 groups, the second holding one super-block; 20000 rows: a
    dozen rounds a block, more than one set of eight) and 1024 (a group a row); the same bits when
    called again (fixed-order sums). "sliced_q8" is given x's Q8_1 by its own launch: the same
    activations, so the same bits as "sliced"."""
    from ftlab.hip import quant_matmul as hip_qmm

    w = random_quant_weight(n + k, qtype, n, k, specials=(0x0001, 0x0400)).to("cuda")
    scale = 0.02 if dtype == torch.float16 else 3.0  # fp16: sums well inside its range (65504)
    x = (torch.randn(1, k, generator=torch.Generator().manual_seed(k)) * scale).to("cuda", dtype)
    assert backends.why_not("quant_matmul", "hip", "mv1", calls.matmul(x, w)) is None
    y = hip_qmm.quant_matmul(x, w, "int8", variant="mv1", staging=staging)
    assert y.dtype == dtype and y.shape == (1, n)
    exact, bound = quant_matmul_tolerance(x.float(), w, "int8", dtype)
    assert bool(((y.float() - exact).abs() <= bound).all()), (y.float() - exact).abs().max()
    assert torch.equal(y, hip_qmm.quant_matmul(x, w, "int8", variant="mv1", staging="sliced"))


@pytest.mark.gpu
def test_hip_sliced_matvec_entry_checks_gpu():
    """quant_mv_sliced's own checks: K a multiple of 256 up to 16384; "sliced" past that is
    refused."""
    from ftlab import jit
    from ftlab.hip import quant_matmul as hip_qmm

    x = torch.randn(1, 16640, device="cuda", dtype=torch.bfloat16)
    module = jit.module_for("quant_matmul", x.device)
    w = random_quant_weight(0, "Q4_K", 64, 16640).to("cuda")
    y = torch.empty(1, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"up to 16384 \(the sliced matvec\), got K = 16640"):
        module.quant_mv_sliced(x, w.data, 1, y)
    with pytest.raises(backends.BackendUnavailable, match="K = 16640"):  # refused, never swapped
        hip_qmm.quant_matmul(x, w, "int8", variant="mv1", staging="sliced")
    exact, bound = quant_matmul_tolerance(x.float(), w, "int8", x.dtype)
    got = hip_qmm.quant_matmul(x, w, "int8").float()  # the default there: "vec"
    assert bool(((got - exact.to("cuda")).abs() <= bound.to("cuda")).all())
    # quant_mv_sliced_q8: x's Q8_1 checked, y's dtype is the output's
    x8 = ops.quantize_q8_1(x[:, :2048].contiguous(), backend="hip")
    w2 = random_quant_weight(0, "Q4_K", 64, 2048).to("cuda")
    with pytest.raises(ValueError, match=r"d8 must be fp32 \[1, 64\] for K = 2048"):
        module.quant_mv_sliced_q8(x8.q, x8.d[:, :32].contiguous(), x8.s, w2.data, 1, y)
    with pytest.raises(ValueError, match="q8 must be int8"):
        module.quant_mv_sliced_q8(x8.d, x8.d, x8.s, w2.data, 1, y)
    with pytest.raises(TypeError, match="y must be float32, float16 or bfloat16"):
        module.quant_mv_sliced_q8(x8.q, x8.d, x8.s, w2.data, 1, y.int())
    y16 = torch.empty(1, 64, device="cuda", dtype=torch.float16)
    # any float y: fp16 here, from bf16 x's Q8_1
    module.quant_mv_sliced_q8(x8.q, x8.d, x8.s, w2.data, 1, y16)
    # the same values quantized
    y32 = hip_qmm.quant_matmul(x[:, :2048].float(), w2, "int8", variant="mv1", staging="sliced")
    assert torch.equal(y16, y32.to(torch.float16))  # the fp32 sums rounded once, as torch rounds


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
@pytest.mark.parametrize("staging", ["held", "staged", "sliced", "sliced_q8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n, k", [(4096, 14336), (20000, 2048), (300, 2560), (37, 1024)])
def test_hip_one_row_q4_0_q8_0_gpu(qtype, staging, dtype, n, k):
    """Q4_0 and Q8_0 in groups of eight blocks through the one-launch one-row kernels, within
    their int8 bounds (Q4_0: q4_0_matmul's), every row. Where a staging does not apply (staged
    past K = 2048 or on Q8_0, held past 8192) it is refused, never swapped."""
    from ftlab.hip import quant_matmul as hip_qmm
    from ftlab.testing.q4_0 import matmul_tolerance as q4_0_tolerance

    w = random_quant_weight(n + k, qtype, n, k, specials=(0x0001, 0x0400)).to("cuda")
    scale = 0.02 if dtype == torch.float16 else 3.0  # fp16: sums well inside its range (65504)
    x = (torch.randn(1, k, generator=torch.Generator().manual_seed(k)) * scale).to("cuda", dtype)
    applies = {
        "held": k <= 8192,
        "staged": k <= 2048 and qtype != "Q8_0",
        "sliced": True,
        "sliced_q8": True,
    }[staging]
    if not applies:
        with pytest.raises(backends.BackendUnavailable):
            hip_qmm.quant_matmul(x, w, "int8", variant="mv1", staging=staging)
        return
    if qtype == "Q4_0":
        y = hip_qmm.q4_0_one_row(x, w, staging)
        exact = ops.q4_0_matmul(x.float(), w, path="int8", backend="reference").cpu()
        bound = q4_0_tolerance(x.float(), w, "int8", dtype)
    else:
        y = hip_qmm.quant_matmul(x, w, "int8", variant="mv1", staging=staging)
        exact, bound = quant_matmul_tolerance(x.float(), w, "int8", dtype)
    assert y.dtype == dtype and y.shape == (1, n)
    err = (y.float().cpu() - exact.cpu()).abs()
    assert bool((err <= bound.cpu()).all()), float(err.max())

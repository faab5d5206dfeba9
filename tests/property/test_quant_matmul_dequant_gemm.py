"""The Triton dense GEMM of quant_matmul's dequant path (``ftlab.triton.quant_matmul``'s
quant_dequant_gemm, docs/OPS.md section 11) on the CPU, in the interpreter: its launch on an
aligned copy of a misaligned or strided x, its 64-weight steps, its scales decoded per weight
(RDNA's steps) and its Q4_0 steps, each within the dequant bound of the exact product
(ftlab.testing.quant_matmul_tolerance / matmul_tolerance)."""

import pytest
import torch

import ftlab.testing as ft
from ftlab import ops
from ftlab.quant import QuantWeight
from ftlab.testing.common import assert_within
from ftlab.testing.quant_matmul import quant_matmul_tolerance


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
    # = the 32-column steps
    torch.testing.assert_close(got, tqm.quant_dequant_gemm(x, w), rtol=0, atol=0)


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

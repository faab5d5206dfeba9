"""The RMSNorms of ftlab -- gated_rmsnorm, add_rmsnorm, the q / k norms of qk_norm_rope -- on rows
whose squares overflow fp32 (a finite |x| >= ~2^64 / sqrt(D): x^2 summed in fp32 was inf, the
factor 0, the row all zeros): every backend within the op's bound of the exact result, rows with
an inf as before (NaN there, zeros beside), and the reference's ordinary rows with the bits of the
plain formula (ftlab.reference.norm; the HIP kernels on the CPU: tests/unit/test_norm_host.py)."""

import pytest
import torch
import torch.nn.functional as F

import ftlab.testing as ft
from ftlab import ops
from ftlab.models.layers import rope_tables
from ftlab.testing.common import assert_within
from ftlab.testing.norm import overflow_rows, rms_exact

CASES = [("cpu", "reference"), ("cpu", "triton")] + [
    pytest.param("cuda", b, marks=pytest.mark.gpu, id=f"cuda-{b}")
    for b in ("reference", "triton", "hip")
]
DTYPES = [torch.float32, torch.bfloat16]


def within(name: str, got: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor) -> None:
    d = got.shape[-1]
    assert_within(name, "y", got.reshape(-1, d), exact.reshape(-1, d).float(), bound.reshape(-1, d))


@pytest.mark.parametrize("device, backend", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rmsnorm_of_huge_rows(device, backend, dtype):
    x = overflow_rows((3, 4, 64), dtype, 1)
    z = (torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(2)) * 2).to(dtype)
    w = 1 + 0.25 * torch.randn(64, generator=torch.Generator().manual_seed(3))
    got = ops.gated_rmsnorm(x.to(device), z.to(device), w.to(device), 1e-6, backend=backend).cpu()
    exact = rms_exact(x, 1e-6) * w.double() * F.silu(z.double())
    within(backend, got, exact, ft.gated_rmsnorm_tolerance(x, z, w, 1e-6))


@pytest.mark.parametrize("device, backend", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
# 1536: the long rows of Triton's two passes, hip's V = 1 past its cache
@pytest.mark.parametrize("h", [64, 1536])
def test_add_rmsnorm_of_huge_rows(device, backend, dtype, h):
    x = overflow_rows((4, h), dtype, 4)
    w = (1 + 0.25 * torch.randn(h, generator=torch.Generator().manual_seed(5))).to(dtype)
    for residual in (None, (x * 0.5).to(dtype)):
        res = None if residual is None else residual.to(device)
        y, s = ops.add_rmsnorm(x.to(device), res, w.to(device), 1e-6, backend=backend)
        s = s.cpu()
        exact = rms_exact(s, 1e-6) * w.double()
        within(backend, y.cpu(), exact, ft.add_rmsnorm_tolerance(s, w, 1e-6))


@pytest.mark.parametrize("device, backend", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rope_of_huge_rows(device, backend, dtype):
    q, k = overflow_rows((2, 4, 64), dtype, 6), overflow_rows((2, 8, 64), dtype, 7)
    qw, kw = (
        1 + 0.25 * torch.randn(64, generator=torch.Generator().manual_seed(s)) for s in (8, 9)
    )
    cos, sin = rope_tables(torch.arange(3, 5)[None], 32, 1e4, dtype)
    args = [t.to(device) for t in (q, k, qw, kw, cos, sin)]
    got = ops.qk_norm_rope(*args, 1e-6, rotary_dim=32, backend=backend)
    for x, w, out in ((q, qw, got[0]), (k, kw, got[1])):
        # the weights cast to q's dtype, as the op casts them
        y = rms_exact(x, 1e-6) * w.to(dtype).double()
        c, s = cos.double().reshape(2, 1, 32), sin.double().reshape(2, 1, 32)
        rotated = y[..., :32] * c + torch.roll(y[..., :32], 16, dims=-1) * s
        exact = torch.cat([rotated, y[..., 32:]], -1)
        within(
            backend, out.cpu(), exact, ft.qk_norm_rope_tolerance(x, w.to(dtype), cos, sin, 1e-6, 32)
        )


@pytest.mark.parametrize("device, backend", CASES)
def test_a_row_with_an_inf_is_as_before(device, backend):
    """inf / inf: NaN where the inf is, zeros beside it, as the plain formula gives."""
    x = torch.zeros(2, 64)
    x[0] = 1e20
    x[:, 5] = float("inf")
    w = torch.ones(64)
    outs = [
        ops.add_rmsnorm(x.to(device), None, w.to(device), 1e-6, backend=backend)[0],
        ops.gated_rmsnorm(
            x[:, None].to(device),
            torch.ones(2, 1, 64, device=device),
            w.to(device),
            1e-6,
            backend=backend,
        ).reshape(2, 64),
    ]
    for y in outs:
        y = y.cpu()
        assert y[:, 5].isnan().all() and (y[:, :5] == 0).all() and (y[:, 6:] == 0).all(), y


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_reference_keeps_the_plain_formula_bits(dtype):
    """Rows whose squares fit in fp32 (the largest |x| up to 1e18 here) give the bits they gave
    before the overflow's branch: torch's RMSNorm, and the norms written out."""
    gen = torch.Generator().manual_seed(10)
    x = (torch.randn(8, 4, 128, generator=gen) * torch.logspace(-20, 18, 8)[:, None, None]).to(
        dtype
    )
    w = (1 + 0.25 * torch.randn(128, generator=gen)).to(dtype)
    y, _ = ops.add_rmsnorm(x.reshape(32, 128), None, w, 1e-6, backend="reference")
    assert torch.equal(y, F.rms_norm(x.reshape(32, 128), (128,), w, 1e-6))
    xf = x.float()
    plain = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    z = torch.randn(8, 4, 128, generator=gen).to(dtype)
    gated = ops.gated_rmsnorm(x, z, w.float(), 1e-6, backend="reference")
    assert torch.equal(gated, (plain * (z.float() * torch.sigmoid(z.float()))).to(dtype))
    ones, zeros = torch.ones(8, 128, dtype=dtype), torch.zeros(8, 128, dtype=dtype)
    qo, _ = ops.qk_norm_rope(x, x, w, w, ones, zeros, 1e-6, backend="reference")
    assert torch.equal(qo, plain.to(dtype))

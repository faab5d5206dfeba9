"""Tolerance and case check of the residual add fused with RMSNorm (``ops.add_rmsnorm``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftlab import ops
from ftlab.bitview import bits_equal
from ftlab.testing.common import assert_within, backends_for, ulp

EPS32 = 2.0**-23


def add_rmsnorm_tolerance(s: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-element bound ``[N, H]`` on |backend y - reference y|, derived in f64 from the exact
    result on the rounded sum ``s`` (bit-exact in every backend, so both sides start from it).

    Each side in fp32: the sum of H squares (non-negative terms, any order or tree) within
    ``(H - 1) eps32`` relatively and its squares, the division by H and the ``+ eps`` within 3
    eps32 more, so ``(H + 2) eps32`` for the mean square; the reciprocal square root halves that
    and adds 2 eps32 (a square root and a division, or an rsqrt within 2 ulps); the two products
    ``s * r * weight`` 2 eps32 -- all relative to |exact| (no cancellation anywhere). The two
    sides differ by twice that, plus their roundings to s's dtype: half an ulp each, to nearest
    even in every backend (Triton rounds bf16 on the bits, so its CPU interpreter too), taken at
    the upper binade of ``|exact| + bound``."""
    h = s.shape[-1]
    sf = s.double().cpu()
    exact = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps) * weight.double().cpu()
    bound = 2 * ((h + 2) / 2 + 2 + 2) * EPS32 * exact.abs()
    if s.dtype != torch.float32:
        bound = bound + ulp((exact.abs() + bound).float(), s.dtype).double()
    return bound.float()


#: the largest |x| of the rows of :func:`overflow_rows`, in turn: ordinary, past 2^64 (the squares
#: overflow fp32), the top binades of fp32
OVERFLOW_SCALES = (3.0, 1e20, 1e30, 1e38)


def overflow_rows(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows ``shape = [..., R, D]`` of uniform values, row i below ``OVERFLOW_SCALES[i % 4]`` in
    magnitude: ordinary rows beside rows whose squares overflow fp32 (docs/OPS.md, add_rmsnorm)."""
    gen = torch.Generator().manual_seed(seed)
    scales = [OVERFLOW_SCALES[i % len(OVERFLOW_SCALES)] for i in range(shape[-2])]
    x = torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1
    return (x * torch.tensor(scales, dtype=torch.float64)[:, None]).to(dtype)


def rms_exact(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps)`` over the last dim, in f64 on the host (no overflow there)."""
    xd = x.double().cpu()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)


def _moved(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """``t`` on ``device`` with its strides (a view of a wider buffer stays one); None stays
    None."""
    if t is None or t.device == device:
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device).copy_(t)


def check_add_rmsnorm_case(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> None:
    """Every backend's add_rmsnorm against the reference: ``s`` bit for bit (x itself without a
    residual), ``y`` within :func:`add_rmsnorm_tolerance`, outputs new and contiguous, inputs
    unwritten (views with their strides on ``device``)."""
    want_y, want_s = ops.add_rmsnorm(x, residual, weight, eps, backend="reference")
    assert (want_s is x) == (residual is None)
    bound = add_rmsnorm_tolerance(want_s, weight, eps)
    dev = torch.device(device)
    for name in backends_for("add_rmsnorm", dev, x.dtype, backends):
        if name == "reference":
            continue
        xd, rd, wd = _moved(x, dev), _moved(residual, dev), weight.to(dev)
        before = [t.clone() for t in (xd, rd, wd) if t is not None]
        y, s = ops.add_rmsnorm(xd, rd, wd, eps, backend=name)
        after = [t for t in (xd, rd, wd) if t is not None]
        written = not all(bits_equal(a, b) for a, b in zip(before, after, strict=True))
        assert not written, f"{name}: an input was written"
        assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous(), name
        if residual is None:
            assert s is xd, f"{name}: s must be x itself without a residual"
        else:
            assert s.shape == x.shape and s.dtype == x.dtype and s.is_contiguous(), name
            if s.numel():
                fresh = s.data_ptr() not in (xd.data_ptr(), rd.data_ptr(), y.data_ptr())
                assert fresh, f"{name}: s is not a new tensor"
            if not bits_equal(s, want_s):
                assert_within(name, "s (bit-exact)", s, want_s, torch.zeros(s.shape))
                raise AssertionError(f"{name}: s differs from the reference in its bits")
        assert_within(name, "y", y, want_y, bound)

"""Helpers shared by the case functions of every op."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftlab import backends as ftbackends
from ftlab.backends import FLOAT_DTYPES

__all__ = ["FLOAT_DTYPES", "assert_within", "backends_for", "restride", "ulp"]


def restride(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device`` with the same row stride (padding copied too)."""
    stride = t.stride(0) if t.dim() == 2 and t.shape[0] > 0 else t.shape[-1]
    base = torch.as_strided(t, (t.shape[0], stride), (stride, 1)) if t.dim() == 2 else t
    moved = base.to(device).clone()
    return moved[:, : t.shape[1]] if t.dim() == 2 else moved


def backends_for(
    op: str,
    device: torch.device,
    dtype: torch.dtype,
    names: Sequence[str] | None,
    path: str | None = None,
) -> list[str]:
    """The backends a case runs: ``names`` (each must be able to serve, ``path`` too when given),
    else all that can (and implement ``path``). A pytest skip, naming the op and why, where only
    the reference can serve: the case would compare the reference with itself (on the CPU: Triton
    absent or its interpreter off; tests/conftest.py turns it on, so CI compares)."""
    if names is None:
        why_not = ftbackends.availability(op, device, dtype, path)
        names = [name for name, why in why_not.items() if why is None]
        if all(name == "reference" for name in names):
            import pytest

            others = "; ".join(f"{name}: {why}" for name, why in why_not.items() if why is not None)
            what = f"{device.type} {dtype}" + ("" if path is None else f" path {path!r}")
            pytest.skip(
                f"{op}: only the reference can serve {what}, nothing to compare it with ({others})"
            )
        return names
    for name in names:  # an explicit name that cannot serve is an error, not a skip
        ftbackends.resolve(op, name, device, dtype, path=path)
    return list(names)


_MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}


def ulp(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``dtype`` at |v| (at least the smallest normal's)."""
    exponent = torch.floor(torch.log2(v.abs().clamp(min=torch.finfo(dtype).tiny)))
    return torch.exp2(exponent - _MANTISSA_BITS[dtype])


def assert_within(
    name: str, what: str, got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor
) -> None:
    """``|got - expected| <= bound`` elementwise (2-D, on any device; NaN fails), else an
    AssertionError naming the first element off, its values and how many are off."""
    err = (got.float().cpu() - expected.float().cpu()).abs()
    bad = ~(err <= bound)
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise AssertionError(
            f"{name}: {what} off at [{i}, {j}]: got {float(got[i, j])}, reference "
            f"{float(expected[i, j])}, |diff| {float(err[i, j]):.3g} > bound "
            f"{float(bound[i, j]):.3g} ({int(bad.sum())} of {bad.numel()} elements)"
        )

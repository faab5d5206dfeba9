"""Helpers shared by the case functions of every op."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftlab import backends as ftbackends

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def restride(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device`` with the same row stride (padding copied too)."""
    stride = t.stride(0) if t.dim() == 2 and t.shape[0] > 0 else t.shape[-1]
    base = torch.as_strided(t, (t.shape[0], stride), (stride, 1)) if t.dim() == 2 else t
    moved = base.to(device).clone()
    return moved[:, : t.shape[1]] if t.dim() == 2 else moved


def backends_for(
    op: str, device: torch.device, dtype: torch.dtype, names: Sequence[str] | None
) -> list[str]:
    """The backends a case runs: ``names`` (each must be able to serve), else all that can."""
    if names is None:
        return ftbackends.available_backends(op, device, dtype)
    for name in names:  # an explicit name that cannot serve is an error, not a skip
        ftbackends.resolve(op, name, device, dtype)
    return list(names)

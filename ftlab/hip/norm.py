"""norm through the HIP kernel of ``csrc/norm.hip`` (JIT-built, cached): one block per row, the
residual add and its RMSNorm in one pass over the row (16-byte loads where aligned)."""

from __future__ import annotations

import torch

from ftlab import jit


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                quantize: bool = False) -> tuple:  # fmt: skip
    """Backend entry of :func:`ftlab.ops.add_rmsnorm` (ops checked the layouts): ``(y, s)``, and
    with ``quantize`` the Q8_1 of y as a third, by hip's ``quantize_q8_1`` kernel (a second
    launch, four threads a 32-block)."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    module = jit.module_for("norm", x.device)
    s = x if residual is None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if residual is None:
        jit.on_device(x.device, lambda: module.rmsnorm(x, weight, y, float(eps)))
    else:
        jit.on_device(x.device, lambda: module.add_rmsnorm(x, residual, weight, s, y, float(eps)))
    if quantize:
        from ftlab.hip.q4_0 import quantize_q8_1

        return y, s, quantize_q8_1(y)
    return y, s

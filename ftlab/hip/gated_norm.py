"""gated_norm through the HIP kernels of ``csrc/gated_norm.hip`` (JIT-built, cached): one wave per
(token, head) row for the gated RMSNorm, one thread per element for the output gate."""

from __future__ import annotations

import torch

from ftlab import jit


def gated_rmsnorm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.gated_rmsnorm` (ops checked the layouts)."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    module = jit.module_for("gated_norm", x.device)
    jit.on_device(x.device, lambda: module.gated_rmsnorm(x, z, weight, y, float(eps)))
    return y


def output_gate(attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.output_gate` (ops checked the layouts)."""
    y = torch.empty(attn.shape, dtype=attn.dtype, device=attn.device)
    module = jit.module_for("gated_norm", attn.device)
    jit.on_device(attn.device, lambda: module.output_gate(attn, gate, y))
    return y

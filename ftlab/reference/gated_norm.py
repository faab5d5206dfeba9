"""gated_norm, the reference (docs/OPS.md section 10).

``gated_rmsnorm``: each row x of D elements (a head of a token) with its gate row z:
``y = x / sqrt(mean(x^2) + eps) * weight * silu(z)``. ``output_gate``: ``y = attn *
sigmoid(gate)``. Computed in fp32, rounded once to the input's dtype; ``1 / sqrt(mean(x^2) +
eps)`` by ``ftlab.reference.norm.rms_factor`` (a row whose squares overflow fp32 too).
"""

from __future__ import annotations

import torch

from ftlab.reference.norm import rms_factor


def gated_rmsnorm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.gated_rmsnorm`."""
    xf, zf = x.float(), z.float()
    y = xf * rms_factor(xf, eps) * weight.float() * (zf * torch.sigmoid(zf))
    return y.to(x.dtype).contiguous()


def output_gate(attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.output_gate`."""
    return (attn.float() * torch.sigmoid(gate.float())).to(attn.dtype).contiguous()

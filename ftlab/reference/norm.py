"""norm, the reference (docs/OPS.md, ``add_rmsnorm``).

``add_rmsnorm``: the residual add of a transformer layer fused with the RMSNorm that follows it,
written as the model writes the two steps: ``s = x + residual`` (torch's add: fp32 inside,
rounded once to x's dtype), then ``ftlab.models.layers.rms_norm(s, weight, eps)`` -- torch's
RMSNorm of the rounded s, fp32 inside, the weight applied in fp32, rounded once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Backend entry of :func:`ftlab.ops.add_rmsnorm`: ``(y, s)``, s being x itself without a
    residual."""
    s = x if residual is None else (x + residual).contiguous()
    if weight.dtype != s.dtype:  # an fp32 (or other) weight: applied unrounded, in fp32
        y = F.rms_norm(s.float(), (s.shape[-1],), weight.float(), eps).to(s.dtype)
    else:
        y = F.rms_norm(s, (s.shape[-1],), weight, eps)  # fp32 inside for 16-bit s, weight included
    return y.contiguous(), s

"""qk_norm_rope, the reference (docs/OPS.md section 5: per-head RMSNorm on q and k, then RoPE).

For each row ``x`` of ``D`` elements (a head of a token) with the token's rotary tables:
``y = x / sqrt(mean(x^2) + eps) * weight`` and ``out[d] = y[d] * cos[d] + y[(d + D/2) % D] *
sin[d]``, where ``sin`` is the signed table of ``rope_tables`` (-sin on the first half), the
rotate-half form of RoPE. Computed in fp32, rounded once to q's dtype.
"""

from __future__ import annotations

import torch


def _one(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    half = x.shape[-1] // 2
    return (y * cos.float()[:, None] + torch.roll(y, half, dims=-1) * sin.float()[:, None]).to(x.dtype)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Backend entry of :func:`ftlab.ops.qk_norm_rope`."""
    return _one(q, q_weight, cos, sin, eps).contiguous(), _one(k, k_weight, cos, sin, eps).contiguous()

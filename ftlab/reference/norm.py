"""norm, the reference (docs/OPS.md, ``add_rmsnorm``).

``add_rmsnorm``: the residual add of a transformer layer fused with the RMSNorm that follows it,
written as the model writes the two steps: ``s = x + residual`` (torch's add: fp32 inside,
rounded once to x's dtype), then :func:`rms_norm` of s -- torch's RMSNorm of the rounded s, fp32
inside, the weight applied in fp32, rounded once.

Every RMSNorm of ftlab (this one, ``gated_rmsnorm``, the q / k norms of ``qk_norm_rope``) takes
its factor ``1 / sqrt(mean(x^2) + eps)`` from :func:`rms_factor`: a row whose squares overflow
fp32 (a finite |x| >= ~2^64 / sqrt(D): x^2 past 3.4e38, the factor 0, the row zeros) sums the
squares of ``x * 2^-80`` instead (a power of two: exact) and scales the factor back; every other
row keeps the plain formula's bits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: what a row whose squares overflow fp32 is scaled by before they are summed: |x| < 2^128 gives
#: squares below 2^96, and any number of them below fp32's 2^128; the row's largest, >= 2^64 /
#: sqrt(D) for the sum to have overflowed, keep every bit
NORM_SCALE = 2.0**-80


def rms_factor(xf: torch.Tensor, eps: float) -> torch.Tensor:
    """``1 / sqrt(mean(x^2) + eps)`` over the last dim of fp32 ``xf [..., D]``, ``[..., 1]`` fp32:
    ``rsqrt(mean(x^2) + eps)``, or, where ``mean(x^2)`` overflows, ``2^-80 * rsqrt(mean((x
    2^-80)^2) + eps 2^-160)`` (the same number, its squares in range)."""
    ms = xf.pow(2).mean(-1, keepdim=True)
    scaled = (xf * NORM_SCALE).pow(2).mean(-1, keepdim=True)
    big = torch.rsqrt(scaled + eps * NORM_SCALE * NORM_SCALE) * NORM_SCALE
    return torch.where(torch.isinf(ms), big, torch.rsqrt(ms + eps))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim of ``x``, in fp32, rounded once to
    x's dtype: torch's RMSNorm (``weight`` of x's dtype, or applied unrounded in fp32), and for a
    row whose squares overflow fp32 the same product with :func:`rms_factor`."""
    if weight.dtype != x.dtype:  # an fp32 (or other) weight: applied unrounded, in fp32
        y = F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)
    else:
        y = F.rms_norm(x, (x.shape[-1],), weight, eps)  # fp32 inside for 16-bit x, weight included
    xf = x.float()
    big = torch.isinf(xf.pow(2).mean(-1, keepdim=True))
    return torch.where(big, (xf * rms_factor(xf, eps) * weight.float()).to(x.dtype), y)


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.add_rmsnorm`: ``(y, s)``, s being x itself without a
    residual."""
    s = x if residual is None else (x + residual).contiguous()
    return rms_norm(s, weight, eps).contiguous(), s

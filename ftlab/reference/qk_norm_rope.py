"""qk_norm_rope, the reference (docs/OPS.md section 5: per-head RMSNorm on q and k, then RoPE).

For each row ``x`` of ``D`` elements (a head of a token) with the token's rotary tables of
``R`` (rotary_dim) elements: ``y = x / sqrt(mean(x^2) + eps) * weight`` over all D, and
``out[d] = y[d] * cos[d] + y[(d + R/2) % R] * sin[d]`` for d < R, where ``sin`` is the signed
table of ``rope_tables`` (-sin on the first half), the rotate-half form of RoPE; ``out[d] =
y[d]`` for the D - R dims past the rotary ones. Computed in fp32, rounded once to q's dtype;
``1 / sqrt(mean(x^2) + eps)`` by ``ftlab.reference.norm.rms_factor`` (a row whose squares
overflow fp32 too).
"""

from __future__ import annotations

import torch

from ftlab.reference.norm import rms_factor


def _one(
    x: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    rot: int,
) -> torch.Tensor:
    xf = x.float()
    y = xf * rms_factor(xf, eps) * weight.float()
    yr = y[..., :rot]
    out = yr * cos.float()[:, None] + torch.roll(yr, rot // 2, dims=-1) * sin.float()[:, None]
    return torch.cat([out, y[..., rot:]], dim=-1).to(x.dtype)


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    rotary_dim: int | None = None,
    *,
    cache: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.qk_norm_rope` (``rotary_dim`` None: all of D). ``cache``:
    ``(k_cache, v_cache, slots, v [N, W])``: then ``k_cache[slots[n]] = k_out[n]`` (its heads
    side by side) and ``v_cache[slots[n]] = v[n]`` for each slot in ``[0, S)``; other slots
    (-1, out of range) write nothing."""
    rot = q.shape[-1] if rotary_dim is None else rotary_dim
    qo = _one(q, q_weight, cos, sin, eps, rot).contiguous()
    ko = _one(k, k_weight, cos, sin, eps, rot).contiguous()
    if cache is not None:
        k_cache, v_cache, slots, v = cache
        live = (slots >= 0) & (slots < k_cache.shape[0])
        at = slots[live].long()
        k_cache[at] = ko.reshape(ko.shape[0], ko.shape[1] * ko.shape[2])[live]
        v_cache[at] = v[live]
    return qo, ko

"""qk_norm_rope through the HIP kernel of ``csrc/qk_norm_rope.hip`` (JIT-built, cached): one wave
per (token, head) row, lanes over the (p, p + R/2) rotation pairs of the R = rotary_dim rotated
dims and the D - R dims past them."""

from __future__ import annotations

import torch

from ftlab import jit


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
    """Backend entry of :func:`ftlab.ops.qk_norm_rope` (ops checked the layouts; ``rotary_dim``
    None: all of D; ``cache``: ``(k_cache, v_cache, slots, v [N, W])`` written by the same launch,
    one more row a token for v)."""
    rot = q.shape[-1] if rotary_dim is None else rotary_dim
    qo = q.new_empty(q.shape)
    ko = k.new_empty(k.shape)
    module = jit.module_for("qk_norm_rope", q.device)
    if cache is None:
        jit.on_device(
            q.device,
            lambda: module.qk_norm_rope(
                q, k, q_weight, k_weight, cos, sin, qo, ko, float(eps), rot
            ),
        )
    else:
        jit.on_device(
            q.device,
            lambda: module.qk_norm_rope_cache(
                q, k, q_weight, k_weight, cos, sin, qo, ko, float(eps), rot, *cache
            ),
        )
    return qo, ko

"""attention, the reference (docs/OPS.md section 13).

``decode_attention``: for each sequence b and query head h (key / value head ``h // (H / KVH)``),
the scores ``scale * q . k_p`` over the positions ``p < clamp(lengths[b], 0, S)``, their softmax,
and the weighted sum of the values; fp32 throughout, rounded once to q's dtype. No position: zeros.

``split_plan``: how the kernels split a cache's positions among programs (they share it).
"""

from __future__ import annotations

import torch

from ftlab import argcheck

#: positions a split holds at least, and the most splits a (sequence, key head) gets
SPLIT_POSITIONS = 64
MAX_SPLITS = 64


def split_plan(s: int) -> tuple[int, int]:
    """(positions a split, splits) for a cache of ``s`` positions: splits of 64 positions (a
    multiple of 64 past 64 x 64 positions), so a decode step over a short cache is one tile a
    program and a long one keeps at most :data:`MAX_SPLITS` programs per key head."""
    chunk = SPLIT_POSITIONS * max(1, -(-s // (SPLIT_POSITIONS * MAX_SPLITS)))
    return chunk, max(1, -(-s // chunk))


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.decode_attention`."""
    argcheck.decode_attention_layout(q, k, v, lengths)
    b, h, d = q.shape
    s, kvh = k.shape[1], k.shape[2]
    qf = q.float().view(b, kvh, h // kvh, d)  # query heads grouped by the key head they read
    scores = torch.einsum("bkgd,bpkd->bkgp", qf, k.float()) * scale  # [B, KVH, G, S]
    live = torch.arange(s, device=q.device)[None, :] < lengths.clamp(0, s)[:, None]  # [B, S]
    scores = scores.masked_fill(~live[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    p = torch.where(live.any(-1)[:, None, None, None], p, 0.0)  # no position: zeros, not 0/0
    # slots past the length are never read
    vals = v.float().masked_fill(~live[:, :, None, None], 0.0)
    out = torch.einsum("bkgp,bpkd->bkgd", p, vals)
    return out.reshape(b, h, d).to(q.dtype).contiguous()

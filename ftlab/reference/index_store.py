"""index / store, the readable way (docs/OPS.md section 1).

These are the oracles for the Triton and HIP kernels: plain PyTorch indexing on any
device. Arguments arrive validated by :mod:`ftlab.ops`; the signature is the one every
backend of the op implements.
"""

from __future__ import annotations

import torch


def index(
    weights: torch.Tensor, indices: torch.Tensor, out: torch.Tensor, mask_start: int, mask_len: int
) -> None:
    """``out[i] = weights[indices[i]]``.

    With a mask (``mask_len >= 0``): ``pos = indices[i] - mask_start``; rows with ``pos``
    outside ``[0, mask_len)`` are zero, the others read ``weights[pos]``.

    weights ``[N, D]``, indices ``[L]`` int32/int64, out ``[L, D]`` (same dtype as weights).
    """
    idx = indices.long()
    if mask_len < 0:
        out.copy_(weights[idx])
        return
    pos = idx - mask_start
    inside = (pos >= 0) & (pos < mask_len)
    out.zero_()
    out[inside] = weights[pos[inside]]


def store(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """``k_cache[indices[i]] = k[i]; v_cache[indices[i]] = v[i]``; ``indices[i] == -1`` skips row i.

    caches ``[S, D]``, k and v ``[L, D]``, indices ``[L]`` int32/int64, unique apart from -1.
    """
    keep = indices >= 0
    slots = indices[keep].long()
    k_cache[slots] = k[keep]
    v_cache[slots] = v[keep]

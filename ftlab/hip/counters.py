"""Zeroed int32 counters on a device for the kernels whose last block to finish does the rest
(``router_topk``'s per-token counters, ``decode_attention``'s per-(sequence, key head) ones): each
such launch leaves its counters at 0, so one buffer per (user, device) serves every launch, one
stream at a time."""

from __future__ import annotations

import torch

from ftlab import platform as ftplatform

_buffers: dict[tuple[str, torch.device], torch.Tensor] = {}
_retired: list[torch.Tensor] = []  # grown out of, but a captured graph may still hold them


def zeroed_counters(user: str, device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` zeroed counters of ``user`` (an op's name) on ``device``, made (or grown) by
    a call outside a graph capture, where their zeros are written at once."""
    key = (user, device)
    c = _buffers.get(key)
    if c is None or c.numel() < n:
        if ftplatform.capturing(device):
            raise RuntimeError(
                f"{user} (hip) makes its counters on its first call: call it once on this device "
                "with as many rows before capturing a graph (as a warm-up does)"
            )
        if c is not None:
            _retired.append(c)
        c = _buffers[key] = torch.zeros(n, dtype=torch.int32, device=device)
    return c

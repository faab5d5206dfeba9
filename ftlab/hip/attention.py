"""attention through the HIP kernels of ``csrc/attention.hip`` (JIT-built, cached): split-K
decode attention, one block per (split, key head, sequence) and a merge of the splits."""

from __future__ import annotations

import torch

from ftlab import jit
from ftlab.reference.attention import split_plan

#: the most query heads a key head and the largest head dim the kernel holds
MAX_GROUP, MAX_HEAD_DIM = 8, 256


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                     scale: float) -> torch.Tensor:  # fmt: skip
    """Backend entry of :func:`ftlab.ops.decode_attention` (ops checked the layouts)."""
    b, h, d = q.shape
    s, kvh = k.shape[1], k.shape[2]
    if h // kvh > MAX_GROUP or d > MAX_HEAD_DIM:
        raise ValueError(f"the hip decode_attention holds at most {MAX_GROUP} query heads a key head and head dim "
                         f"{MAX_HEAD_DIM}, got {h // kvh} and {d}")  # fmt: skip
    out = torch.empty((b, h, d), dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    if s == 0:
        return out.zero_()
    chunk, splits = split_plan(s)
    g = h // kvh
    ml = torch.empty((b, kvh, splits, g, 2) if splits > 1 else (1,), dtype=torch.float32, device=q.device)
    acc = torch.empty((b, kvh, splits, g, d) if splits > 1 else (1,), dtype=torch.float32, device=q.device)
    if lengths.dtype != torch.int32:  # int64 values past int32 must not wrap: clamp first
        lengths = lengths.clamp(0, s).to(torch.int32)
    module = jit.module_for("attention", q.device)
    jit.on_device(q.device, lambda: module.decode_attention(q, k, v, lengths, ml, acc, out, chunk, splits, float(scale)))
    return out

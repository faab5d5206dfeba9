"""What a :class:`~ftlab.models.pipeline.Pipeline` holds on its device, in bytes, by what holds it
(:func:`pipeline_memory`): a long prompt's footprint is these plus one prefill chunk's scratch."""

from __future__ import annotations

import torch

from ftlab.models.state_file import weight_leaves

__all__ = ["pipeline_memory"]


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def pipeline_memory(pipe) -> dict[str, int]:
    """``weights`` (every dense and packed weight the model reads; the hybrid host copies not
    counted), ``kv_cache`` (every attention layer's K and V buffers, all ``max_seq_len`` slots),
    ``recurrent_state`` (the linear-attention layers' conv and delta states; 0 for Qwen3-MoE),
    ``prefix_cache`` (its snapshots and KV copies) and ``total``."""
    seen: dict[int, torch.Tensor] = {}  # a tied lm_head is the embedding: counted once
    for _, w in weight_leaves(pipe.weights):
        t = w.data if hasattr(w, "qtype") else w
        seen.setdefault(t.data_ptr(), t)
    model = pipe.model
    rec = model.recurrent_state()
    out = {
        "weights": _nbytes(seen.values()),
        "kv_cache": _nbytes([*model.cache.k, *model.cache.v]),
        "recurrent_state": _nbytes(rec),
        "prefix_cache": pipe.prefix_cache.nbytes,
    }
    out["total"] = sum(out.values())
    return out

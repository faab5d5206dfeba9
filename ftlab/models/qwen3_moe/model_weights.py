"""The weights a Qwen3-MoE model (:class:`~ftlab.models.qwen3_moe.model.Qwen3Moe`) reads, layer by
layer: dense tensors or packed :class:`~ftlab.quant.QuantWeight`, as the loaders
(:mod:`~ftlab.models.qwen3_moe.hf`, :mod:`~ftlab.models.qwen3_moe.gguf`) and the tensor-parallel
shard (:func:`~ftlab.models.tensor_parallel.shard_qwen3_moe`) build them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ftlab.models.layers import concat_rows
from ftlab.quant import Q4_0Weight, QuantWeight

__all__ = ["LayerWeights", "ModelWeights"]


@dataclass
class LayerWeights:
    q_proj: torch.Tensor | Q4_0Weight  # [heads * hd, H]
    k_proj: torch.Tensor | Q4_0Weight  # [kv_heads * hd, H]
    v_proj: torch.Tensor | Q4_0Weight
    o_proj: torch.Tensor | Q4_0Weight  # [H, heads * hd]
    q_norm: torch.Tensor  # [hd]
    k_norm: torch.Tensor
    input_norm: torch.Tensor  # [H]
    post_attention_norm: torch.Tensor
    router: torch.Tensor  # [E, H]
    w_gate_up: torch.Tensor | Q4_0Weight  # [E, 2I, H], gate rows then up rows
    w_down: torch.Tensor | Q4_0Weight  # [E, H, I]

    def qkv(self) -> list[tuple[torch.Tensor | QuantWeight, list[int]]]:
        """The q, k and v projections as few matvecs as their types allow (built once, kept):
        runs of neighbours of one kind (Q4_0, one Q8_0 / K-quant type, or dense of one dtype)
        stacked along N, each output row computed as in its own projection; each part with the
        output widths of the projections it stacks. Three weights of one kind give one matvec a
        decode step instead of three; a Q4_K_M file's layers with a Q6_K v beside Q4_K q and k
        give two (q and k stacked, then v)."""
        if not hasattr(self, "_qkv"):
            parts: list[list] = []
            for w in (self.q_proj, self.k_proj, self.v_proj):
                if parts and _kind(parts[-1][0]) == _kind(w):
                    parts[-1].append(w)
                else:
                    parts.append([w])
            self._qkv = [
                (ws[0] if len(ws) == 1 else _stack(ws), [w.shape[0] for w in ws]) for ws in parts
            ]
        return self._qkv


def _kind(w: torch.Tensor | QuantWeight) -> object:
    """What weights must share to be stacked along N: the quant type, or a dense weight's dtype."""
    return w.qtype if isinstance(w, QuantWeight) else w.dtype


def _stack(ws: list) -> torch.Tensor | QuantWeight:
    """Weights ``[N_i, K]`` of one :func:`_kind`, stacked along N."""
    if isinstance(ws[0], Q4_0Weight) or not isinstance(ws[0], QuantWeight):
        return concat_rows(ws)
    data = torch.cat([w.data for w in ws])
    return QuantWeight(data, (data.shape[0], ws[0].shape[-1]), ws[0].qtype)


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor | Q4_0Weight  # [V, H] (the embedding when tied)

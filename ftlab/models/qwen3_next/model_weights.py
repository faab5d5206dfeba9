"""The weights a hybrid Qwen MoE model (:class:`~ftlab.models.qwen3_next.model.Qwen3Next`) reads,
layer by layer: a mixer (gated-deltanet linear attention or gated full attention) and a MoE with
a shared expert. Built from HF-named tensors by :mod:`~ftlab.models.qwen3_next.weights`, cut for
a tensor-parallel rank by :func:`~ftlab.models.tensor_parallel.shard_qwen3_next`.

The norms of the checkpoints that scale by ``(1 + w)`` hold ``1 + w`` here, in fp32 (converted at
load), as the reference implementation applies them: the residual norms and the q / k head norms
run in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ftlab.models.layers import concat_rows
from ftlab.quant import Q4_0Weight

Weight = torch.Tensor | Q4_0Weight

__all__ = [
    "AttentionWeights",
    "DeltaNetWeights",
    "MoeWeights",
    "NextLayerWeights",
    "NextWeights",
    "Weight",
]


@dataclass
class DeltaNetWeights:
    """A linear-attention layer's mixer: the input projection's parts (rows of q, k, v -- the
    conv's channels, ``[conv_dim, H]`` -- then z ``[value_dim, H]``, b and a ``[Hv, H]``), the conv
    ``[conv_dim, W]`` (fp32 from a checkpoint: the values of the model's dtype), ``dt_bias`` and
    ``a_neg = -exp(A_log)`` fp32 ``[Hv]``, the gated norm's weight ``[Dv]`` (likewise) and out_proj
    ``[H, value_dim]``; ``out_perm`` int64 ``[value_dim]`` or None:
    out_proj's columns are stored permuted (column j is HF's column ``out_perm[j]``, as a packed
    weight must stay), so it is fed ``y[..., out_perm]``."""

    in_proj_qkv: Weight
    in_proj_z: Weight
    in_proj_b: Weight
    in_proj_a: Weight
    conv: torch.Tensor
    dt_bias: torch.Tensor
    a_neg: torch.Tensor
    norm: torch.Tensor
    out_proj: Weight
    out_perm: torch.Tensor | None = None

    def in_proj(self) -> Weight | None:
        """The four input projections stacked along N (built once, kept); None for a mix of Q4_0
        and dense weights."""
        if not hasattr(self, "_in_proj"):
            self._in_proj = concat_rows(
                [self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a]
            )
        return self._in_proj


@dataclass
class AttentionWeights:
    """A full-attention layer's mixer: ``q_proj`` and ``gate_proj [heads * hd, H]`` (the
    checkpoint's q projection, its per-head query and gate rows apart), ``k_proj``, ``v_proj
    [kv_heads * hd, H]``, ``o_proj [H, heads * hd]``, ``q_norm``, ``k_norm [hd]``."""

    q_proj: Weight
    gate_proj: Weight
    k_proj: Weight
    v_proj: Weight
    o_proj: Weight
    q_norm: torch.Tensor
    k_norm: torch.Tensor

    def qgkv(self) -> Weight | None:
        """q, gate, k and v stacked along N (built once, kept); None for a mix."""
        if not hasattr(self, "_qgkv"):
            self._qgkv = concat_rows([self.q_proj, self.gate_proj, self.k_proj, self.v_proj])
        return self._qgkv


@dataclass
class MoeWeights:
    """``router [E, H]``; the routed banks ``w_gate_up [E, 2I, H]`` (gate rows, then up rows) and
    ``w_down [E, H, I]``; the shared expert as a one-expert bank ``shared_gate_up [1, 2Is, H]``,
    ``shared_down [1, H, Is]``, and its gate ``shared_gate [1, H]``."""

    router: torch.Tensor
    w_gate_up: Weight
    w_down: Weight
    shared_gate_up: Weight
    shared_down: Weight
    shared_gate: torch.Tensor
    banks: tuple[Weight, Weight] | None = None  # shared_in_banks(): gate_up, down of E + 1 experts

    def shared_in_banks(self) -> bool:
        """Whether the shared expert is expert E of one pair of banks ``[E + 1, ...]`` (made here
        once, True after): the routed banks and the shared expert then become views of them (no
        second copy), and one ``moe_experts`` call with a (k + 1)-th slot -- id E, weight the
        shared gate -- runs both. Possible when the shared expert's width is the routed experts'
        and the four banks are all Q4_0 or all dense of one dtype; False otherwise."""
        if self.banks is not None:
            return True
        e = self.w_gate_up.shape[0]
        if (
            self.shared_gate_up.shape[1:] != self.w_gate_up.shape[1:]
            or self.shared_down.shape[1:] != self.w_down.shape[1:]
        ):
            return False
        banks = [
            concat_rows([self.w_gate_up, self.shared_gate_up]),
            concat_rows([self.w_down, self.shared_down]),
        ]
        if None in banks:
            return False
        self.banks = (banks[0], banks[1])
        self.w_gate_up, self.shared_gate_up = (
            _experts_view(banks[0], 0, e),
            _experts_view(banks[0], e, e + 1),
        )
        self.w_down, self.shared_down = (
            _experts_view(banks[1], 0, e),
            _experts_view(banks[1], e, e + 1),
        )
        return True


def _experts_view(w: Weight, start: int, stop: int) -> Weight:
    """Experts ``start:stop`` of a bank, a view."""
    if isinstance(w, Q4_0Weight):
        return Q4_0Weight(w.data[start:stop], (stop - start, *w.shape[1:]))
    return w[start:stop]


@dataclass
class NextLayerWeights:
    input_norm: torch.Tensor  # [H]
    post_attention_norm: torch.Tensor
    mixer: DeltaNetWeights | AttentionWeights
    moe: MoeWeights


@dataclass
class NextWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[NextLayerWeights]
    norm: torch.Tensor  # [H]
    lm_head: Weight  # [V, H] (the embedding when tied)

"""What a hybrid Qwen MoE model keeps between forward passes: its full-attention layers' slots of
the static KV cache (:class:`~ftlab.models.kv_cache.KVCache`), and per linear-attention layer a
conv state ``[max_batch, conv_dim, W-1]`` in the model's dtype and a delta state ``[max_batch,
Hv, Dk, Dv]`` fp32.

All of it is allocated at construction, so a decode step has fixed shapes and addresses (a
captured graph). A forward pass of tokens at positions ``p .. p + T - 1`` continues each
sequence's recurrent state when ``p > 0`` and starts it afresh at ``p = 0`` (decided on the
device: no host synchronization).
"""

from __future__ import annotations

import torch

from ftlab.models.kv_cache import KVCache
from ftlab.models.qwen3_next.config import Qwen3NextConfig

__all__ = ["NextState"]


class NextState:
    """The state of every layer of ``config`` (module docstring) for ``kv_heads`` key/value heads
    of full attention, ``k_heads`` key heads and ``v_heads`` value heads of linear attention (a
    tensor-parallel rank's share, or all of them): ``cache`` the KV cache (``static``: see
    :class:`~ftlab.models.kv_cache.KVCache`), ``slot[i]`` full-attention layer ``i``'s index in
    it, ``conv[i]`` and ``delta[i]`` linear-attention layer ``i``'s state."""

    def __init__(
        self,
        config: Qwen3NextConfig,
        kv_heads: int,
        k_heads: int,
        v_heads: int,
        max_batch: int,
        max_seq_len: int,
        static: bool,
        device: torch.device,
        dtype: torch.dtype,
    ):
        c = config
        self.slot = {i: j for j, i in enumerate(c.attention_layers)}
        kv_width = kv_heads * c.head_dim
        self.cache = KVCache(
            len(self.slot), kv_width, max_batch, max_seq_len, static, device, dtype
        )
        dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
        conv_dim, width = 2 * k_heads * dk + v_heads * dv, c.linear_conv_kernel_dim - 1
        self.conv = {
            i: torch.zeros(max_batch, conv_dim, width, device=device, dtype=dtype)
            for i in c.linear_layers
        }
        self.delta = {
            i: torch.zeros(max_batch, v_heads, dk, dv, device=device, dtype=torch.float32)
            for i in c.linear_layers
        }

    def recurrent(self) -> list[torch.Tensor]:
        """Every conv and delta state buffer (what a decode graph's warm-up saves and restores)."""
        return [*self.conv.values(), *self.delta.values()]

"""Routed SwiGLU experts on the CPU (``csrc/moe_cpu.cc``): what the hybrid executor runs for the
slots it routes to the CPU (the others carry id -1 and cost nothing).

``moe_experts(x, w_gate_up, w_down, topk_weights, topk_ids)`` has ops.moe_experts' contract on
CPU tensors: Q4_0 banks on the int8 path (Q8_1 x and h, int8 block dots), dense fp32 / bf16 /
fp16 banks in fp32 arithmetic; the result in x's dtype. Tested against the reference within
``ftlab.testing.experts_tolerance``.
"""

from __future__ import annotations

import torch

from ftlab.cpu import load
from ftlab.quant import Q4_0Weight


def moe_experts(x: torch.Tensor, w_gate_up, w_down, topk_weights: torch.Tensor, topk_ids: torch.Tensor
                ) -> torch.Tensor:  # fmt: skip
    """``x [T, H]`` (CPU), banks ``[E, 2I, H]`` / ``[E, H, I]`` (both Q4_0 or both dense of one
    dtype), ``topk_weights`` fp32 / ``topk_ids`` int ``[T, k]`` -> ``[T, H]`` in x's dtype."""
    for name, t in (("x", x), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if t.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor for the CPU experts, got {t.device}")
    q4 = isinstance(w_gate_up, Q4_0Weight)
    if q4 != isinstance(w_down, Q4_0Weight):
        raise TypeError("w_gate_up and w_down must both be Q4_0 banks or both dense")
    gu = w_gate_up.data if q4 else w_gate_up
    dn = w_down.data if q4 else w_down
    if gu.device.type != "cpu" or dn.device.type != "cpu":
        raise ValueError(f"the banks must be on the CPU, got {gu.device} and {dn.device}")
    if not q4 and gu.dtype != dn.dtype:
        raise TypeError(f"dense banks must share a dtype, got {gu.dtype} and {dn.dtype}")
    if x.dim() != 2 or topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"x must be [T, H] and topk_ids, topk_weights [T, k], got {tuple(x.shape)}, "
                         f"{tuple(topk_ids.shape)}, {tuple(topk_weights.shape)}")  # fmt: skip
    y = torch.empty(x.shape, dtype=torch.float32)
    if x.shape[0]:
        load("moe_cpu").moe_experts_cpu(x.float().contiguous(), gu.contiguous(), dn.contiguous(),
                                        topk_ids.to(torch.int32).contiguous(),
                                        topk_weights.float().contiguous(), y)  # fmt: skip
    return y.to(x.dtype)

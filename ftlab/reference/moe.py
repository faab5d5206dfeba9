"""Routed MoE (Qwen3-MoE experts), the readable way (docs/OPS.md section 3). The oracle of the
kernels.

route_topk:  p = softmax(logits) in fp32 over all E experts; the k largest, ties broken
             toward the lower expert id; renormalized to sum 1 when ``renormalize``.
router_topk: logits = x @ w.T (an fp32 dot, rounded to x's dtype), then route_topk of them.
moe_align:   the (token, slot) pairs grouped by expert, in order of their flat index
             t * k + j within a group, each group padded to a multiple of block_m with
             the sentinel T * k; invalid ids (-1, >= E) are left out.
moe_experts: y[t] = sum_j w[t, j] * down_e( silu(gate_e(x[t])) * up_e(x[t]) ),  e = ids[t, j],
             with w_gate_up[e] = [gate rows; up rows]; ids outside [0, E) contribute nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ftlab.quant import Q4_0Weight, QuantWeight
from ftlab.reference.norm import add_rmsnorm
from ftlab.reference.q4_0 import dequantize_q4_0, q4_0_matmul
from ftlab.reference.quant_matmul import quant_matmul
from ftlab.reference.quants import dequantize


def route_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [T, E]`` -> (weights fp32 ``[T, k]``, ids int32 ``[T, k]``), best first."""
    probs = torch.softmax(logits.float(), dim=-1)  # [T, E]
    # a stable sort of -p keeps equal probabilities in expert order: lower id first
    order = torch.sort(-probs, dim=-1, stable=True).indices[:, :top_k]  # [T, k]
    weights = probs.gather(1, order)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, order.to(torch.int32)


def router_topk(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [T, H]``, ``weight [E, H]`` -> (logits ``[T, E]`` in x's dtype, weights fp32 ``[T, k]``,
    ids int32 ``[T, k]``): the router's linear layer in fp32, rounded, then :func:`route_topk`."""
    logits = (x.float() @ weight.float().T).to(x.dtype)
    weights, ids = route_topk(logits, top_k, renormalize)
    return logits, weights, ids


def align_capacity(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows of ``sorted_token_ids`` for any routing of ``num_pairs`` (token, slot) pairs: every
    expert's group may need block_m - 1 padding rows. A static bound, so graphs can hold it."""
    return -(-(num_pairs + num_experts * (block_m - 1)) // block_m) * block_m


def moe_align(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``ids [T, k]`` -> ``sorted_token_ids`` int32 ``[capacity]`` (sentinel ``T*k`` in padding
    and past the end), ``expert_ids`` int32 ``[capacity / block_m]`` (the expert of each
    block_m rows, -1 past the end), ``num_tokens_post_padded`` int32 ``[1]``."""
    flat = ids.reshape(-1).long()
    sentinel = flat.numel()
    capacity = align_capacity(flat.numel(), num_experts, block_m)
    sorted_ids = torch.full((capacity,), sentinel, dtype=torch.int32, device=ids.device)
    expert_ids = torch.full((capacity // block_m,), -1, dtype=torch.int32, device=ids.device)
    row = 0
    for e in range(num_experts):
        pairs = (flat == e).nonzero().flatten()  # ascending flat index t * k + j
        if pairs.numel() == 0:
            continue  # experts with no tokens take no rows
        sorted_ids[row : row + pairs.numel()] = pairs.to(torch.int32)
        padded = -(-pairs.numel() // block_m) * block_m
        expert_ids[row // block_m : (row + padded) // block_m] = e
        row += padded
    return sorted_ids, expert_ids, torch.tensor([row], dtype=torch.int32, device=ids.device)


def _linear(x: torch.Tensor, w: torch.Tensor | QuantWeight, path: str) -> torch.Tensor:
    """``x [M, K] @ w[N, K].T`` in fp32; Q4_0 through the path of q4_0_matmul, the other
    quantized types through that of quant_matmul (int8: Q8_1 x, exact sub-block integer dots)."""
    if isinstance(w, Q4_0Weight):
        if path == "int8":
            return q4_0_matmul(x.float(), w, "int8").float()
        return x.float() @ dequantize_q4_0(w, torch.float32).T
    if isinstance(w, QuantWeight):
        if path == "int8":
            return quant_matmul(x.float(), w, "int8").float()
        return x.float() @ dequantize(w, torch.float32).T
    return x.float() @ w.float().T


def moe_experts(
    x: torch.Tensor,
    w_gate_up: torch.Tensor | QuantWeight,
    w_down: torch.Tensor | QuantWeight,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    path: str = "dequant",
) -> torch.Tensor:
    """``x [T, H]``, ``w_gate_up [E, 2I, H]``, ``w_down [E, H, I]`` (dense or quantized banks),
    ``topk_weights`` fp32 ``[T, k]``, ``topk_ids`` int ``[T, k]`` -> ``[T, H]`` in x's dtype.

    Computed token by token and slot by slot, in fp32. ``path`` applies to quantized banks:
    ``"dequant"`` (dequantized weights) or ``"int8"`` (Q8_1 activations and the exact integer
    sub-block dots of q4_0_matmul / quant_matmul, for x and for the SwiGLU output, as the
    decode kernels do)."""
    num_experts = w_gate_up.shape[0]
    inter = w_down.shape[-1]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            if not 0 <= e < num_experts:
                continue  # -1 (a CPU-routed slot) or out of range: contributes nothing
            gate_up = _linear(x[t : t + 1], w_gate_up[e], path)  # [1, 2I]
            h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]  # [1, I]
            out[t] += float(topk_weights[t, j]) * _linear(h, w_down[e], path)[0]
    return out.to(x.dtype)


def add_rmsnorm_router_topk(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    top_k: int,
    renormalize: bool,
) -> tuple:
    """Backend entry of :func:`ftlab.ops.add_rmsnorm_router_topk`: the reference add_rmsnorm, then
    :func:`router_topk` of its output."""
    y, s = add_rmsnorm(x, residual, norm_weight, eps)
    return (y, s, *router_topk(y, weight, top_k, renormalize))

"""The MoE router and the grouping of routes by expert, in Triton (docs/OPS.md section 3;
reference: ``ftlab/reference/moe.py``); ``ftlab/triton/moe.py`` is the family's entry.

- ``route_topk_kernel``: one program per token: softmax over all E in fp32, then k rounds of
  ``argmax`` (``tie_break_left``: the lower expert id wins a tie), then renormalization.
- ``router_logits_kernel`` + ``route_topk_kernel`` (``router_topk``): one program per (token,
  16 experts) for the logits (an fp32 dot, H in steps of 128, rounded to x's dtype), then the
  router above: two launches.
- ``moe_align_*``: deterministic grouping by expert (no atomics, so the order within a
  group is the flat order t * k + j, as in the reference): count per expert, a prefix sum
  of the padded counts, then each expert's program writes its pairs' rows.
- ``expert_slot``: the expert of one route as the experts' decode kernels read it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.reference.moe import align_capacity

_CHUNK = 256


@triton.jit
def expert_slot(ids_ptr, pair, E, n, N):
    """The expert of route ``pair`` (``ids[pair]``, or 0 where it is no expert of ``[0, E)``) and
    which of its rows ``n`` ``[BN]`` to read: those below ``N``, none where it is no expert, so
    that an invalid route loads nothing."""
    e = tl.load(ids_ptr + pair)
    valid = (e >= 0) & (e < E)
    rows_ok = (n < N) & (tl.zeros(n.shape, dtype=tl.int32) + valid.to(tl.int32) != 0)
    return tl.where(valid, e, 0), rows_ok


@triton.jit
def route_topk_kernel(
    logits_ptr,
    stride,
    w_ptr,
    ids_ptr,
    E,
    K: tl.constexpr,
    KP: tl.constexpr,
    BLOCK_E: tl.constexpr,
    RENORM: tl.constexpr,
):
    t = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    ok = e < E
    x = tl.load(logits_ptr + t.to(tl.int64) * stride + e, mask=ok, other=float("-inf")).to(
        tl.float32
    )
    p = tl.exp(x - tl.max(x, axis=0))
    p = tl.where(ok, p, 0.0)
    p = p / tl.sum(p, axis=0)
    slots = tl.arange(0, KP)
    weights = tl.zeros((KP,), dtype=tl.float32)
    ids = tl.zeros((KP,), dtype=tl.int32)
    for j in tl.static_range(K):
        best = tl.argmax(p, axis=0, tie_break_left=True)
        value = tl.max(p, axis=0)
        weights = tl.where(slots == j, value, weights)
        ids = tl.where(slots == j, best, ids)
        p = tl.where(e == best, -1.0, p)  # taken
    if RENORM:
        weights = weights / tl.sum(weights, axis=0)
    tl.store(w_ptr + t * K + slots, weights, mask=slots < K)
    tl.store(ids_ptr + t * K + slots, ids, mask=slots < K)


@triton.jit
def router_logits_kernel(
    x_ptr, x_stride, w_ptr, w_stride, out_ptr, H, E, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr
):
    t = tl.program_id(0)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    acc = tl.zeros((BLOCK_E,), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        x = tl.load(x_ptr + t.to(tl.int64) * x_stride + h, mask=h < H, other=0.0).to(tl.float32)
        w = tl.load(
            w_ptr + e[:, None].to(tl.int64) * w_stride + h[None, :],
            mask=(e[:, None] < E) & (h[None, :] < H),
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(out_ptr + t.to(tl.int64) * E + e, acc.to(out_ptr.dtype.element_ty), mask=e < E)


@triton.jit
def moe_align_count_kernel(ids_ptr, counts_ptr, P, CHUNK: tl.constexpr):
    """counts[e] = number of pairs routed to expert e (one program per expert)."""
    e = tl.program_id(0)
    total = 0
    for start in range(0, P, CHUNK):
        p = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + p, mask=p < P, other=-1)
        total += tl.sum((ids == e).to(tl.int32), axis=0)
    tl.store(counts_ptr + e, total)


@triton.jit
def moe_align_scatter_kernel(
    ids_ptr, offsets_ptr, sorted_ptr, expert_ids_ptr, P, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr
):
    """Expert e writes its pairs, in flat order, from row offsets[e], and its blocks' ids."""
    e = tl.program_id(0)
    row0 = tl.load(offsets_ptr + e)
    row1 = tl.load(offsets_ptr + e + 1)
    rank = 0
    for start in range(0, P, CHUNK):
        p = start + tl.arange(0, CHUNK)
        mine = tl.load(ids_ptr + p, mask=p < P, other=-1) == e
        before = tl.cumsum(mine.to(tl.int32), axis=0) - mine.to(tl.int32)  # rank within the chunk
        tl.store(sorted_ptr + row0 + rank + before, p.to(tl.int32), mask=mine)
        rank += tl.sum(mine.to(tl.int32), axis=0)
    for b in range(row0 // BLOCK_M, row1 // BLOCK_M):
        tl.store(expert_ids_ptr + b, e)


def route_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.route_topk`."""
    t, e = logits.shape
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=logits.device)
    if t:
        logits = logits if logits.stride(1) == 1 else logits.contiguous()
        route_topk_kernel[(t,)](
            logits,
            logits.stride(0),
            weights,
            ids,
            e,
            K=top_k,
            KP=triton.next_power_of_2(top_k),
            BLOCK_E=triton.next_power_of_2(e),
            RENORM=renormalize,
            num_warps=1 if e <= 256 else 4,  # one warp: the k rounds of reductions need no barriers
        )
    return weights, ids


def router_topk(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.router_topk`."""
    t, e = x.shape[0], weight.shape[0]
    logits = torch.empty((t, e), dtype=x.dtype, device=x.device)
    if t:
        x = x if x.stride(1) == 1 else x.contiguous()
        weight = weight if weight.stride(1) == 1 else weight.contiguous()
        router_logits_kernel[(t, triton.cdiv(e, 16))](
            x, x.stride(0), weight, weight.stride(0), logits, x.shape[1], e, BLOCK_E=16, BLOCK_H=128
        )
    weights, ids = route_topk(logits, top_k, renormalize)
    return logits, weights, ids


def moe_align(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.moe_align`. No host synchronization: graph-safe."""
    flat = ids.reshape(-1).to(torch.int32).contiguous()
    pairs = flat.numel()
    capacity = align_capacity(pairs, num_experts, block_m)
    sorted_ids = torch.full((capacity,), pairs, dtype=torch.int32, device=ids.device)
    expert_ids = torch.full((capacity // block_m,), -1, dtype=torch.int32, device=ids.device)
    counts = torch.empty((num_experts,), dtype=torch.int32, device=ids.device)
    moe_align_count_kernel[(num_experts,)](flat, counts, pairs, CHUNK=_CHUNK)
    padded = (counts + block_m - 1) // block_m * block_m
    offsets = torch.zeros((num_experts + 1,), dtype=torch.int32, device=ids.device)
    offsets[1:] = torch.cumsum(padded, 0)
    moe_align_scatter_kernel[(num_experts,)](
        flat, offsets, sorted_ids, expert_ids, pairs, BLOCK_M=block_m, CHUNK=_CHUNK
    )
    return sorted_ids, expert_ids, offsets[-1:].clone()


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check)."""
    from ftlab.triton.compile_spec import spec

    specs = [
        spec(
            route_topk_kernel,
            f"route_topk_kernel[E=128, k=8, {dt}]",
            types={"logits_ptr": f"*{dt}", "w_ptr": "*fp32", "ids_ptr": "*i32"},
            constexprs={"K": 8, "KP": 8, "BLOCK_E": 128, "RENORM": True},
            num_warps=1,
        )
        for dt in ("fp32", "bf16")
    ]
    specs.append(
        spec(
            moe_align_count_kernel,
            "moe_align_count_kernel",
            types={"ids_ptr": "*i32", "counts_ptr": "*i32"},
            constexprs={"CHUNK": _CHUNK},
        )
    )
    specs.append(
        spec(
            moe_align_scatter_kernel,
            "moe_align_scatter_kernel[block_m=64]",
            types={
                "ids_ptr": "*i32",
                "offsets_ptr": "*i32",
                "sorted_ptr": "*i32",
                "expert_ids_ptr": "*i32",
            },
            constexprs={"BLOCK_M": 64, "CHUNK": _CHUNK},
        )
    )
    return specs

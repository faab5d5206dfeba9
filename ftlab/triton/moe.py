"""Routed MoE in Triton (OPS.md section 3; reference: ftlab/reference/moe.py): the router,
the align step and the decode-path experts (dequant path) so far.

- ``route_topk_kernel``: one program per token: softmax over all E in fp32, then k rounds of
  ``argmax`` (``tie_break_left``: the lower expert id wins a tie), then renormalization.
- ``moe_align_*``: deterministic grouping by expert (no atomics, so the order within a
  group is the flat order t * k + j, as in the reference): count per expert, a prefix sum
  of the padded counts, then each expert's program writes its pairs' rows.
- ``moe_gate_up_kernel`` / ``moe_down_kernel``: per (token, slot) gate/up matvecs with the
  SwiGLU fused, then per token the down matvecs weighted and summed over the k slots in
  order; dense banks or Q4_0 banks dequantized in registers. Slots with an invalid id load
  nothing (masked loads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.reference.moe import align_capacity
from ftlab.triton.q4_0 import load_q4_0_scale

_CHUNK = 256
# expert matvec tiles: 16 output rows (32 ran RDNA out of SGPRs) x 64 of the reduction
_EXPERT_ROWS = 16
_EXPERT_COLS = 64


@triton.jit
def route_topk_kernel(logits_ptr, stride, w_ptr, ids_ptr, E, K: tl.constexpr, KP: tl.constexpr,
                      BLOCK_E: tl.constexpr, RENORM: tl.constexpr):  # fmt: skip
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
def moe_align_scatter_kernel(ids_ptr, offsets_ptr, sorted_ptr, expert_ids_ptr, P,
                             BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
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
            logits, logits.stride(0), weights, ids, e,
            K=top_k, KP=triton.next_power_of_2(top_k), BLOCK_E=triton.next_power_of_2(e), RENORM=renormalize,
        )  # fmt: skip
    return weights, ids


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
    moe_align_scatter_kernel[(num_experts,)](flat, offsets, sorted_ids, expert_ids, pairs, BLOCK_M=block_m,
                                             CHUNK=_CHUNK)  # fmt: skip
    return sorted_ids, expert_ids, offsets[-1:].clone()


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check)."""
    from ftlab.compile_check import TritonSpec

    specs = [
        TritonSpec(f"route_topk_kernel[E=128, k=8, {dt}]", route_topk_kernel,
                   {"logits_ptr": f"*{dt}", "stride": "i32", "w_ptr": "*fp32", "ids_ptr": "*i32", "E": "i32",
                    "K": "constexpr", "KP": "constexpr", "BLOCK_E": "constexpr", "RENORM": "constexpr"},
                   {"K": 8, "KP": 8, "BLOCK_E": 128, "RENORM": True})
        for dt in ("fp32", "bf16")
    ]  # fmt: skip
    specs.append(TritonSpec("moe_align_count_kernel", moe_align_count_kernel,
                            {"ids_ptr": "*i32", "counts_ptr": "*i32", "P": "i32", "CHUNK": "constexpr"},
                            {"CHUNK": _CHUNK}))  # fmt: skip
    specs.append(TritonSpec("moe_align_scatter_kernel[block_m=64]", moe_align_scatter_kernel,
                            {"ids_ptr": "*i32", "offsets_ptr": "*i32", "sorted_ptr": "*i32", "expert_ids_ptr": "*i32",
                             "P": "i32", "BLOCK_M": "constexpr", "CHUNK": "constexpr"},
                            {"BLOCK_M": 64, "CHUNK": _CHUNK}))  # fmt: skip
    for q4 in (False, True):
        w = "*u8" if q4 else "*bf16"
        label = "Q4_0" if q4 else "bf16"
        specs.append(TritonSpec(f"moe_gate_up_kernel[{label} bank]", moe_gate_up_kernel,
                                {"x_ptr": "*bf16", "x_stride": "i32", "w_ptr": w, "W_ESTRIDE": "i32", "ROW_STRIDE": "i32",
                                 "ids_ptr": "*i32", "h_ptr": "*fp32", "E": "i32", "H": "i32", "INTER": "i32",
                                 "TOP_K": "i32", "Q4": "constexpr", "BLOCK_N": "constexpr", "BLOCK_H": "constexpr"},
                                {"Q4": q4, "BLOCK_N": _EXPERT_ROWS, "BLOCK_H": _EXPERT_COLS}))  # fmt: skip
        specs.append(TritonSpec(f"moe_down_kernel[{label} bank]", moe_down_kernel,
                                {"h_ptr": "*fp32", "w_ptr": w, "W_ESTRIDE": "i32", "ROW_STRIDE": "i32", "ids_ptr": "*i32",
                                 "wts_ptr": "*fp32", "y_ptr": "*bf16", "y_stride": "i32", "E": "i32", "H": "i32",
                                 "INTER": "i32", "TOP_K": "i32", "Q4": "constexpr", "BLOCK_N": "constexpr",
                                 "BLOCK_I": "constexpr"},
                                {"Q4": q4, "BLOCK_N": _EXPERT_ROWS, "BLOCK_I": _EXPERT_COLS}))  # fmt: skip
    return specs


# ------------------------------------------------------------------ experts (decode: per-pair matvecs)


@triton.jit
def _weight_tile(w_ptr, e, rows, cols, row_ok, col_ok, W_ESTRIDE, ROW_STRIDE, Q4: tl.constexpr):
    """fp32 tile ``W[e][rows, cols]`` of a dense bank (element strides) or a Q4_0 bank (bytes;
    each value dequantized exactly as ``d * (q - 8)``). Masked loads: nothing is read for an
    invalid expert."""
    m = row_ok[:, None] & col_ok[None, :]
    base = w_ptr + e.to(tl.int64) * W_ESTRIDE + rows.to(tl.int64)[:, None] * ROW_STRIDE
    if Q4:
        block = cols // 32
        j = cols % 32
        byte = tl.load(base + (block * 18 + 2 + j % 16)[None, :], mask=m, other=0).to(tl.int32)
        q = (byte >> (4 * (j // 16))[None, :]) & 15
        d = load_q4_0_scale(base + (block * 18)[None, :], m)
        return d * (q - 8).to(tl.float32)
    return tl.load(base + cols[None, :], mask=m, other=0.0).to(tl.float32)


@triton.jit
def moe_gate_up_kernel(x_ptr, x_stride, w_ptr, W_ESTRIDE, ROW_STRIDE, ids_ptr, h_ptr, E, H, INTER, TOP_K,
                       Q4: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    """h[pair, n] = silu(gate_e(x_t))[n] * up_e(x_t)[n] for pair = t * k + j, e = ids[pair]."""
    pair = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < INTER
    e = tl.load(ids_ptr + pair)
    valid = (e >= 0) & (e < E)
    e = tl.where(valid, e, 0)
    rows_ok = n_ok & (tl.zeros((BLOCK_N,), dtype=tl.int32) + valid.to(tl.int32) != 0)
    t = pair // TOP_K
    gate = tl.zeros((BLOCK_N,), dtype=tl.float32)
    up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        c_ok = cols < H
        xv = tl.load(x_ptr + t.to(tl.int64) * x_stride + cols, mask=c_ok, other=0.0).to(tl.float32)
        wg = _weight_tile(w_ptr, e, n, cols, rows_ok, c_ok, W_ESTRIDE, ROW_STRIDE, Q4)
        wu = _weight_tile(w_ptr, e, n + INTER, cols, rows_ok, c_ok, W_ESTRIDE, ROW_STRIDE, Q4)
        gate += tl.sum(wg * xv[None, :], axis=1)
        up += tl.sum(wu * xv[None, :], axis=1)
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + pair.to(tl.int64) * INTER + n, tl.where(rows_ok, h, 0.0), mask=n_ok)


@triton.jit
def moe_down_kernel(h_ptr, w_ptr, W_ESTRIDE, ROW_STRIDE, ids_ptr, wts_ptr, y_ptr, y_stride, E, H, INTER,
                    TOP_K, Q4: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_I: tl.constexpr):  # fmt: skip
    """y[t, n] = sum_j w[t, j] * down_e(h[t * k + j])[n], the k slots summed in order."""
    t = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(TOP_K):  # a loop, not unrolled: unrolled k = 8 runs RDNA out of SGPRs
        pair = t * TOP_K + j
        e = tl.load(ids_ptr + pair)
        valid = (e >= 0) & (e < E)
        e = tl.where(valid, e, 0)
        rows_ok = n_ok & (tl.zeros((BLOCK_N,), dtype=tl.int32) + valid.to(tl.int32) != 0)
        part = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for i0 in range(0, INTER, BLOCK_I):
            cols = i0 + tl.arange(0, BLOCK_I)
            c_ok = cols < INTER
            hv = tl.load(h_ptr + pair.to(tl.int64) * INTER + cols, mask=c_ok, other=0.0)
            wd = _weight_tile(w_ptr, e, n, cols, rows_ok, c_ok, W_ESTRIDE, ROW_STRIDE, Q4)
            part += tl.sum(wd * hv[None, :], axis=1)
        acc += tl.where(rows_ok, tl.load(wts_ptr + pair) * part, 0.0)
    tl.store(y_ptr + t.to(tl.int64) * y_stride + n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


def _bank_args(w) -> tuple[torch.Tensor, int, int, bool]:
    """(tensor, expert stride, row stride, is Q4_0) of a dense or Q4_0 bank."""
    from ftlab.quant import Q4_0Weight

    if isinstance(w, Q4_0Weight):
        return w.data, w.data.stride(0), w.data.stride(1), True
    w = w if w.stride(-1) == 1 else w.contiguous()
    return w, w.stride(0), w.stride(1), False


def moe_experts(x, w_gate_up, w_down, topk_weights, topk_ids, path: str) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.moe_experts` (dense banks, or Q4_0 banks on the
    dequant path): two launches, per-(token, slot) gate/up then per-token down + sum."""
    if path != "dequant" and not isinstance(w_gate_up, torch.Tensor):
        raise ValueError(f"the triton experts implement the dequant path only, got path={path!r}")
    t, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_experts, inter = w_gate_up.shape[0], w_down.shape[-1]
    x = x if x.stride(1) == 1 else x.contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    wts = topk_weights.contiguous()
    h = torch.empty((t * top_k, inter), dtype=torch.float32, device=x.device)
    y = torch.empty((t, hidden), dtype=x.dtype, device=x.device)
    if t == 0:
        return y
    gu, gu_e, gu_r, q4 = _bank_args(w_gate_up)
    moe_gate_up_kernel[(t * top_k, triton.cdiv(inter, _EXPERT_ROWS))](
        x, x.stride(0), gu, gu_e, gu_r, ids, h, num_experts, hidden, inter, top_k,
        Q4=q4, BLOCK_N=_EXPERT_ROWS, BLOCK_H=_EXPERT_COLS,
    )  # fmt: skip
    dn, dn_e, dn_r, q4d = _bank_args(w_down)
    moe_down_kernel[(t, triton.cdiv(hidden, _EXPERT_ROWS))](
        h, dn, dn_e, dn_r, ids, wts, y, y.stride(0), num_experts, hidden, inter,
        TOP_K=top_k, Q4=q4d, BLOCK_N=_EXPERT_ROWS, BLOCK_I=_EXPERT_COLS,
    )  # fmt: skip
    return y

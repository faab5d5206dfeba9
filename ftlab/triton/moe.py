"""Routed MoE in Triton (OPS.md section 3; reference: ftlab/reference/moe.py).

- ``route_topk_kernel``: one program per token: softmax over all E in fp32, then k rounds of
  ``argmax`` (``tie_break_left``: the lower expert id wins a tie), then renormalization.
- ``moe_align_*``: deterministic grouping by expert (no atomics, so the order within a
  group is the flat order t * k + j, as in the reference): count per expert, a prefix sum
  of the padded counts, then each expert's program writes its pairs' rows.
- Decode (at most ``DECODE_MAX_TOKENS`` tokens): per (token, slot) gate/up matvecs with the
  SwiGLU fused, then per token the down matvecs weighted and summed over the k slots in
  order. ``moe_gate_up_kernel`` / ``moe_down_kernel``: dense banks, or Q4_0 banks
  dequantized in registers (fp32). ``moe_gate_up_q8_kernel`` / ``moe_down_q8_kernel``: Q4_0
  banks on the int8 path: Q8_1 activations (x, then the SwiGLU output h) and the dp4a block
  dots of ``ftlab.triton.q4_0``. Slots with an invalid id load nothing (masked loads).
- Prefill: ``moe_align``, then ``moe_gemm_kernel`` twice over the sorted rows, one program
  per (block_m rows of one expert, BLOCK_N columns): gate/up with the SwiGLU fused (row r
  reads activation ``sorted[r] // k``), writing h per pair in x's dtype; then down, scaled
  by the routing weight (applied after down, in every backend), per pair in fp32; the k
  slots are summed last. Q4_0 banks are dequantized tile by tile to x's dtype (the
  dequant path); padding rows (the sentinel) load and store nothing, and blocks past
  ``num_tokens_post_padded`` return at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.backends import DECODE_MAX_TOKENS
from ftlab.platform import current
from ftlab.reference.moe import align_capacity
from ftlab.triton import q4_0 as tq
from ftlab.triton.q4_0 import _block_sums, _load_blocks, _load_x_words, load_q4_0_scale

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
            num_warps=1 if e <= 256 else 4,  # one warp: the k rounds of reductions need no barriers
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
                   {"K": 8, "KP": 8, "BLOCK_E": 128, "RENORM": True}, num_warps=1)
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
    table = tq.CONFIGS.get(target, tq.CONFIGS["default"])
    mv = table.get("moe_mv", table.get("mv4", table["mv"]))
    asm = bool(mv.get("asm", 0))
    q8_common = {"q8w_ptr": "*i32", "d8_ptr": "*fp32", "s8_ptr": "*fp32", "w32_ptr": "*i32", "w16_ptr": "*i16",
                 "E_H": "i64", "ROW_H": "i64", "ids_ptr": "*i32"}  # fmt: skip
    tiles = {"BLOCK_N": mv["BLOCK_N"], "BLOCK_KB": mv["BLOCK_KB"], "ASM": asm}
    for words in (True, False):
        specs.append(TritonSpec(f"moe_gate_up_q8_kernel[{'words' if words else 'halfwords'}]", moe_gate_up_q8_kernel,
                                {**q8_common, "h_ptr": "*fp32", "E": "i32", "NBK": "i32", "INTER": "i32", "TOP_K": "i32",
                                 "WORDS": "constexpr", "BLOCK_N": "constexpr", "BLOCK_KB": "constexpr", "ASM": "constexpr"},
                                {"WORDS": words, **tiles}, num_warps=mv["num_warps"]))  # fmt: skip
    specs.append(TritonSpec("moe_down_q8_kernel[words, bf16 out]", moe_down_q8_kernel,
                            {**q8_common, "wts_ptr": "*fp32", "y_ptr": "*bf16", "y_stride": "i32", "E": "i32", "H": "i32",
                             "NBI": "i32", "TOP_K": "i32", "WORDS": "constexpr", "BLOCK_N": "constexpr",
                             "BLOCK_KB": "constexpr", "ASM": "constexpr"},
                            {"WORDS": True, **tiles}, num_warps=mv["num_warps"]))  # fmt: skip
    big = GEMM_CONFIGS.get(target, GEMM_CONFIGS["default"])
    for dt, cfg in (("bf16", big), ("bf16", {**big, "BLOCK_M": 16}), ("fp32", GEMM_F32_CONFIG)):
        prec = "tf32x3" if dt == "fp32" and target.startswith("sm_") else "ieee"
        for q4 in (False, True):
            for gated in (True, False):
                specs.append(TritonSpec(
                    f"moe_gemm_kernel[{'gate_up' if gated else 'down'}, {'Q4_0' if q4 else dt} bank, {dt}, "
                    f"block_m {cfg['BLOCK_M']}]",
                    moe_gemm_kernel,
                    {"a_ptr": f"*{dt}", "a_stride": "i32", "w_ptr": "*u8" if q4 else f"*{dt}", "W_ESTRIDE": "i64",
                     "ROW_STRIDE": "i64", "sorted_ptr": "*i32", "expert_ids_ptr": "*i32", "npad_ptr": "*i32",
                     "out_ptr": f"*{dt}" if gated else "*fp32", "out_stride": "i32", "wts_ptr": "*fp32", "P": "i32",
                     "TOP_K": "i32", "N": "i32", "K": "i32", "GATED": "constexpr", "Q4": "constexpr",
                     "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "DT": "constexpr",
                     "F32_PRECISION": "constexpr"},
                    {"GATED": gated, "Q4": q4, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"],
                     "BLOCK_K": cfg["BLOCK_K"], "DT": tl.bfloat16 if dt == "bf16" else tl.float32,
                     "F32_PRECISION": prec},
                    num_warps=cfg["num_warps"], options={"num_stages": cfg["num_stages"]}))  # fmt: skip
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


@triton.jit
def _load_blocks_h16(w16_ptr, row16, kb, mask):
    """``_load_blocks`` for rows of an odd number of blocks (not word-aligned): block b is
    halfwords 9b (the fp16 scale) .. 9b + 8 (qs), nine halfword loads."""
    hp = w16_ptr + row16[:, None] + (kb * 9)[None, :]
    d4 = tl.load(hp, mask=mask, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    h1 = tl.load(hp + 1, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h2 = tl.load(hp + 2, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h3 = tl.load(hp + 3, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h4 = tl.load(hp + 4, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h5 = tl.load(hp + 5, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h6 = tl.load(hp + 6, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h7 = tl.load(hp + 7, mask=mask, other=0).to(tl.int32) & 0xFFFF
    h8 = tl.load(hp + 8, mask=mask, other=0).to(tl.int32) & 0xFFFF
    return h1 | (h2 << 16), h3 | (h4 << 16), h5 | (h6 << 16), h7 | (h8 << 16), d4


@triton.jit
def _q8_rows_dot(q8w_ptr, d8_ptr, s8_ptr, xrow, w32_ptr, w16_ptr, row16, rows_ok, NBK,
                 WORDS: tl.constexpr, BLOCK_KB: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """Int8 dots of Q4_0 rows (halfword offsets ``row16``, ``[R]``) with row ``xrow`` of Q8_1
    activations: per row, the sum over blocks of d4 * (d8 * sumi - 8 * s8), in fp32."""
    acc = tl.zeros(row16.shape, dtype=tl.float32)
    for kb0 in range(0, NBK, BLOCK_KB):
        kb = kb0 + tl.arange(0, BLOCK_KB)
        kb_ok = kb < NBK
        m = rows_ok[:, None] & kb_ok[None, :]
        x0, x1, x2, x3, x4, x5, x6, x7 = _load_x_words(q8w_ptr + xrow * NBK * 8 + kb * 8, kb_ok)
        xd = tl.load(d8_ptr + xrow * NBK + kb, mask=kb_ok, other=0.0)[None, :]
        xs = tl.load(s8_ptr + xrow * NBK + kb, mask=kb_ok, other=0.0)[None, :]
        if WORDS:
            q0, q1, q2, q3, d4 = _load_blocks(w32_ptr, w16_ptr, row16 // 2, kb, m)
        else:
            q0, q1, q2, q3, d4 = _load_blocks_h16(w16_ptr, row16, kb, m)
        sumi = _block_sums(q0, q1, q2, q3, x0, x1, x2, x3, x4, x5, x6, x7, ASM)
        acc += tl.sum(d4 * (xd * sumi.to(tl.float32) - 8.0 * xs), axis=1)
    return acc


@triton.jit
def moe_gate_up_q8_kernel(q8w_ptr, d8_ptr, s8_ptr, w32_ptr, w16_ptr, E_H, ROW_H, ids_ptr, h_ptr,
                          E, NBK, INTER, TOP_K, WORDS: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_KB: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """h[pair, n] = silu(g) * u, g and u the int8 dots of Q8_1 x[t] with Q4_0 rows n and
    n + I of expert ids[pair] (``E_H``, ``ROW_H``: expert and row strides in halfwords)."""
    pair = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    e = tl.load(ids_ptr + pair)
    valid = (e >= 0) & (e < E)
    rows_ok = (n < INTER) & (tl.zeros((BLOCK_N,), dtype=tl.int32) + valid.to(tl.int32) != 0)
    base = tl.where(valid, e, 0).to(tl.int64) * E_H
    xrow = (pair // TOP_K).to(tl.int64)
    g = _q8_rows_dot(q8w_ptr, d8_ptr, s8_ptr, xrow, w32_ptr, w16_ptr, base + n.to(tl.int64) * ROW_H, rows_ok, NBK,
                     WORDS, BLOCK_KB, ASM)  # fmt: skip
    u = _q8_rows_dot(q8w_ptr, d8_ptr, s8_ptr, xrow, w32_ptr, w16_ptr, base + (n + INTER).to(tl.int64) * ROW_H,
                     rows_ok, NBK, WORDS, BLOCK_KB, ASM)  # fmt: skip
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(h_ptr + pair.to(tl.int64) * INTER + n, tl.where(rows_ok, h, 0.0), mask=n < INTER)


@triton.jit
def moe_down_q8_kernel(q8w_ptr, d8_ptr, s8_ptr, w32_ptr, w16_ptr, E_H, ROW_H, ids_ptr, wts_ptr, y_ptr,
                       y_stride, E, H, NBI, TOP_K, WORDS: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_KB: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """y[t, n] = sum_j w[t, j] * (int8 dot of Q8_1 h[t * k + j] with Q4_0 row n of expert
    ids[t, j]), the k slots summed in order. Measured on an H200 (T = 1, k = 8) against two
    other shapes: the slots folded into one tile (10.8 us against 8.4 us) and Q8_1 of h
    computed in every program instead of one quantize launch (28.9 us)."""
    t = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(TOP_K):
        pair = t.to(tl.int64) * TOP_K + j
        e = tl.load(ids_ptr + pair)
        valid = (e >= 0) & (e < E)
        rows_ok = n_ok & (tl.zeros((BLOCK_N,), dtype=tl.int32) + valid.to(tl.int32) != 0)
        row16 = tl.where(valid, e, 0).to(tl.int64) * E_H + n.to(tl.int64) * ROW_H
        part = _q8_rows_dot(q8w_ptr, d8_ptr, s8_ptr, pair, w32_ptr, w16_ptr, row16, rows_ok, NBI, WORDS, BLOCK_KB,
                            ASM)  # fmt: skip
        acc += tl.where(rows_ok, tl.load(wts_ptr + pair) * part, 0.0)
    tl.store(y_ptr + t.to(tl.int64) * y_stride + n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _gemm_b_tile(w_ptr, e_off, rn, n_ok, k0, K, ROW_STRIDE, Q4: tl.constexpr, BLOCK_K: tl.constexpr,
                 DT: tl.constexpr):  # fmt: skip
    """The ``[BLOCK_K, BLOCK_N]`` tile ``W[e][rn, k0:k0+BLOCK_K].T`` in dtype DT. Q4_0: the
    tile's K order is that of ``q4_0_dequant_gemm_kernel`` (0, 16, 1, 17, ... per block:
    ``tl.join`` of the low and high nibbles), values ``d * (q - 8)`` rounded to DT."""
    wrow = w_ptr + e_off + rn.to(tl.int64) * ROW_STRIDE
    if Q4:
        r = tl.arange(0, BLOCK_K // 2)  # byte row: block r // 16, byte r % 16
        blk = k0 // 32 + r // 16
        wm = (blk < K // 32)[:, None] & n_ok[None, :]
        boff = (blk * 18)[:, None]
        d = load_q4_0_scale(wrow[None, :] + boff, wm)
        qs = tl.load(wrow[None, :] + boff + 2 + (r % 16)[:, None], mask=wm, other=0).to(tl.int32)
        wlo = (((qs & 15) - 8).to(tl.float32) * d).to(DT)
        whi = (((qs >> 4) - 8).to(tl.float32) * d).to(DT)
        return tl.reshape(tl.permute(tl.join(wlo, whi), (0, 2, 1)), (BLOCK_K, rn.shape[0]))
    else:
        kk = k0 + tl.arange(0, BLOCK_K)
        m = (kk < K)[:, None] & n_ok[None, :]
        return tl.load(wrow[None, :] + kk[:, None], mask=m, other=0.0).to(DT)


@triton.jit
def moe_gemm_kernel(a_ptr, a_stride, w_ptr, W_ESTRIDE, ROW_STRIDE, sorted_ptr, expert_ids_ptr, npad_ptr,
                    out_ptr, out_stride, wts_ptr, P, TOP_K, N, K,
                    GATED: tl.constexpr, Q4: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, DT: tl.constexpr, F32_PRECISION: tl.constexpr):  # fmt: skip
    """One grouped-GEMM step over the rows of ``moe_align`` (``BLOCK_M`` = its block_m).

    ``GATED``: out[pair, n] = silu(a[pair // k] . W[e][n]) * (a[pair // k] . W[e][N + n]),
    the gate/up SwiGLU; else out[pair, n] = w[pair] * (a[pair] . W[e][n]), the weighted
    down. Operands in DT (x's dtype; fp32 asks ``F32_PRECISION`` of tl.dot), fp32 sums."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(npad_ptr):
        return
    e = tl.load(expert_ids_ptr + pid_m)
    e_off = e.to(tl.int64) * W_ESTRIDE
    rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    r_ok = rows < P
    if GATED:
        arow = rows // TOP_K
    else:
        arow = rows
    arow_ptr = a_ptr + arow.to(tl.int64)[:, None] * a_stride
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    c = tl.arange(0, BLOCK_K)
    if Q4:  # the K order of the dequantized tile: 0, 16, 1, 17, ... within each block
        kcol = (c // 32) * 32 + (c % 32) // 2 + 16 * (c % 2)
    else:
        kcol = c
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(arow_ptr + (k0 + kcol)[None, :], mask=r_ok[:, None] & (k0 + c < K)[None, :], other=0.0)
        a = a.to(DT)
        b = _gemm_b_tile(w_ptr, e_off, rn, n_ok, k0, K, ROW_STRIDE, Q4, BLOCK_K, DT)
        acc = tl.dot(a, b, acc, input_precision=F32_PRECISION)
        if GATED:
            b_up = _gemm_b_tile(w_ptr, e_off, rn + N, n_ok, k0, K, ROW_STRIDE, Q4, BLOCK_K, DT)
            acc_up = tl.dot(a, b_up, acc_up, input_precision=F32_PRECISION)
    if GATED:
        res = acc / (1.0 + tl.exp(-acc)) * acc_up
    else:
        res = acc * tl.load(wts_ptr + rows, mask=r_ok, other=0.0)[:, None]
    out = out_ptr + rows.to(tl.int64)[:, None] * out_stride + rn[None, :]
    tl.store(out, res.to(out_ptr.dtype.element_ty), mask=r_ok[:, None] & n_ok[None, :])


GEMM_CONFIGS: dict[str, dict[str, int]] = {
    # untimed starting points but for sm_90 (see benchmarks/NOTES.md)
    "sm_90": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
    "default": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},
}
GEMM_F32_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 8, "num_stages": 2}


def _gemm_config(x: torch.Tensor, pairs: int, num_experts: int) -> dict[str, int]:
    """The table's tiles; rows per program (moe_align's block_m) no more than twice the mean
    rows an expert gets (at least 16, tl.dot's least), so few-token batches waste less."""
    if x.dtype == torch.float32:
        cfg = dict(GEMM_F32_CONFIG)
    else:
        arch = current(x.device).arch if x.device.type != "cpu" else None
        cfg = dict(GEMM_CONFIGS.get(arch or "default", GEMM_CONFIGS["default"]))
    mean_rows = max(1, pairs // num_experts)
    cfg["BLOCK_M"] = min(cfg["BLOCK_M"], max(16, triton.next_power_of_2(2 * mean_rows)))
    return cfg


def _words_ok(w) -> bool:
    """Q4_0 rows readable as 32-bit words: an even number of blocks and an aligned base."""
    return (w.shape[-1] // 32) % 2 == 0 and w.data.data_ptr() % 4 == 0


def _experts_q8(x, w_gate_up, w_down, wts, ids) -> torch.Tensor:
    """Decode experts on the int8 path: Q8_1 x -> gate/up + SwiGLU -> Q8_1 h -> down + sum."""
    t, hidden = x.shape
    top_k = ids.shape[1]
    num_experts, inter = w_gate_up.shape[0], w_down.shape[-1]
    table = tq._table(x.device)
    cfg = tq.config(next(k for k in ("moe_mv", "mv4", "mv") if k in table), x.device)
    asm = bool(cfg.get("asm", 0)) and not tq._interpreted()
    block_n, block_kb = cfg["BLOCK_N"], cfg["BLOCK_KB"]
    x8 = tq.quantize_q8_1(x)
    h = torch.empty((t * top_k, inter), dtype=torch.float32, device=x.device)
    gu = w_gate_up.data
    moe_gate_up_q8_kernel[(t * top_k, triton.cdiv(inter, block_n))](
        x8.q.view(torch.int32), x8.d, x8.s, gu.view(torch.int32) if _words_ok(w_gate_up) else gu.view(torch.int16),
        gu.view(torch.int16), gu.stride(0) // 2, gu.stride(1) // 2, ids, h, num_experts, hidden // 32, inter, top_k,
        WORDS=_words_ok(w_gate_up), BLOCK_N=block_n, BLOCK_KB=block_kb, ASM=asm, num_warps=cfg["num_warps"],
    )  # fmt: skip
    h8 = tq.quantize_q8_1(h)
    y = torch.empty((t, hidden), dtype=x.dtype, device=x.device)
    dn = w_down.data
    moe_down_q8_kernel[(t, triton.cdiv(hidden, block_n))](
        h8.q.view(torch.int32), h8.d, h8.s, dn.view(torch.int32) if _words_ok(w_down) else dn.view(torch.int16),
        dn.view(torch.int16), dn.stride(0) // 2, dn.stride(1) // 2, ids, wts, y, y.stride(0), num_experts, hidden,
        inter // 32, top_k, WORDS=_words_ok(w_down), BLOCK_N=block_n, BLOCK_KB=block_kb, ASM=asm,
        num_warps=cfg["num_warps"],
    )  # fmt: skip
    return y


def _experts_decode(x, w_gate_up, w_down, wts, ids) -> torch.Tensor:
    """Decode experts, dense banks or Q4_0 dequantized in registers, fp32 throughout."""
    t, hidden = x.shape
    top_k = ids.shape[1]
    num_experts, inter = w_gate_up.shape[0], w_down.shape[-1]
    h = torch.empty((t * top_k, inter), dtype=torch.float32, device=x.device)
    y = torch.empty((t, hidden), dtype=x.dtype, device=x.device)
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


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _experts_gemm(x, w_gate_up, w_down, wts, ids) -> torch.Tensor:
    """Prefill experts: moe_align, then the grouped GEMMs (gate/up + SwiGLU, weighted down),
    then the sum over the k slots."""
    t, hidden = x.shape
    top_k = ids.shape[1]
    num_experts, inter = w_gate_up.shape[0], w_down.shape[-1]
    cfg = _gemm_config(x, t * top_k, num_experts)
    bm = cfg["BLOCK_M"]
    sorted_ids, expert_ids, npad = moe_align(ids, num_experts, bm)
    # the CPU interpreter computes bf16 dots wrongly: fp32 operands there (exact casts)
    dt = torch.float32 if (tq._interpreted() and x.dtype == torch.bfloat16) else x.dtype
    prec = "ieee" if tq._interpreted() or current(x.device).kind != "cuda" else "tf32x3"
    pairs = t * top_k
    h = torch.empty((pairs, inter), dtype=dt, device=x.device)
    out = torch.zeros((pairs, hidden), dtype=torch.float32, device=x.device)
    blocks = sorted_ids.numel() // bm
    common = dict(BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], DT=_TL_DTYPES[dt],
                  F32_PRECISION=prec, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])  # fmt: skip
    for a, w, dst, n, k, gated in ((x, w_gate_up, h, inter, hidden, True), (h, w_down, out, hidden, inter, False)):
        wt, w_e, w_r, q4 = _bank_args(w)
        moe_gemm_kernel[(blocks, triton.cdiv(n, cfg["BLOCK_N"]))](
            a, a.stride(0), wt, w_e, w_r, sorted_ids, expert_ids, npad, dst, dst.stride(0), wts, pairs, top_k,
            n, k, GATED=gated, Q4=q4, **common,
        )  # fmt: skip
    return out.view(t, top_k, hidden).sum(1).to(x.dtype)


def moe_experts(x, w_gate_up, w_down, topk_weights, topk_ids, path: str) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.moe_experts` (``path`` resolved: "int8" or
    "dequant"). Q4_0 banks on the int8 path: the int8 decode kernels (any T); else up to
    ``DECODE_MAX_TOKENS`` tokens the fp32 decode kernels, beyond the grouped GEMM."""
    t, hidden = x.shape
    if t == 0:
        return torch.empty((0, hidden), dtype=x.dtype, device=x.device)
    x = x if x.stride(1) == 1 else x.contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    wts = topk_weights.contiguous()
    if path == "int8" and not isinstance(w_gate_up, torch.Tensor):
        return _experts_q8(x, w_gate_up, w_down, wts, ids)
    if t <= DECODE_MAX_TOKENS:
        return _experts_decode(x, w_gate_up, w_down, wts, ids)
    return _experts_gemm(x, w_gate_up, w_down, wts, ids)

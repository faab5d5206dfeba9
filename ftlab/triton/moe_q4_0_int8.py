"""Routed SwiGLU experts in Triton on two Q4_0 banks, the int8 path (docs/OPS.md section 3;
reference: ``ftlab/reference/moe.py``), any T: per (token, slot) the gate/up matvecs with the
SwiGLU fused (``moe_gate_up_q8_kernel``), then per token the down matvecs weighted and summed over
the k slots in order (``moe_down_q8_kernel``), on Q8_1 activations (x, then the SwiGLU output h)
and the dp4a block dots of ``ftlab.triton.q4_0_common``, in the tiles of its launch table
(``moe_mv`` where the target has one). Slots with an invalid id load nothing (masked loads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.triton.moe_route import expert_slot
from ftlab.triton.q4_0 import quantize_q8_1
from ftlab.triton.q4_0_common import (
    CONFIGS,
    block_sums,
    config,
    interpreted,
    launch_table,
    load_blocks,
    load_blocks_h16,
    load_x_words,
)


@triton.jit
def _q8_rows_dot(
    q8w_ptr,
    d8_ptr,
    s8_ptr,
    xrow,
    w32_ptr,
    w16_ptr,
    row16,
    rows_ok,
    NBK,
    WORDS: tl.constexpr,
    BLOCK_KB: tl.constexpr,
    ASM: tl.constexpr,
):
    """Int8 dots of Q4_0 rows (halfword offsets ``row16``, ``[R]``) with row ``xrow`` of Q8_1
    activations: per row, the sum over blocks of d4 * (d8 * sumi - 8 * s8), in fp32."""
    acc = tl.zeros(row16.shape, dtype=tl.float32)
    for kb0 in range(0, NBK, BLOCK_KB):
        kb = kb0 + tl.arange(0, BLOCK_KB)
        kb_ok = kb < NBK
        m = rows_ok[:, None] & kb_ok[None, :]
        x0, x1, x2, x3, x4, x5, x6, x7 = load_x_words(q8w_ptr + xrow * NBK * 8 + kb * 8, kb_ok)
        xd = tl.load(d8_ptr + xrow * NBK + kb, mask=kb_ok, other=0.0)[None, :]
        xs = tl.load(s8_ptr + xrow * NBK + kb, mask=kb_ok, other=0.0)[None, :]
        if WORDS:
            q0, q1, q2, q3, d4 = load_blocks(w32_ptr, w16_ptr, row16 // 2, kb, m)
        else:
            q0, q1, q2, q3, d4 = load_blocks_h16(w16_ptr, row16, kb, m)
        sumi = block_sums(q0, q1, q2, q3, x0, x1, x2, x3, x4, x5, x6, x7, ASM)
        acc += tl.sum(d4 * (xd * sumi.to(tl.float32) - 8.0 * xs), axis=1)
    return acc


@triton.jit
def moe_gate_up_q8_kernel(
    q8w_ptr,
    d8_ptr,
    s8_ptr,
    w32_ptr,
    w16_ptr,
    E_H,
    ROW_H,
    ids_ptr,
    h_ptr,
    E,
    NBK,
    INTER,
    TOP_K,
    WORDS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_KB: tl.constexpr,
    ASM: tl.constexpr,
):
    """h[pair, n] = silu(g) * u, g and u the int8 dots of Q8_1 x[t] with Q4_0 rows n and
    n + I of expert ids[pair] (``E_H``, ``ROW_H``: expert and row strides in halfwords)."""
    pair = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    e, rows_ok = expert_slot(ids_ptr, pair, E, n, INTER)
    base = e.to(tl.int64) * E_H
    xrow = (pair // TOP_K).to(tl.int64)
    g = _q8_rows_dot(
        q8w_ptr,
        d8_ptr,
        s8_ptr,
        xrow,
        w32_ptr,
        w16_ptr,
        base + n.to(tl.int64) * ROW_H,
        rows_ok,
        NBK,
        WORDS,
        BLOCK_KB,
        ASM,
    )
    u = _q8_rows_dot(
        q8w_ptr,
        d8_ptr,
        s8_ptr,
        xrow,
        w32_ptr,
        w16_ptr,
        base + (n + INTER).to(tl.int64) * ROW_H,
        rows_ok,
        NBK,
        WORDS,
        BLOCK_KB,
        ASM,
    )
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(h_ptr + pair.to(tl.int64) * INTER + n, tl.where(rows_ok, h, 0.0), mask=n < INTER)


@triton.jit
def moe_down_q8_kernel(
    q8w_ptr,
    d8_ptr,
    s8_ptr,
    w32_ptr,
    w16_ptr,
    E_H,
    ROW_H,
    ids_ptr,
    wts_ptr,
    y_ptr,
    y_stride,
    E,
    H,
    NBI,
    TOP_K,
    WORDS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_KB: tl.constexpr,
    ASM: tl.constexpr,
):
    """y[t, n] = sum_j w[t, j] * (int8 dot of Q8_1 h[t * k + j] with Q4_0 row n of expert
    ids[t, j]), the k slots summed in order. Faster than the two other shapes measured (the slots
    folded into one tile; Q8_1 of h computed in every program instead of one quantize launch):
    benchmarks/NOTES.md."""
    t = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(TOP_K):
        pair = t.to(tl.int64) * TOP_K + j
        e, rows_ok = expert_slot(ids_ptr, pair, E, n, H)
        row16 = e.to(tl.int64) * E_H + n.to(tl.int64) * ROW_H
        part = _q8_rows_dot(
            q8w_ptr,
            d8_ptr,
            s8_ptr,
            pair,
            w32_ptr,
            w16_ptr,
            row16,
            rows_ok,
            NBI,
            WORDS,
            BLOCK_KB,
            ASM,
        )
        acc += tl.where(rows_ok, tl.load(wts_ptr + pair) * part, 0.0)
    tl.store(y_ptr + t.to(tl.int64) * y_stride + n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


def _words_ok(w) -> bool:
    """Q4_0 rows readable as 32-bit words: an even number of blocks and an aligned base."""
    return (w.shape[-1] // 32) % 2 == 0 and w.data.data_ptr() % 4 == 0


def experts_q4_0_int8(x, w_gate_up, w_down, wts, ids) -> torch.Tensor:
    """The int8 path on two Q4_0 banks, any T (x ``[T, H]``, contiguous rows; ``wts`` ``[T, k]``
    fp32, ``ids`` ``[T, k]`` int32): Q8_1 x -> gate/up + SwiGLU -> Q8_1 h -> down + the weighted
    sum over the slots, y ``[T, H]`` in x's dtype."""
    t, hidden = x.shape
    top_k = ids.shape[1]
    num_experts, inter = w_gate_up.shape[0], w_down.shape[-1]
    table = launch_table(x.device)
    cfg = config(next(k for k in ("moe_mv", "mv4", "mv") if k in table), x.device)
    asm = bool(cfg.get("asm", 0)) and not interpreted()
    block_n, block_kb = cfg["BLOCK_N"], cfg["BLOCK_KB"]
    x8 = quantize_q8_1(x)
    h = torch.empty((t * top_k, inter), dtype=torch.float32, device=x.device)
    gu = w_gate_up.data
    moe_gate_up_q8_kernel[(t * top_k, triton.cdiv(inter, block_n))](
        x8.q.view(torch.int32),
        x8.d,
        x8.s,
        gu.view(torch.int32) if _words_ok(w_gate_up) else gu.view(torch.int16),
        gu.view(torch.int16),
        gu.stride(0) // 2,
        gu.stride(1) // 2,
        ids,
        h,
        num_experts,
        hidden // 32,
        inter,
        top_k,
        WORDS=_words_ok(w_gate_up),
        BLOCK_N=block_n,
        BLOCK_KB=block_kb,
        ASM=asm,
        num_warps=cfg["num_warps"],
    )
    h8 = quantize_q8_1(h)
    y = torch.empty((t, hidden), dtype=x.dtype, device=x.device)
    dn = w_down.data
    moe_down_q8_kernel[(t, triton.cdiv(hidden, block_n))](
        h8.q.view(torch.int32),
        h8.d,
        h8.s,
        dn.view(torch.int32) if _words_ok(w_down) else dn.view(torch.int16),
        dn.view(torch.int16),
        dn.stride(0) // 2,
        dn.stride(1) // 2,
        ids,
        wts,
        y,
        y.stride(0),
        num_experts,
        hidden,
        inter // 32,
        top_k,
        WORDS=_words_ok(w_down),
        BLOCK_N=block_n,
        BLOCK_KB=block_kb,
        ASM=asm,
        num_warps=cfg["num_warps"],
    )
    return y


def compile_specs(target: str) -> list:
    """The int8 expert kernels in ``target``'s tiles (see ftlab.compile_check)."""
    from ftlab.triton.compile_spec import spec

    specs = []
    table = CONFIGS.get(target, CONFIGS["default"])
    mv = table.get("moe_mv", table.get("mv4", table["mv"]))
    q8 = {
        "q8w_ptr": "*i32",
        "d8_ptr": "*fp32",
        "s8_ptr": "*fp32",
        "w32_ptr": "*i32",
        "w16_ptr": "*i16",
        "E_H": "i64",
        "ROW_H": "i64",
        "ids_ptr": "*i32",
    }
    tiles = {"BLOCK_N": mv["BLOCK_N"], "BLOCK_KB": mv["BLOCK_KB"], "ASM": bool(mv.get("asm", 0))}
    for words in (True, False):
        specs.append(
            spec(
                moe_gate_up_q8_kernel,
                f"moe_gate_up_q8_kernel[{'words' if words else 'halfwords'}]",
                types={**q8, "h_ptr": "*fp32"},
                constexprs={"WORDS": words, **tiles},
                num_warps=mv["num_warps"],
            )
        )
    specs.append(
        spec(
            moe_down_q8_kernel,
            "moe_down_q8_kernel[words, bf16 out]",
            types={**q8, "wts_ptr": "*fp32", "y_ptr": "*bf16"},
            constexprs={"WORDS": True, **tiles},
            num_warps=mv["num_warps"],
        )
    )
    return specs

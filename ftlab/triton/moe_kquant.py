"""Routed SwiGLU experts in Triton on banks of Q8_0 and the K-quants (Q4_K, Q5_K, Q6_K), a bank of
Q4_0 beside one of them included (Q4_K_M: Q4_K gate_up, Q6_K down): the int8 path
(docs/OPS.md section 3; reference: ``ftlab/reference/moe.py``, whose int8 terms are those of
``ftlab/reference/quant_matmul.py``); the dequant path (prefill) on such banks is the grouped GEMM
of ``ftlab/triton/moe_kquant_gemm.py``.

Per (token, slot) the gate/up matvecs with the SwiGLU fused (``moe_gate_up_kq_kernel``), then per
token the down matvecs weighted and summed over the k slots in order (``moe_down_kq_kernel``),
x and h as Q8_1 (``ftlab.triton.q4_0.quantize_q8_1``). ``_kq_dot`` walks a row 256 weights (8
Q8_1 blocks) at a time: each 32- (Q6_K: 16-) sub-block's exact integer dot with its Q8_1 block
is a sum of int32 products, scaled in fp32 as the reference scales it. Slots with an invalid id
load nothing (masked loads); no host synchronization, so a launch can be captured.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.triton.moe_route import expert_slot
from ftlab.triton.q4_0 import quantize_q8_1
from ftlab.triton.q4_0_common import load_q4_0_scale
from ftlab.triton.quants import scale_min_k4

#: the ``QT`` of each bank type in the kernels
QT_CODES = {"Q8_0": 0, "Q4_K": 1, "Q5_K": 2, "Q6_K": 3, "Q4_0": 4}
#: output rows a program (gate/up: each of gate and up): a [4, 8, 32] tile of weights a step, 8 a
#: thread at 4 warps (16 rows spilled on RDNA)
BLOCK_ROWS = 4
#: warps a program by bank type (4 otherwise): Q6_K's down kernel ran RDNA 3.5 / 4 out of SGPRs
#: at 4 (spills) and fits at 8
NUM_WARPS = {"Q6_K": 8}


@triton.jit
def _kq_dot(wr, rows_ok, xq, xd, xs, K, QT: tl.constexpr, BLOCK_N: tl.constexpr):
    """``[BLOCK_N]`` int8-path dots of the weight rows at byte pointers ``wr`` (type ``QT``) with
    one row of Q8_1 activations (``xq`` int8 ``[K]``, ``xd`` / ``xs`` fp32 ``[K / 32]``)."""
    j8 = tl.arange(0, 8)  # Q8_1 block within a 256-chunk
    i32 = tl.arange(0, 32)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for c in range(0, K // 32, 8):
        jb = c + j8
        j_ok = jb < K // 32  # Q8_0 / Q4_0 rows of K % 256 != 0 end inside a chunk
        m2 = rows_ok[:, None] & j_ok[None, :]
        m3 = m2[:, :, None]
        # [8, 32]
        x = tl.load(xq + jb[:, None] * 32 + i32[None, :], mask=j_ok[:, None], other=0).to(tl.int32)
        d8 = tl.load(xd + jb, mask=j_ok, other=0.0)[None, :]
        if QT == 0:  # Q8_0: d * (d8 * sumi)
            wb = wr[:, None] + jb[None, :].to(tl.int64) * 34
            q = tl.load(wb[:, :, None] + 2 + i32[None, None, :], mask=m3, other=0).to(
                tl.int8, bitcast=True
            )
            sumi = tl.sum(q.to(tl.int32) * x[None], axis=2).to(tl.float32)
            acc += tl.sum(load_q4_0_scale(wb, m2) * (d8 * sumi), axis=1)
        elif QT == 4:  # Q4_0: d * (d8 * sumi - 8 * s8)
            wb = wr[:, None] + jb[None, :].to(tl.int64) * 18
            byte = tl.load(wb[:, :, None] + 2 + (i32 % 16)[None, None, :], mask=m3, other=0).to(
                tl.int32
            )
            q = (byte >> (4 * (i32 // 16))[None, None, :]) & 0x0F
            sumi = tl.sum(q * x[None], axis=2).to(tl.float32)
            s8 = tl.load(xs + jb, mask=j_ok, other=0.0)[None, :]
            acc += tl.sum(load_q4_0_scale(wb, m2) * (d8 * sumi - 8.0 * s8), axis=1)
        elif QT == 3:  # Q6_K: sub-block 4 h + g of 32, halves of 16 with scales 2 (4 h + g) + 0 / 1
            wb = wr + (c // 8) * 210
            hh = j8 // 4
            g = j8 % 4
            ql = tl.load(
                wb[:, None, None] + (64 * hh + 32 * (g % 2))[None, :, None] + i32[None, None, :],
                mask=m3,
                other=0,
            ).to(tl.int32)
            qh = tl.load(
                wb[:, None, None] + (128 + 32 * hh)[None, :, None] + i32[None, None, :],
                mask=m3,
                other=0,
            ).to(tl.int32)
            q = ((ql >> (4 * (g // 2))[None, :, None]) & 0x0F) | (
                ((qh >> (2 * g)[None, :, None]) & 3) << 4
            )
            prod = (q - 32) * x[None]  # [BN, 8, 32]
            first = (i32 < 16)[None, None, :]
            sum0 = tl.sum(tl.where(first, prod, 0), axis=2).to(tl.float32)
            sum1 = tl.sum(tl.where(first, 0, prod), axis=2).to(tl.float32)
            sp = wb[:, None] + 192 + 2 * j8[None, :]
            sc0 = tl.load(sp, mask=m2, other=0).to(tl.int8, bitcast=True).to(tl.float32)
            sc1 = tl.load(sp + 1, mask=m2, other=0).to(tl.int8, bitcast=True).to(tl.float32)
            d = load_q4_0_scale(wb + 208, rows_ok)[:, None]
            acc += tl.sum(d * (d8 * (sc0 * sum0)) + d * (d8 * (sc1 * sum1)), axis=1)
        else:  # Q4_K / Q5_K: d * (d8 * (sc * sumi)) - dmin * (m * s8)
            NB: tl.constexpr = 176 if QT == 2 else 144
            QS: tl.constexpr = 48 if QT == 2 else 16
            wb = wr + (c // 8) * NB
            qs = tl.load(
                wb[:, None, None] + QS + (32 * (j8 // 2))[None, :, None] + i32[None, None, :],
                mask=m3,
                other=0,
            ).to(tl.int32)
            q = (qs >> (4 * (j8 % 2))[None, :, None]) & 0x0F
            if QT == 2:
                qh = tl.load(
                    wb[:, None, None] + 16 + i32[None, None, :] + 0 * j8[None, :, None],
                    mask=m3,
                    other=0,
                ).to(tl.int32)
                q = q | (((qh >> j8[None, :, None]) & 1) << 4)
            sumi = tl.sum(q * x[None], axis=2).to(tl.float32)
            sc, mn = scale_min_k4(wb[:, None] + 4, j8[None, :], m2)
            s8 = tl.load(xs + jb, mask=j_ok, other=0.0)[None, :]
            d = load_q4_0_scale(wb, rows_ok)[:, None]
            dmin = load_q4_0_scale(wb + 2, rows_ok)[:, None]
            acc += tl.sum(d * (d8 * (sc * sumi)) - dmin * (mn * s8), axis=1)
    return acc


@triton.jit
def moe_gate_up_kq_kernel(
    q8_ptr,
    d8_ptr,
    s8_ptr,
    w_ptr,
    E_BYTES,
    ROW_BYTES,
    ids_ptr,
    h_ptr,
    E,
    H,
    INTER,
    TOP_K,
    QT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """h[pair, n] = silu(g) * u, g and u the int8 dots of Q8_1 x[t] with rows n and n + I of
    expert ids[pair] (``E_BYTES``, ``ROW_BYTES``: the bank's expert and row strides)."""
    pair = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    e, rows_ok = expert_slot(ids_ptr, pair, E, n, INTER)
    base = w_ptr + e.to(tl.int64) * E_BYTES
    t = (pair // TOP_K).to(tl.int64)
    xq, xd, xs = q8_ptr + t * H, d8_ptr + t * (H // 32), s8_ptr + t * (H // 32)
    g = _kq_dot(base + n.to(tl.int64) * ROW_BYTES, rows_ok, xq, xd, xs, H, QT, BLOCK_N)
    u = _kq_dot(base + (n + INTER).to(tl.int64) * ROW_BYTES, rows_ok, xq, xd, xs, H, QT, BLOCK_N)
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(h_ptr + pair.to(tl.int64) * INTER + n, tl.where(rows_ok, h, 0.0), mask=n < INTER)


@triton.jit
def moe_down_kq_kernel(
    q8_ptr,
    d8_ptr,
    s8_ptr,
    w_ptr,
    E_BYTES,
    ROW_BYTES,
    ids_ptr,
    wts_ptr,
    y_ptr,
    y_stride,
    E,
    H,
    INTER,
    TOP_K,
    QT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """y[t, n] = sum_j w[t, j] * (int8 dot of Q8_1 h[t * k + j] with row n of expert ids[t, j]),
    the k slots summed in order."""
    t = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(TOP_K):
        pair = t.to(tl.int64) * TOP_K + j
        e, rows_ok = expert_slot(ids_ptr, pair, E, n, H)
        rows = w_ptr + e.to(tl.int64) * E_BYTES + n.to(tl.int64) * ROW_BYTES
        part = _kq_dot(
            rows,
            rows_ok,
            q8_ptr + pair * INTER,
            d8_ptr + pair * (INTER // 32),
            s8_ptr + pair * (INTER // 32),
            INTER,
            QT,
            BLOCK_N,
        )
        acc += tl.where(rows_ok, tl.load(wts_ptr + pair) * part, 0.0)
    tl.store(y_ptr + t.to(tl.int64) * y_stride + n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


def experts_kquant(x, w_gate_up, w_down, wts, ids) -> torch.Tensor:
    """The int8 path on quantized banks of any two :data:`QT_CODES` types, any T: Q8_1 x ->
    gate/up + SwiGLU -> Q8_1 h -> down + the weighted sum over the slots."""
    t, hidden = x.shape
    top_k = ids.shape[1]
    num_experts, inter = w_gate_up.shape[0], w_down.shape[-1]
    x8 = quantize_q8_1(x)
    h = torch.empty((t * top_k, inter), dtype=torch.float32, device=x.device)
    gu = w_gate_up.data
    moe_gate_up_kq_kernel[(t * top_k, triton.cdiv(inter, BLOCK_ROWS))](
        x8.q,
        x8.d,
        x8.s,
        gu,
        gu.stride(0),
        gu.stride(1),
        ids,
        h,
        num_experts,
        hidden,
        inter,
        top_k,
        QT=QT_CODES[w_gate_up.qtype],
        BLOCK_N=BLOCK_ROWS,
        num_warps=NUM_WARPS.get(w_gate_up.qtype, 4),
    )
    h8 = quantize_q8_1(h)
    y = torch.empty((t, hidden), dtype=x.dtype, device=x.device)
    dn = w_down.data
    moe_down_kq_kernel[(t, triton.cdiv(hidden, BLOCK_ROWS))](
        h8.q,
        h8.d,
        h8.s,
        dn,
        dn.stride(0),
        dn.stride(1),
        ids,
        wts,
        y,
        y.stride(0),
        num_experts,
        hidden,
        inter,
        top_k,
        QT=QT_CODES[w_down.qtype],
        BLOCK_N=BLOCK_ROWS,
        num_warps=NUM_WARPS.get(w_down.qtype, 4),
    )
    return y


def compile_specs(target: str) -> list:
    """The int8 expert kernels for each bank type (the same on every target)."""
    from ftlab.triton.compile_spec import spec

    q8 = {
        "q8_ptr": "*i8",
        "d8_ptr": "*fp32",
        "s8_ptr": "*fp32",
        "w_ptr": "*u8",
        "E_BYTES": "i64",
        "ROW_BYTES": "i64",
        "ids_ptr": "*i32",
    }
    specs = []
    for qtype, code in QT_CODES.items():
        warps = NUM_WARPS.get(qtype, 4)
        specs.append(
            spec(
                moe_gate_up_kq_kernel,
                f"moe_gate_up_kq_kernel[{qtype}]",
                types={**q8, "h_ptr": "*fp32"},
                constexprs={"QT": code, "BLOCK_N": BLOCK_ROWS},
                num_warps=warps,
            )
        )
        specs.append(
            spec(
                moe_down_kq_kernel,
                f"moe_down_kq_kernel[{qtype}, bf16 out]",
                types={**q8, "wts_ptr": "*fp32", "y_ptr": "*bf16"},
                constexprs={"QT": code, "BLOCK_N": BLOCK_ROWS},
                num_warps=warps,
            )
        )
    return specs

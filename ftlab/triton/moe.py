"""Routed MoE in Triton (docs/OPS.md section 3; reference: ``ftlab/reference/moe.py``): the
family's backend entries.

- ``route_topk``, ``router_topk``, ``moe_align``: ``ftlab/triton/moe_route.py``.
- ``moe_experts``, decode (at most ``DECODE_MAX_TOKENS`` tokens), dense banks or Q4_0 banks
  dequantized in registers (fp32): per (token, slot) gate/up matvecs with the SwiGLU fused
  (``moe_gate_up_kernel``), then per token the down matvecs weighted and summed over the k slots
  in order (``moe_down_kernel``). Slots with an invalid id load nothing (masked loads).
- ``moe_experts`` on Q4_0 banks, the int8 path (any T): ``ftlab/triton/moe_q4_0_int8.py``.
- ``moe_experts``, prefill: the grouped GEMMs of ``ftlab/triton/moe_gemm.py``.
- ``moe_experts`` on Q8_0 / K-quant banks: ``ftlab/triton/moe_kquant.py`` (int8) and
  ``ftlab/triton/moe_kquant_gemm.py`` (dequant).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.backends import DECODE_MAX_TOKENS
from ftlab.platform import current
from ftlab.quant import Q4_0Weight
from ftlab.triton.moe_gemm import bank_args, experts_gemm
from ftlab.triton.moe_kquant import experts_kquant
from ftlab.triton.moe_kquant_gemm import experts_kquant_gemm, q4_0_pairs
from ftlab.triton.moe_q4_0_int8 import experts_q4_0_int8
from ftlab.triton.moe_route import expert_slot, moe_align, route_topk, router_topk
from ftlab.triton.norm import add_rmsnorm
from ftlab.triton.q4_0_common import load_q4_0_scale

__all__ = ["add_rmsnorm_router_topk", "moe_align", "moe_experts", "route_topk", "router_topk"]


def add_rmsnorm_router_topk(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    top_k: int,
    renormalize: bool,
) -> tuple:
    """Backend entry of :func:`ftlab.ops.add_rmsnorm_router_topk`: Triton's add_rmsnorm, then its
    router_topk of the output (two launches: hip's is the one-launch form)."""
    y, s = add_rmsnorm(x, residual, norm_weight, eps)
    return (y, s, *router_topk(y, weight, top_k, renormalize))


# expert matvec tiles: 16 output rows (32 ran RDNA out of SGPRs) x 64 of the reduction
_EXPERT_ROWS = 16
_EXPERT_COLS = 64


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
def moe_gate_up_kernel(
    x_ptr,
    x_stride,
    w_ptr,
    W_ESTRIDE,
    ROW_STRIDE,
    ids_ptr,
    h_ptr,
    E,
    H,
    INTER,
    TOP_K,
    Q4: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """h[pair, n] = silu(gate_e(x_t))[n] * up_e(x_t)[n] for pair = t * k + j, e = ids[pair]."""
    pair = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < INTER
    e, rows_ok = expert_slot(ids_ptr, pair, E, n, INTER)
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
def moe_down_kernel(
    h_ptr,
    w_ptr,
    W_ESTRIDE,
    ROW_STRIDE,
    ids_ptr,
    wts_ptr,
    y_ptr,
    y_stride,
    E,
    H,
    INTER,
    TOP_K,
    Q4: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_I: tl.constexpr,
):
    """y[t, n] = sum_j w[t, j] * down_e(h[t * k + j])[n], the k slots summed in order."""
    t = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(TOP_K):  # a loop, not unrolled: unrolled k = 8 runs RDNA out of SGPRs
        pair = t * TOP_K + j
        e, rows_ok = expert_slot(ids_ptr, pair, E, n, H)
        part = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for i0 in range(0, INTER, BLOCK_I):
            cols = i0 + tl.arange(0, BLOCK_I)
            c_ok = cols < INTER
            hv = tl.load(h_ptr + pair.to(tl.int64) * INTER + cols, mask=c_ok, other=0.0)
            wd = _weight_tile(w_ptr, e, n, cols, rows_ok, c_ok, W_ESTRIDE, ROW_STRIDE, Q4)
            part += tl.sum(wd * hv[None, :], axis=1)
        acc += tl.where(rows_ok, tl.load(wts_ptr + pair) * part, 0.0)
    tl.store(y_ptr + t.to(tl.int64) * y_stride + n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


def _experts_decode(x, w_gate_up, w_down, wts, ids) -> torch.Tensor:
    """Decode experts, dense banks or Q4_0 dequantized in registers, fp32 throughout."""
    t, hidden = x.shape
    top_k = ids.shape[1]
    num_experts, inter = w_gate_up.shape[0], w_down.shape[-1]
    h = torch.empty((t * top_k, inter), dtype=torch.float32, device=x.device)
    y = torch.empty((t, hidden), dtype=x.dtype, device=x.device)
    gu, gu_e, gu_r, q4 = bank_args(w_gate_up)
    moe_gate_up_kernel[(t * top_k, triton.cdiv(inter, _EXPERT_ROWS))](
        x,
        x.stride(0),
        gu,
        gu_e,
        gu_r,
        ids,
        h,
        num_experts,
        hidden,
        inter,
        top_k,
        Q4=q4,
        BLOCK_N=_EXPERT_ROWS,
        BLOCK_H=_EXPERT_COLS,
    )
    dn, dn_e, dn_r, q4d = bank_args(w_down)
    moe_down_kernel[(t, triton.cdiv(hidden, _EXPERT_ROWS))](
        h,
        dn,
        dn_e,
        dn_r,
        ids,
        wts,
        y,
        y.stride(0),
        num_experts,
        hidden,
        inter,
        TOP_K=top_k,
        Q4=q4d,
        BLOCK_N=_EXPERT_ROWS,
        BLOCK_I=_EXPERT_COLS,
    )
    return y


def moe_experts(x, w_gate_up, w_down, topk_weights, topk_ids, path: str) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.moe_experts` (``path`` resolved: "int8" or
    "dequant"). Q4_0 banks on the int8 path: the int8 kernels of ``moe_q4_0_int8`` (any T);
    Q8_0 / K-quant banks: those of ``moe_kquant`` (int8: matvecs at any T) and
    ``moe_kquant_gemm`` (dequant: its grouped GEMM); else up to ``DECODE_MAX_TOKENS`` tokens the
    fp32 decode kernels, beyond the grouped GEMM (Q4_0 banks where ``moe_kquant_gemm.q4_0_pairs``:
    its 64-weight-step GEMM)."""
    t, hidden = x.shape
    if t == 0:
        return torch.empty((0, hidden), dtype=x.dtype, device=x.device)
    x = x if x.stride(1) == 1 else x.contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    wts = topk_weights.contiguous()
    if not isinstance(w_gate_up, torch.Tensor) and not (
        isinstance(w_gate_up, Q4_0Weight) and isinstance(w_down, Q4_0Weight)
    ):
        kquant = experts_kquant if path == "int8" else experts_kquant_gemm
        return kquant(x, w_gate_up, w_down, wts, ids)
    if path == "int8" and not isinstance(w_gate_up, torch.Tensor):
        return experts_q4_0_int8(x, w_gate_up, w_down, wts, ids)
    if t <= DECODE_MAX_TOKENS:
        return _experts_decode(x, w_gate_up, w_down, wts, ids)
    if (
        not isinstance(w_gate_up, torch.Tensor)
        and x.device.type != "cpu"
        and q4_0_pairs(x.dtype, current(x.device).arch)
    ):
        return experts_kquant_gemm(x, w_gate_up, w_down, wts, ids)  # 64-weight steps
    return experts_gemm(x, w_gate_up, w_down, wts, ids)


def compile_specs(target: str) -> list:
    """The fp32 decode configurations compile-checked for ``target`` (see ftlab.compile_check)."""
    from ftlab.triton.compile_spec import spec

    specs = []
    for q4 in (False, True):
        w = "*u8" if q4 else "*bf16"
        label = "Q4_0" if q4 else "bf16"
        specs.append(
            spec(
                moe_gate_up_kernel,
                f"moe_gate_up_kernel[{label} bank]",
                types={"x_ptr": "*bf16", "w_ptr": w, "ids_ptr": "*i32", "h_ptr": "*fp32"},
                constexprs={"Q4": q4, "BLOCK_N": _EXPERT_ROWS, "BLOCK_H": _EXPERT_COLS},
            )
        )
        specs.append(
            spec(
                moe_down_kernel,
                f"moe_down_kernel[{label} bank]",
                types={
                    "h_ptr": "*fp32",
                    "w_ptr": w,
                    "ids_ptr": "*i32",
                    "wts_ptr": "*fp32",
                    "y_ptr": "*bf16",
                },
                constexprs={"Q4": q4, "BLOCK_N": _EXPERT_ROWS, "BLOCK_I": _EXPERT_COLS},
            )
        )
    return specs

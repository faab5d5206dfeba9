"""The prefill experts in Triton: grouped GEMMs over ``moe_align``'s rows (docs/OPS.md section 3;
reference: ``ftlab/reference/moe.py``), what ``ftlab/triton/moe.py``'s ``moe_experts`` runs above
``DECODE_MAX_TOKENS`` tokens.

``moe_align``, then ``moe_gemm_kernel`` twice over the sorted rows, one program per (block_m
rows of one expert, BLOCK_N columns): gate/up with the SwiGLU fused (row r reads activation
``sorted[r] // k``), writing h per pair in x's dtype; then down, scaled by the routing weight
(applied after down, in every backend), per pair in fp32; the k slots are summed last. Q4_0
banks are dequantized tile by tile to x's dtype (the dequant path); padding rows (the
sentinel) load and store nothing, and blocks past ``num_tokens_post_padded`` return at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.backends import tuning
from ftlab.platform import current, platform_from_arch
from ftlab.quant import Q4_0Weight
from ftlab.triton.moe_route import moe_align
from ftlab.triton.q4_0_common import interpreted, load_q4_0_scale


def bank_args(w) -> tuple[torch.Tensor, int, int, bool]:
    """(tensor, expert stride, row stride, is Q4_0) of a dense or Q4_0 bank."""
    if isinstance(w, Q4_0Weight):
        return w.data, w.data.stride(0), w.data.stride(1), True
    w = w if w.stride(-1) == 1 else w.contiguous()
    return w, w.stride(0), w.stride(1), False


@triton.jit
def _gemm_b_tile(
    w_ptr,
    e_off,
    rn,
    n_ok,
    k0,
    K,
    ROW_STRIDE,
    Q4: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DT: tl.constexpr,
):
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
def store_pairs(
    out_ptr, out_stride, rows, r_ok, rn, n_ok, acc, acc_up, wts_ptr, GATED: tl.constexpr
):
    """A grouped-GEMM tile's output ``out[rows, rn]``: ``GATED`` silu(acc) * acc_up, else acc
    scaled by each pair's routing weight ``w[rows]``; padding rows and columns past N store
    nothing."""
    if GATED:
        res = acc / (1.0 + tl.exp(-acc)) * acc_up
    else:
        res = acc * tl.load(wts_ptr + rows, mask=r_ok, other=0.0)[:, None]
    out = out_ptr + rows.to(tl.int64)[:, None] * out_stride + rn[None, :]
    tl.store(out, res.to(out_ptr.dtype.element_ty), mask=r_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_gemm_kernel(
    a_ptr,
    a_stride,
    w_ptr,
    W_ESTRIDE,
    ROW_STRIDE,
    sorted_ptr,
    expert_ids_ptr,
    npad_ptr,
    out_ptr,
    out_stride,
    wts_ptr,
    P,
    TOP_K,
    N,
    K,
    GATED: tl.constexpr,
    Q4: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DT: tl.constexpr,
    F32_PRECISION: tl.constexpr,
):
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
        a = tl.load(
            arow_ptr + (k0 + kcol)[None, :], mask=r_ok[:, None] & (k0 + c < K)[None, :], other=0.0
        )
        a = a.to(DT)
        b = _gemm_b_tile(w_ptr, e_off, rn, n_ok, k0, K, ROW_STRIDE, Q4, BLOCK_K, DT)
        acc = tl.dot(a, b, acc, input_precision=F32_PRECISION)
        if GATED:
            b_up = _gemm_b_tile(w_ptr, e_off, rn + N, n_ok, k0, K, ROW_STRIDE, Q4, BLOCK_K, DT)
            acc_up = tl.dot(a, b_up, acc_up, input_precision=F32_PRECISION)
    store_pairs(out_ptr, out_stride, rows, r_ok, rn, n_ok, acc, acc_up, wts_ptr, GATED)


GEMM_CONFIGS = tuning.TRITON_MOE_GEMM
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


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def experts_gemm(x, w_gate_up, w_down, wts, ids) -> torch.Tensor:
    """Prefill experts: moe_align, then the grouped GEMMs (gate/up + SwiGLU, weighted down),
    then the sum over the k slots."""
    t, hidden = x.shape
    top_k = ids.shape[1]
    num_experts, inter = w_gate_up.shape[0], w_down.shape[-1]
    cfg = _gemm_config(x, t * top_k, num_experts)
    bm = cfg["BLOCK_M"]
    sorted_ids, expert_ids, npad = moe_align(ids, num_experts, bm)
    # the CPU interpreter computes bf16 dots wrongly: fp32 operands there (exact casts)
    dt = torch.float32 if (interpreted() and x.dtype == torch.bfloat16) else x.dtype
    prec = "ieee" if interpreted() or current(x.device).kind != "cuda" else "tf32x3"
    pairs = t * top_k
    h = torch.empty((pairs, inter), dtype=dt, device=x.device)
    out = torch.zeros((pairs, hidden), dtype=torch.float32, device=x.device)
    blocks = sorted_ids.numel() // bm
    common = dict(
        BLOCK_M=bm,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"],
        DT=_TL_DTYPES[dt],
        F32_PRECISION=prec,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    for a, w, dst, n, k, gated in (
        (x, w_gate_up, h, inter, hidden, True),
        (h, w_down, out, hidden, inter, False),
    ):
        wt, w_e, w_r, q4 = bank_args(w)
        moe_gemm_kernel[(blocks, triton.cdiv(n, cfg["BLOCK_N"]))](
            a,
            a.stride(0),
            wt,
            w_e,
            w_r,
            sorted_ids,
            expert_ids,
            npad,
            dst,
            dst.stride(0),
            wts,
            pairs,
            top_k,
            n,
            k,
            GATED=gated,
            Q4=q4,
            **common,
        )
    return out.view(t, top_k, hidden).sum(1).to(x.dtype)


def compile_specs(target: str) -> list:
    """The grouped-GEMM configurations compile-checked for ``target`` (see ftlab.compile_check)."""
    from ftlab.triton.compile_spec import spec

    specs = []
    big = GEMM_CONFIGS.get(target, GEMM_CONFIGS["default"])
    for dt, cfg in (("bf16", big), ("bf16", {**big, "BLOCK_M": 16}), ("fp32", GEMM_F32_CONFIG)):
        prec = "tf32x3" if dt == "fp32" and platform_from_arch(target).tf32 else "ieee"
        for q4 in (False, True):
            for gated in (True, False):
                label = (
                    f"moe_gemm_kernel[{'gate_up' if gated else 'down'}, {'Q4_0' if q4 else dt} "
                    f"bank, {dt}, block_m {cfg['BLOCK_M']}]"
                )
                specs.append(
                    spec(
                        moe_gemm_kernel,
                        label,
                        types={
                            "a_ptr": f"*{dt}",
                            "w_ptr": "*u8" if q4 else f"*{dt}",
                            "W_ESTRIDE": "i64",
                            "ROW_STRIDE": "i64",
                            "sorted_ptr": "*i32",
                            "expert_ids_ptr": "*i32",
                            "npad_ptr": "*i32",
                            "out_ptr": f"*{dt}" if gated else "*fp32",
                            "wts_ptr": "*fp32",
                        },
                        constexprs={
                            "GATED": gated,
                            "Q4": q4,
                            "BLOCK_M": cfg["BLOCK_M"],
                            "BLOCK_N": cfg["BLOCK_N"],
                            "BLOCK_K": cfg["BLOCK_K"],
                            "DT": tl.bfloat16 if dt == "bf16" else tl.float32,
                            "F32_PRECISION": prec,
                        },
                        num_warps=cfg["num_warps"],
                        options={"num_stages": cfg["num_stages"]},
                    )
                )
    return specs

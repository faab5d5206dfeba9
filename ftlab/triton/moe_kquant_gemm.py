"""The dequant path (prefill) of the routed SwiGLU experts in Triton on banks of Q8_0, the
K-quants and Q4_0 (docs/OPS.md section 3; reference: ``ftlab/reference/moe.py``; the int8 path on
the same banks: ``ftlab/triton/moe_kquant.py``).

``moe_kq_gemm_kernel``, the grouped GEMM of ``moe_gemm.py`` over ``moe_align``'s rows with each
weight tile dequantized in registers and rounded to x's dtype for tl.dot: on Q8_0 / K-quant
banks, and on Q4_0 banks where ``KQ_GEMM_CONFIGS["q4_0_pairs"]`` has tiles, 64 weights a step as
two 32-column halves (``PAIRS``: ``dequant_pair`` of ``ftlab/triton/quant_matmul.py``), else
(other Q4_0 banks, and RDNA) a weight at a time (``dequant_tile``; Q4_0 as ``d * (q - 8)``). x
goes through ``rows_16`` first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.backends import tuning
from ftlab.platform import current, platform_from_arch
from ftlab.triton.moe_gemm import store_pairs
from ftlab.triton.moe_kquant import QT_CODES
from ftlab.triton.moe_route import moe_align
from ftlab.triton.q4_0_common import interpreted, load_q4_0_scale, rows_16
from ftlab.triton.quant_matmul import dequant_pair, dequant_tile


@triton.jit
def _kq_b_tile(w_ptr, row, n_ok, k0, K, QT: tl.constexpr, BLOCK_K: tl.constexpr, DT: tl.constexpr):
    """``[BLOCK_K, BLOCK_N]`` tile of the rows at byte offsets ``row``, columns k0.., in DT."""
    kg = k0 + tl.arange(0, BLOCK_K)
    m = n_ok[:, None] & (kg < K)[None, :]
    if QT == 4:  # Q4_0: d * (q - 8), element l of a block in byte l % 16, nibble l // 16
        wb = w_ptr + row[:, None] + ((kg // 32) * 18)[None, :]
        byte = tl.load(wb + 2 + (kg % 16)[None, :], mask=m, other=0).to(tl.int32)
        q = (byte >> (4 * ((kg % 32) // 16))[None, :]) & 0x0F
        w = load_q4_0_scale(wb, m) * (q - 8).to(tl.float32)
    else:
        w = dequant_tile(w_ptr, row, kg, m, QT)
    return tl.trans(w.to(DT))


@triton.jit
def moe_kq_gemm_kernel(
    a_ptr,
    a_stride,
    w_ptr,
    E_BYTES,
    ROW_BYTES,
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
    QT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DT: tl.constexpr,
    F32_PRECISION: tl.constexpr,
    PAIRS: tl.constexpr,
):
    """``moe_gemm_kernel`` (``ftlab/triton/moe_gemm.py``) on a bank of type ``QT``: ``GATED``
    out[pair, n] = silu(a[pair // k] . W[e][n]) * (a[pair // k] . W[e][N + n]); else
    out[pair, n] = w[pair] * (a[pair] . W[e][n]). Operands in DT, fp32 sums."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(npad_ptr):
        return
    e = tl.load(expert_ids_ptr + pid_m)
    rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    r_ok = rows < P
    arow = rows // TOP_K if GATED else rows
    arow_ptr = a_ptr + arow.to(tl.int64)[:, None] * a_stride
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    row = e.to(tl.int64) * E_BYTES + rn.to(tl.int64) * ROW_BYTES
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PAIRS:  # 64 weights a step as two 32-column halves, each row's scales decoded once
        c = tl.arange(0, 32)
        for k0 in range(0, K, 64):
            a_lo = tl.load(
                arow_ptr + (k0 + c)[None, :], mask=r_ok[:, None] & (k0 + c < K)[None, :], other=0.0
            )
            a_hi = tl.load(
                arow_ptr + (k0 + 32 + c)[None, :],
                mask=r_ok[:, None] & (k0 + 32 + c < K)[None, :],
                other=0.0,
            )
            a_lo = a_lo.to(DT)
            a_hi = a_hi.to(DT)
            lo, hi = dequant_pair(w_ptr, row, k0, K, n_ok, QT)
            acc = tl.dot(a_lo, tl.trans(lo.to(DT)), acc, input_precision=F32_PRECISION)
            acc = tl.dot(a_hi, tl.trans(hi.to(DT)), acc, input_precision=F32_PRECISION)
            if GATED:
                lo, hi = dequant_pair(w_ptr, row + N * ROW_BYTES, k0, K, n_ok, QT)
                acc_up = tl.dot(a_lo, tl.trans(lo.to(DT)), acc_up, input_precision=F32_PRECISION)
                acc_up = tl.dot(a_hi, tl.trans(hi.to(DT)), acc_up, input_precision=F32_PRECISION)
    else:
        c = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(
                arow_ptr + (k0 + c)[None, :], mask=r_ok[:, None] & (k0 + c < K)[None, :], other=0.0
            ).to(DT)
            acc = tl.dot(
                a,
                _kq_b_tile(w_ptr, row, n_ok, k0, K, QT, BLOCK_K, DT),
                acc,
                input_precision=F32_PRECISION,
            )
            if GATED:
                b_up = _kq_b_tile(w_ptr, row + N * ROW_BYTES, n_ok, k0, K, QT, BLOCK_K, DT)
                acc_up = tl.dot(a, b_up, acc_up, input_precision=F32_PRECISION)
    store_pairs(out_ptr, out_stride, rows, r_ok, rn, n_ok, acc, acc_up, wts_ptr, GATED)


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
#: the dequant GEMM's tiles. "pairs" (Q8_0 / K-quant banks: 64 weights a step,
#: :func:`~ftlab.triton.quant_matmul.dequant_pair`) by arch and kernel (gate_up holds two weight
#: tiles, gate and up), else "default"; fp32 operands ("f32": 3xTF32 dots on NVIDIA) smaller.
KQ_GEMM_CONFIGS = tuning.TRITON_KQUANT_GEMM


def q4_0_pairs(dtype: torch.dtype, arch: str | None) -> bool:
    """Whether Q4_0 banks have timed 64-weight-step tiles for ``dtype`` on ``arch``
    (``KQ_GEMM_CONFIGS["q4_0_pairs"]``): there the prefill of two Q4_0 banks takes
    :func:`experts_kquant_gemm` instead of ``moe_gemm``'s ``experts_gemm``."""
    return dtype != torch.float32 and (arch or "") in KQ_GEMM_CONFIGS["q4_0_pairs"]


def kq_gemm_config(dtype: torch.dtype, qtype: str, arch: str | None, gated: bool) -> dict:
    """The launch parameters of ``moe_kq_gemm_kernel`` (the gate/up kernel if ``gated``, else the
    down one) for operands of ``dtype`` on a bank of ``qtype`` on ``arch`` (None: the CPU
    interpreter): BLOCK_M, BLOCK_N, BLOCK_K, PAIRS, num_warps, num_stages."""
    f32 = dtype == torch.float32
    if qtype == "Q4_0" and q4_0_pairs(dtype, arch):
        return {
            **KQ_GEMM_CONFIGS["q4_0_pairs"][arch]["gate_up" if gated else "down"],
            "BLOCK_K": 64,
            "PAIRS": True,
        }
    if qtype == "Q4_0" or platform_from_arch(arch or "cpu").rdna:
        return {**KQ_GEMM_CONFIGS["generic"]["f32" if f32 else "half"], "PAIRS": False}
    pairs = KQ_GEMM_CONFIGS["pairs"]
    table = pairs["f32"] if f32 else pairs.get(arch or "default", pairs["default"])
    return {**table["gate_up" if gated else "down"], "BLOCK_K": 64, "PAIRS": True}


def block_m_for(pairs: int, num_experts: int) -> int:
    """The grouped GEMM's rows a tile before the table's cap: the power of two >= 4x the mean rows
    an expert (at least 16). At 512 tokens top-8 of 256 Q4_0 experts (16 rows an expert, the
    Qwen3.6 layer) 64-row tiles -- one warpgroup's wgmma on sm_90 -- were faster than 32-row ones
    (benchmarks/results/2026-12-04-nvidia-h200-sweep-moe-q4_0-prefill.txt); at 32 rows an expert
    (Qwen3-30B-A3B) both rules give 64. The rule serves
    every bank type; only Q4_0 banks were swept under it."""
    return max(16, triton.next_power_of_2(4 * max(1, pairs // num_experts)))


def experts_kquant_gemm(x, w_gate_up, w_down, wts, ids, configs=None) -> torch.Tensor:
    """The dequant path: moe_align, the grouped GEMMs (gate/up + SwiGLU, weighted down) on tiles
    dequantized in registers, then the sum over the k slots. ``configs``: (gate/up, down) launch
    parameters instead of :func:`kq_gemm_config`'s (for sweeps; BLOCK_M the smaller of the two)."""
    x = rows_16(x)
    t, hidden = x.shape
    top_k = ids.shape[1]
    num_experts, inter = w_gate_up.shape[0], w_down.shape[-1]
    pairs = t * top_k
    # the CPU interpreter computes bf16 dots wrongly: fp32 operands there (exact casts)
    dt = torch.float32 if (interpreted() and x.dtype == torch.bfloat16) else x.dtype
    arch = current(x.device).arch if x.device.type != "cpu" else None
    if configs is None:
        configs = [
            kq_gemm_config(dt, w_gate_up.qtype, arch, True),
            kq_gemm_config(dt, w_down.qtype, arch, False),
        ]
    bm = min(min(c["BLOCK_M"] for c in configs), block_m_for(pairs, num_experts))
    sorted_ids, expert_ids, npad = moe_align(ids, num_experts, bm)
    prec = "ieee" if interpreted() or current(x.device).kind != "cuda" else "tf32x3"
    h = torch.empty((pairs, inter), dtype=dt, device=x.device)
    out = torch.zeros((pairs, hidden), dtype=torch.float32, device=x.device)
    for a, w, dst, n, k, gated, cfg in (
        (x, w_gate_up, h, inter, hidden, True, configs[0]),
        (h, w_down, out, hidden, inter, False, configs[1]),
    ):
        moe_kq_gemm_kernel[(sorted_ids.numel() // bm, triton.cdiv(n, cfg["BLOCK_N"]))](
            a,
            a.stride(0),
            w.data,
            w.data.stride(0),
            w.data.stride(1),
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
            QT=QT_CODES[w.qtype],
            BLOCK_M=bm,
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_K=cfg["BLOCK_K"],
            DT=_TL_DTYPES[dt],
            F32_PRECISION=prec,
            PAIRS=cfg["PAIRS"],
            num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"],
        )
    return out.view(t, top_k, hidden).sum(1).to(x.dtype)


def compile_specs(target: str) -> list:
    """The grouped GEMM for each bank type, gate/up and down, bf16 and fp32 operands, in the tiles
    :func:`kq_gemm_config` gives ``target``."""
    from ftlab.triton.compile_spec import spec

    plat = platform_from_arch(target)
    arch = target if plat.is_gpu else None
    specs = []
    for dt in ("bf16", "fp32"):
        prec = "tf32x3" if dt == "fp32" and plat.tf32 else "ieee"
        for qtype in QT_CODES:
            for gated in (True, False):
                cfg = kq_gemm_config(
                    torch.bfloat16 if dt == "bf16" else torch.float32, qtype, arch, gated
                )
                specs.append(
                    spec(
                        moe_kq_gemm_kernel,
                        f"moe_kq_gemm_kernel[{'gate_up' if gated else 'down'}, {qtype} bank, {dt}]",
                        types={
                            "a_ptr": f"*{dt}",
                            "w_ptr": "*u8",
                            "E_BYTES": "i64",
                            "ROW_BYTES": "i64",
                            "sorted_ptr": "*i32",
                            "expert_ids_ptr": "*i32",
                            "npad_ptr": "*i32",
                            "out_ptr": f"*{dt}" if gated else "*fp32",
                            "wts_ptr": "*fp32",
                        },
                        constexprs={
                            "GATED": gated,
                            "QT": QT_CODES[qtype],
                            "BLOCK_M": cfg["BLOCK_M"],
                            "BLOCK_N": cfg["BLOCK_N"],
                            "BLOCK_K": cfg["BLOCK_K"],
                            "DT": tl.bfloat16 if dt == "bf16" else tl.float32,
                            "F32_PRECISION": prec,
                            "PAIRS": cfg["PAIRS"],
                        },
                        num_warps=cfg["num_warps"],
                        options={"num_stages": cfg["num_stages"]},
                        multiple_of_16=("a_ptr", "a_stride"),
                    )
                )
    return specs

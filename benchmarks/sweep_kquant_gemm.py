"""Sweep of the Triton dequant GEMMs' tiles on a GPU (python benchmarks/sweep_kquant_gemm.py
[--quick]): the experts' grouped GEMM (``moe_kq_gemm_kernel``; Qwen3-30B-A3B layer: E 128, H 2048,
I 768, top-8 of routing from random logits with a per-expert bias) launch by launch -- gate/up on
a Q4_K or Q4_0 bank, down on Q6_K, Q4_K or Q4_0 -- and the dense GEMM (``quant_dequant_gemm``) at
M = 512, each configuration's output checked against the first's. Q4_0 banks run both the 64-weight
steps (``dequant_pair``'s Q4_0 branch, PAIRS) and ``moe_gemm``'s ``experts_gemm`` (the Q4_0
banks' GEMM where no 64-weight-step tiles are tabled) for comparison; ``--q4_0``: only the Q4_0
comparisons, HIP's int8 kernels and ``ftlab.triton.q4_0``'s dense GEMM beside them. Times: median
device time of one launch from CUDA-graph replays.
"""

from __future__ import annotations

import argparse

import torch
import triton

import ftlab.triton.moe_kquant_gemm as mk
import ftlab.triton.q4_0 as ft_q4_0
import ftlab.triton.quant_matmul as qm
from ftlab import ops
from ftlab.bench.harness import copy_bandwidth, require_gpu, time_graph_us
from ftlab.bench.quant_matmul import random_weight
from ftlab.quant import QuantWeight
from ftlab.triton.moe_gemm import experts_gemm
from ftlab.triton.moe_kquant import QT_CODES
from ftlab.triton.moe_route import moe_align

E, H, INTER, TOP_K = 128, 2048, 768, 8


def P(bn: int, warps: int, stages: int = 2) -> dict:
    return {
        "BLOCK_M": 64,
        "BLOCK_N": bn,
        "BLOCK_K": 64,
        "num_warps": warps,
        "num_stages": stages,
        "PAIRS": True,
    }


MOE = {
    "gate_up": {"bn64 w4": P(64, 4), "bn32 w4": P(32, 4), "bn16 w4": P(16, 4), "bn32 w8": P(32, 8)},
    "down": {"bn64 w4": P(64, 4), "bn32 w4": P(32, 4), "bn16 w4": P(16, 4), "bn64 w8": P(64, 8)},
}
DENSE = {
    f"{m}x{n}x64 w{w}": {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 64, "num_warps": w, "num_stages": 3}
    for m, n, w in ((128, 64, 8), (128, 64, 4), (128, 32, 8), (64, 64, 4))
}


def bank(qtype: str, n: int, k: int, dev: torch.device, seed: int):
    if qtype == "Q4_0":
        g = torch.Generator(device=dev).manual_seed(seed)
        return ops.quantize_q4_0(torch.randn(E, n, k, device=dev, generator=g) * k**-0.5)
    return QuantWeight(
        random_weight(qtype, E * n, k, dev, seed).data.view(E, n, -1), (E, n, k), qtype
    )


def launch(a, w, dst, n, k, gated, cfg, align, wts, pairs, bm):
    sorted_ids, expert_ids, npad = align
    data = w.data
    return mk.moe_kq_gemm_kernel[(sorted_ids.numel() // bm, triton.cdiv(n, cfg["BLOCK_N"]))](
        a,
        a.stride(0),
        data,
        data.stride(0),
        data.stride(1),
        sorted_ids,
        expert_ids,
        npad,
        dst,
        dst.stride(0),
        wts,
        pairs,
        TOP_K,
        n,
        k,
        GATED=gated,
        QT=QT_CODES[w.qtype],
        BLOCK_M=bm,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"],
        DT=triton.language.bfloat16,
        F32_PRECISION="ieee",
        PAIRS=cfg["PAIRS"],
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="T = 512 only, fewer replays")
    ap.add_argument("--q4_0", action="store_true", help="only the Q4_0 comparisons (q4_0_sweep)")
    args = ap.parse_args()
    require_gpu()
    dev = torch.device("cuda")
    reps = 10 if args.quick else 20
    print(f"copy bandwidth {copy_bandwidth():.0f} GB/s", flush=True)
    if args.q4_0:
        q4_0_sweep(dev, reps)
        return
    gate_banks = {q: bank(q, 2 * INTER, H, dev, 1 + i) for i, q in enumerate(("Q4_K", "Q4_0"))}
    down_banks = {q: bank(q, H, INTER, dev, 5 + i) for i, q in enumerate(("Q6_K", "Q4_K", "Q4_0"))}
    for t in (512,) if args.quick else (512, 2048):
        g = torch.Generator(device=dev).manual_seed(t)
        logits = torch.randn(t, E, device=dev, generator=g) * 2 + torch.randn(
            1, E, device=dev, generator=g
        )
        wts, ids = ops.route_topk(logits, TOP_K)
        ids = ids.to(torch.int32)
        x = torch.randn(t, H, device=dev, dtype=torch.bfloat16)
        pairs, bm = t * TOP_K, 64
        align = moe_align(ids, E, bm)
        h = torch.empty((pairs, INTER), dtype=torch.bfloat16, device=dev)
        out = torch.zeros((pairs, H), dtype=torch.float32, device=dev)
        for kind, banks in (("gate_up", gate_banks), ("down", down_banks)):
            for qtype, w in banks.items():
                a, dst, n, k, gated = (
                    (x, h, INTER, H, True) if kind == "gate_up" else (h, out, H, INTER, False)
                )
                ref = None
                for label, cfg in MOE[kind].items():
                    ck = launch(a, w, dst, n, k, gated, cfg, align, wts, pairs, bm)
                    y = dst.float().clone()
                    ref = y if ref is None else ref
                    err = float((y - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
                    us = time_graph_us(
                        lambda: launch(a, w, dst, n, k, gated, cfg, align, wts, pairs, bm),
                        inner=5,
                        reps=reps,
                    )
                    print(
                        f"moe T={t} {kind} {qtype} {label:8s} {us:8.1f} us  regs {ck.n_regs} "
                        f"spills {ck.n_spills}  relerr {err:.1e}",
                        flush=True,
                    )
        for gq, dq in (("Q4_K", "Q6_K"), ("Q4_K", "Q4_K")):
            gu, dn = gate_banks[gq], down_banks[dq]
            us = time_graph_us(
                lambda: mk.experts_kquant_gemm(x, gu, dn, wts, ids), inner=5, reps=reps
            )
            print(f"moe T={t} experts_kquant_gemm (defaults) {gq}/{dq} {us:8.1f} us", flush=True)
        gu0, dn0 = gate_banks["Q4_0"], down_banks["Q4_0"]
        us = time_graph_us(lambda: experts_gemm(x, gu0, dn0, wts, ids), inner=5, reps=reps)
        print(f"moe T={t} Q4_0 banks: experts_gemm {us:8.1f} us", flush=True)
        cfgs = [MOE["gate_up"]["bn64 w4"], MOE["down"]["bn64 w4"]]
        us = time_graph_us(
            lambda: mk.experts_kquant_gemm(x, gu0, dn0, wts, ids, configs=cfgs), inner=5, reps=reps
        )
        print(
            f"moe T={t} Q4_0 banks: experts_kquant_gemm, 64-weight steps {us:8.1f} us", flush=True
        )
    for n, k in ((14336, 4096), (4096, 2048), (2048, 4096)):
        x = torch.randn(512, k, device=dev, dtype=torch.bfloat16)
        for qtype in ("Q4_K", "Q6_K", "Q8_0", "Q5_K"):
            w = random_weight(qtype, n, k, dev, 5)
            ref = qm.quant_dequant_gemm(x, w).float()
            for label, cfg in {"default": None, **DENSE}.items():
                err = float((qm.quant_dequant_gemm(x, w, cfg).float() - ref).abs().max()) / float(
                    ref.abs().max()
                )
                us = time_graph_us(lambda: qm.quant_dequant_gemm(x, w, cfg), inner=5, reps=reps)
                print(
                    f"dense {n}x{k} M=512 {qtype} {label:16s} {us:8.1f} us  relerr {err:.1e}",
                    flush=True,
                )


def q4_0_sweep(dev: torch.device, reps: int) -> None:
    """Q4_0 at M = T = 512: the layer's experts (HIP's int8 kernels, ``experts_gemm``, the 64-weight
    steps at the table's and other tiles) and the dense GEMM at the Qwen3-30B-A3B attention shapes
    and 14336x4096 (HIP's int8 tiles, ``ftlab.triton.q4_0``'s GEMM, the 64-weight steps)."""
    t = 512
    g = torch.Generator(device=dev).manual_seed(t)
    logits = torch.randn(t, E, device=dev, generator=g) * 2 + torch.randn(
        1, E, device=dev, generator=g
    )
    wts, ids = ops.route_topk(logits, TOP_K)
    x = torch.randn(t, H, device=dev, dtype=torch.bfloat16)
    gu, dn = bank("Q4_0", 2 * INTER, H, dev, 2), bank("Q4_0", H, INTER, dev, 7)
    ref = experts_gemm(x, gu, dn, wts, ids.to(torch.int32)).float()
    runs = {
        "hip int8": lambda: ops.moe_experts(x, gu, dn, wts, ids, backend="hip"),
        "triton experts_gemm": lambda: experts_gemm(x, gu, dn, wts, ids.to(torch.int32)),
        "triton 64-weight steps (table)": lambda: mk.experts_kquant_gemm(
            x, gu, dn, wts, ids.to(torch.int32)
        ),
    }
    for gl, dl in (("bn64 w4", "bn64 w4"), ("bn32 w4", "bn32 w4"), ("bn32 w4", "bn16 w4")):
        cfgs = [MOE["gate_up"][gl], MOE["down"][dl]]
        runs[f"triton 64-weight steps {gl} / {dl}"] = lambda c=cfgs: mk.experts_kquant_gemm(
            x, gu, dn, wts, ids.to(torch.int32), configs=c
        )
    for label, fn in runs.items():
        err = float((fn().float() - ref).abs().max()) / float(ref.abs().max())
        us = time_graph_us(fn, inner=5, reps=reps)
        print(f"moe T={t} Q4_0 banks {label:40s} {us:8.1f} us  relerr {err:.1e}", flush=True)
    for n, k in ((5120, 2048), (2048, 4096), (14336, 4096)):
        w = ops.quantize_q4_0(torch.randn(n, k, device=dev) * k**-0.5)
        xm = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
        ref = ft_q4_0.q4_0_dequant_gemm(xm, w).float()  # the weight-at-a-time GEMM
        runs = {
            "hip int8": lambda: ops.q4_0_matmul(xm, w, path="int8", backend="hip"),
            "triton q4_0 GEMM": lambda: ft_q4_0.q4_0_dequant_gemm(xm, w),
            "torch dequantize + matmul": lambda: (
                xm @ ops.dequantize_q4_0(w, dtype=torch.bfloat16).T
            ),
        }
        for label, cfg in DENSE.items():
            runs[f"64-weight steps {label}"] = lambda c=cfg: qm.quant_dequant_gemm(xm, w, c)
        for label, fn in runs.items():
            err = float((fn().float() - ref).abs().max()) / float(ref.abs().max())
            us = time_graph_us(fn, inner=5, reps=reps)
            print(
                f"dense {n}x{k} M={t} Q4_0 {label:30s} {us:8.1f} us  relerr {err:.1e}", flush=True
            )


if __name__ == "__main__":
    main()

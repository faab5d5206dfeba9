"""Tiles of the Q4_0 experts' prefill GEMMs (Triton ``moe_kq_gemm_kernel``, 64-weight steps) by
rows an expert, on a GPU: ``python benchmarks/sweep_moe_q4_0_prefill.py [--quick]``.

Two layer shapes of Q4_0 banks, 512 tokens routed top-8 from random logits with a per-expert
bias: Qwen3.6-35B-A3B (E 256, I 512: 16 rows an expert on average) and Qwen3-30B-A3B (E 128,
I 768: 32). For each, gate/up and down are timed apart over BLOCK_M x BLOCK_N x warps x stages
(each output checked against the table's configuration), then the whole ``experts_kquant_gemm``
with the table's tiles and with each kernel's fastest, and ``ops.moe_experts`` through hip's
int8 tiles and auto. Times: median device time of one launch from CUDA-graph replays.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton

import ftlab.triton.moe_kquant_gemm as mk
from ftlab import ops
from ftlab.bench.harness import copy_bandwidth, require_gpu, time_graph_us
from ftlab.platform import current
from ftlab.triton.moe_kquant import QT_CODES
from ftlab.triton.moe_route import moe_align

SHAPES = {
    "qwen36 (E 256, I 512)": (256, 2048, 512, 8),
    "qwen3-30b (E 128, I 768)": (128, 2048, 768, 8),
}


def launch(a, w, dst, n, k, gated, cfg, align, wts, pairs, top_k, bm):
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
        top_k,
        n,
        k,
        GATED=gated,
        QT=QT_CODES["Q4_0"],
        BLOCK_M=bm,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=64,
        DT=triton.language.bfloat16,
        F32_PRECISION="ieee",
        PAIRS=True,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def one_shape(
    shape: str,
    e: int,
    hidden: int,
    inter: int,
    top_k: int,
    dev: torch.device,
    arch: str,
    reps: int,
    tiles: tuple,
) -> None:
    """The sweep of one layer shape (module docstring)."""
    bms, bns, warps, stages = tiles
    t = 512
    g = torch.Generator(device=dev).manual_seed(t)
    logits = torch.randn(t, e, device=dev, generator=g) * 2 + torch.randn(
        1, e, device=dev, generator=g
    )
    wts, ids = ops.route_topk(logits, top_k)
    ids = ids.to(torch.int32)
    x = torch.randn(t, hidden, device=dev, dtype=torch.bfloat16)
    gu = ops.quantize_q4_0(
        torch.randn(e, 2 * inter, hidden, device=dev, generator=g) * hidden**-0.5
    )
    dn = ops.quantize_q4_0(torch.randn(e, hidden, inter, device=dev, generator=g) * inter**-0.5)
    pairs = t * top_k
    table = [mk.kq_gemm_config(torch.bfloat16, "Q4_0", arch, gated) for gated in (True, False)]
    bm_table = min(min(c["BLOCK_M"] for c in table), mk.block_m_for(pairs, e))
    wbytes = (gu.data.numel() + dn.data.numel()) * gu.data.element_size()
    print(
        f"{shape}: T {t}, {pairs / e:.1f} rows an expert; banks {wbytes / 1e6:.0f} MB; table "
        f"{table}, BLOCK_M {bm_table}",
        flush=True,
    )
    h = torch.empty((pairs, inter), dtype=torch.bfloat16, device=dev)
    out = torch.zeros((pairs, hidden), dtype=torch.float32, device=dev)
    best = {}
    for kind in ("gate_up", "down"):
        a, w, dst, n, k, gated = (
            (x, gu, h, inter, hidden, True)
            if kind == "gate_up"
            else (h, dn, out, hidden, inter, False)
        )
        ref_cfg = {**table[0 if gated else 1]}
        launch(
            a,
            w,
            dst,
            n,
            k,
            gated,
            ref_cfg,
            moe_align(ids, e, bm_table),
            wts,
            pairs,
            top_k,
            bm_table,
        )
        ref = dst.float().clone()
        rows = []
        for bm, bn, nw, ns in itertools.product(bms, bns, warps, stages):
            cfg = {"BLOCK_N": bn, "num_warps": nw, "num_stages": ns}
            align = moe_align(ids, e, bm)
            try:
                ck = launch(a, w, dst, n, k, gated, cfg, align, wts, pairs, top_k, bm)
            except Exception as exc:
                print(f"  {kind} bm{bm} bn{bn} w{nw} s{ns}: {type(exc).__name__}", flush=True)
                continue
            err = float((dst.float() - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
            us = time_graph_us(
                lambda: launch(a, w, dst, n, k, gated, cfg, align, wts, pairs, top_k, bm),
                inner=5,
                reps=reps,
            )
            rows.append((us, bm, cfg))
            print(
                f"  {kind} bm{bm:<3d} bn{bn:<4d} w{nw} s{ns} {us:8.1f} us  regs {ck.n_regs} spills "
                f"{ck.n_spills}  relerr {err:.1e}",
                flush=True,
            )
        rows.sort(key=lambda r: r[0])
        best[kind] = rows[0]
        print(f"  {kind} fastest: bm{rows[0][1]} {rows[0][2]} {rows[0][0]:.1f} us", flush=True)
    runs = {"experts_kquant_gemm (table)": lambda: mk.experts_kquant_gemm(x, gu, dn, wts, ids)}
    if best["gate_up"][1] == best["down"][1]:
        cfgs = [
            {**best[k][2], "BLOCK_M": best[k][1], "BLOCK_K": 64, "PAIRS": True}
            for k in ("gate_up", "down")
        ]
        runs["experts_kquant_gemm (fastest tiles)"] = lambda c=cfgs: mk.experts_kquant_gemm(
            x, gu, dn, wts, ids, configs=c
        )
    runs["ops.moe_experts hip"] = lambda: ops.moe_experts(x, gu, dn, wts, ids, backend="hip")
    runs["ops.moe_experts auto"] = lambda: ops.moe_experts(x, gu, dn, wts, ids)
    want = mk.experts_kquant_gemm(x, gu, dn, wts, ids).float()
    for label, fn in runs.items():
        err = float((fn().float() - want).abs().max()) / float(want.abs().max())
        us = time_graph_us(fn, inner=5, reps=reps)
        print(
            f"  {label:40s} {us:8.1f} us ({wbytes / us / 1e3:.0f} GB/s of banks)  relerr {err:.1e}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer tiles and replays")
    args = ap.parse_args()
    require_gpu()
    dev = torch.device("cuda")
    reps = 10 if args.quick else 20
    arch = current(dev).arch
    print(f"copy bandwidth {copy_bandwidth():.0f} GB/s; arch {arch}", flush=True)
    tiles = (
        (16, 32, 64),
        (32, 64, 128),
        *(((4, 8), (2, 3)) if args.quick else ((4, 8), (2, 3, 4))),
    )
    for shape, (e, hidden, inter, top_k) in SHAPES.items():
        one_shape(shape, e, hidden, inter, top_k, dev, arch, reps, tiles)


if __name__ == "__main__":
    main()

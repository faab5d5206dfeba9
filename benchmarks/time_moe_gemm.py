"""The two grouped GEMMs of the prefill experts on bf16 banks, one at a time, at the Qwen3-30B-A3B
layer shape (E = 128, H = 2048, I = 768, top-8): HIP's matrix-core kernel at each block_m given
(32 or 64 rows a block: moe_align's block_m, which picks the tile shape) beside Triton's grouped
GEMM, for T tokens routed at random. Device time of one launch (median of events), the
weight bytes of the experts the call uses over that time, against the copy bandwidth measured in
the same run, and each path's experts output against a torch fp32 computation (relative L2).

    python benchmarks/time_moe_gemm.py [--tokens 32,512] [--block-m 32,64] [--out F]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from ftlab import jit
from ftlab.bench.harness import copy_bandwidth, device_info, time_us
from ftlab.hip import moe as hip_moe
from ftlab.triton import moe_gemm as tr

E, H, INTER, TOP_K = 128, 2048, 768, 8


def _reference(x, gu, dn, ids, wts) -> torch.Tensor:
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        a = x[tok].float()
        g, u = (a @ gu[e].float().T).chunk(2, dim=-1)
        y.index_add_(0, tok, wts[tok, slot, None] * ((F.silu(g) * u) @ dn[e].float().T))
    return y


def _rel(got, want) -> float:
    return float((got.float() - want).norm() / want.norm())


def _hip_gemms(x, gu, dn, ids, wts, block_m):
    """Callables for HIP's gate/up and down launches on moe_align's rows (block_m)."""
    module = jit.module_for("moe", x.device)
    t, pairs = x.shape[0], x.shape[0] * TOP_K
    sorted_ids, expert_ids, npad = hip_moe.moe_align(ids, E, block_m)
    h = torch.empty((pairs, INTER), dtype=x.dtype, device=x.device)
    out = torch.zeros((pairs, H), dtype=torch.float32, device=x.device)
    flat = wts.view(-1)
    gate = lambda: module.moe_gemm_dense(x, gu, sorted_ids, expert_ids, npad, flat, h, TOP_K, True)
    down = lambda: module.moe_gemm_dense(
        h, dn, sorted_ids, expert_ids, npad, flat, out, TOP_K, False
    )
    return gate, down, lambda: out.view(t, TOP_K, H).sum(1)


def _triton_gemms(x, gu, dn, ids, wts):
    t, pairs = x.shape[0], x.shape[0] * TOP_K
    cfg = tr._gemm_config(x, pairs, E)
    bm = cfg["BLOCK_M"]
    sorted_ids, expert_ids, npad = hip_moe.moe_align(ids, E, bm)
    h = torch.empty((pairs, INTER), dtype=x.dtype, device=x.device)
    out = torch.zeros((pairs, H), dtype=torch.float32, device=x.device)
    blocks = sorted_ids.numel() // bm
    common = dict(
        BLOCK_M=bm,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"],
        DT=tr._TL_DTYPES[x.dtype],
        F32_PRECISION="tf32x3",
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )

    def launch(a, w, dst, n, k, gated):
        wt, w_e, w_r, q4 = tr.bank_args(w)
        tr.moe_gemm_kernel[(blocks, -(-n // cfg["BLOCK_N"]))](
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
            TOP_K,
            n,
            k,
            GATED=gated,
            Q4=q4,
            **common,
        )

    return (
        lambda: launch(x, gu, h, INTER, H, True),
        lambda: launch(h, dn, out, H, INTER, False),
        lambda: out.view(t, TOP_K, H).sum(1),
        f"{bm}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']}",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="32,512")
    ap.add_argument("--block-m", default="32,64")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    gu = (torch.randn(E, 2 * INTER, H, device=dev, generator=gen) * H**-0.5).to(torch.bfloat16)
    dn = (torch.randn(E, H, INTER, device=dev, generator=gen) * INTER**-0.5).to(torch.bfloat16)
    copy = copy_bandwidth()
    rows = []
    print(f"copy {copy:.0f} GB/s")
    for t in (int(v) for v in args.tokens.split(",")):
        x = torch.randn(t, H, device=dev, generator=gen).to(torch.bfloat16)
        logits = torch.randn(t, E, device=dev, generator=gen)
        wts, ids = torch.topk(logits.softmax(-1), TOP_K, dim=-1)
        ids = ids.to(torch.int32)
        used = int(ids.unique().numel())
        nbytes = used * 3 * INTER * H * 2
        want = _reference(x, gu, dn, ids, wts)
        paths = []
        for bm in (int(v) for v in args.block_m.split(",")):
            g, d, res = _hip_gemms(x, gu, dn, ids, wts, bm)
            paths.append(("hip", f"{bm}x64x64", g, d, res))
        g, d, res, shape = _triton_gemms(x, gu, dn, ids, wts)
        paths.append(("triton", shape, g, d, res))
        for name, shape, g, d, res in paths:
            g(), d()
            err = _rel(res(), want)
            tg, td = time_us(g, warmup=5, reps=30), time_us(d, warmup=5, reps=30)
            gbs = nbytes / ((tg + td) * 1e-6) / 1e9
            row = dict(
                tokens=t,
                path=name,
                shape=shape,
                gate_up_us=round(tg, 1),
                down_us=round(td, 1),
                total_us=round(tg + td, 1),
                gbs=round(gbs),
                copy_share=round(gbs / copy, 3),
                rel_err=err,
                experts=used,
            )
            rows.append(row)
            print(
                f"T={t:4d} {name:6s} {shape:10s} gate/up {tg:7.1f} down {td:7.1f} total "
                f"{tg + td:7.1f} us  {gbs:6.0f} GB/s ({gbs / copy:.0%})  rel {err:.1e}"
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device_info(), "copy_gbs": copy, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

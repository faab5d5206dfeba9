"""A decode step's attention at the Qwen3-30B-A3B shape (32 query heads over 4 key heads of 128,
bf16), one sequence at ``--length`` live positions of a ``--slots``-slot static cache, graph-
replayed: ``ops.decode_attention`` through each backend against torch's SDPA over every slot
under the mask (what the models ran before), plus the live K/V bytes over the time.

    python benchmarks/time_decode_attention.py [--slots 520] [--length 513] [--batch 1] [--rows 4,2]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import ftlab.hip.attention as hip_attention
from ftlab import backends, ops
from ftlab.bench.harness import time_graph_us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=520)
    ap.add_argument("--length", type=int, default=513)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument(
        "--rows",
        default="4,2",
        help="hip's one-launch kernel: a thread's rows of a tile, each "
        "timed (comma-separated, 4 and / or 2)",
    )
    args = ap.parse_args()
    dev, b, s = torch.device("cuda"), args.batch, args.slots
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(b, 32, 128, device=dev, generator=gen).bfloat16()
    k = torch.randn(b, s, 4, 128, device=dev, generator=gen).bfloat16()
    v = torch.randn(b, s, 4, 128, device=dev, generator=gen).bfloat16()
    lengths = torch.full((b,), args.length, device=dev, dtype=torch.int32)
    mask = (torch.arange(s, device=dev) < args.length)[None, None, None, :]
    live_bytes = 2 * b * min(args.length, s) * 4 * 128 * 2
    want = ops.decode_attention(q, k, v, lengths, backend="reference")
    bias = torch.zeros(mask.shape, dtype=q.dtype, device=dev).masked_fill_(~mask, float("-inf"))
    rows = [
        (
            "torch SDPA over every slot, boolean mask",
            lambda: F.scaled_dot_product_attention(
                q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, enable_gqa=True
            ),
        ),
        (
            "torch SDPA over every slot, additive mask (the models' graph path)",
            lambda: F.scaled_dot_product_attention(
                q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias, enable_gqa=True
            ),
        ),
    ]
    variants = []
    for name in backends.available_backends("decode_attention", dev, torch.bfloat16):
        if name == "reference":
            continue
        for r in [int(x) for x in args.rows.split(",")] if name == "hip" else [None]:
            variants.append((name, r))
    print(
        f"batch {b}, {args.length} live positions of {s} slots, 32/4 heads of 128, bf16 "
        "(graph-replayed)"
    )
    for label, fn in rows:
        us = time_graph_us(fn)
        print(f"  {us:8.2f} us  {live_bytes / us / 1e3:7.1f} GB/s of live K/V  {label}")
    setting = hip_attention.ROWS_PER_THREAD
    # hip's rows a thread is a module setting: each variant timed while it holds
    for (
        name,
        r,
    ) in variants:
        if r is not None:
            hip_attention.ROWS_PER_THREAD = r
        got = ops.decode_attention(q, k, v, lengths, backend=name)
        err = (got.float() - want.float()).abs().max().item()
        us = time_graph_us(lambda name=name: ops.decode_attention(q, k, v, lengths, backend=name))
        what = f"decode_attention {name}" + (f", {r} rows a thread" if r is not None else "")
        print(
            f"  {us:8.2f} us  {live_bytes / us / 1e3:7.1f} GB/s of live K/V  {what} (max |diff| "
            f"{err:.1e})"
        )
    hip_attention.ROWS_PER_THREAD = setting


if __name__ == "__main__":
    main()

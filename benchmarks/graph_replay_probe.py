"""Replays a captured decode step many times against the same step launched eagerly through the
graph's kernels (random Qwen3-30B-A3B-shaped Q4_0 model, 48 layers): how often they part, and by
how much. ``bench model`` checks one replay per row; this counts over hundreds.

    python benchmarks/graph_replay_probe.py [--batches 1,8] [--replays 200] [--rounds 40]
    FTLAB_PDL=0 python benchmarks/graph_replay_probe.py     # the same without programmatic launches
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from ftlab.bench.model import CONFIG, fill_cache, random_model
from ftlab.models.decode_steps import DecodeGraph
from ftlab.models.qwen3_moe import Qwen3Moe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    ap.add_argument(
        "--replays", type=int, default=200, help="replays back to back, each compared (default 200)"
    )
    ap.add_argument(
        "--rounds", type=int, default=40, help="rounds of an eager step then a replay (default 40)"
    )
    args = ap.parse_args()
    dev = torch.device("cuda")
    weights = random_model(CONFIG, dev)
    gen = torch.Generator().manual_seed(0)
    print(f"FTLAB_PDL={os.environ.get('FTLAB_PDL', '(default)')}", flush=True)
    for batch in (int(b) for b in args.batches.split(",")):
        model = Qwen3Moe(CONFIG, weights, max_batch=batch, max_seq_len=520, static=True)
        fill_cache(model.cache)
        tok = torch.randint(0, CONFIG.vocab_size, (batch, 1), generator=gen).to(dev)
        pos = torch.full((batch, 1), 512, device=dev)
        graph = DecodeGraph(model, batch)
        # the graph's kernels, launched eagerly
        with model.planned(model.plan.attention_as_captured()):
            same = model.forward(tok, pos).clone()
            again = model.forward(tok, pos).clone()
        print(f"batch {batch}: two eager steps equal: {torch.equal(same, again)}", flush=True)
        t0 = time.time()
        bad, worst = 0, 0.0
        for _ in range(args.replays):
            r = graph(tok, pos)
            if not torch.equal(r, same):
                bad += 1
                worst = max(worst, (r.float() - same.float()).abs().max().item())
        print(
            f"  replays back to back: {bad} of {args.replays} differ (max |diff| {worst:.3g}, "
            f"largest logit {same.abs().max().item():.3g}), {time.time() - t0:.1f} s",
            flush=True,
        )
        bad, worst = 0, 0.0
        for _ in range(args.rounds):
            model.forward(tok, pos)  # as bench model does: an eager step (its own attention) first
            with model.planned(model.plan.attention_as_captured()):
                e = model.forward(tok, pos).clone()
            r = graph(tok, pos).clone()
            if not torch.equal(r, e):
                bad += 1
                worst = max(worst, (r.float() - e.float()).abs().max().item())
        print(
            f"  an eager step, one through the graph's kernels, then a replay: {bad} of "
            f"{args.rounds} differ (max |diff| {worst:.3g})",
            flush=True,
        )
        del graph, model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

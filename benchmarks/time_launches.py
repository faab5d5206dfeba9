"""Where a decode step launched from a schedule (ftlab.models.decode_steps) spends its time, on
the GPU machine: the host's time to issue one step (the call returns before the kernels finish)
against the step's wall time to the end of its kernels, and the same for the schedule's launches
alone and for the graph-replayed step. A step whose issue time is near its wall time is bound by
the host; one whose issue time is well under it, by the kernels and the gaps between them.

    python benchmarks/time_launches.py [--batches 1,8] [--steps 30] [--layers 48]

The model: `ftlab bench model`'s Qwen3-30B-A3B shape with random Q4_0 weights made on the GPU,
the KV cache filled with random rows, steps at position 512."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ftlab.bench.model import CONFIG, fill_cache, random_model
from ftlab.models.decode_steps import DecodeLaunches
from ftlab.models.pipeline import DecodeGraph
from ftlab.models.qwen3_moe import Qwen3Moe


def timed(fn, steps: int) -> tuple[float, float]:
    """(median host issue time, median wall time to the end of the kernels), microseconds."""
    issue, wall = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        issue.append((t1 - t0) * 1e6)
        wall.append((t2 - t0) * 1e6)
    return statistics.median(issue), statistics.median(wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=CONFIG.num_hidden_layers)
    args = ap.parse_args()
    from dataclasses import replace

    config = replace(CONFIG, num_hidden_layers=args.layers)
    weights = random_model(config, torch.device("cuda"))
    for batch in (int(b) for b in args.batches.split(",")):
        time_batch(config, weights, batch, args.steps)


def time_batch(config, weights, batch: int, steps: int) -> None:
    dev = weights.embed.device
    model = Qwen3Moe(config, weights, max_batch=batch, max_seq_len=520, static=True)
    fill_cache(model.cache)
    tok = torch.randint(0, config.vocab_size, (batch, 1), device=dev)
    pos = torch.full((batch, 1), 512, device=dev)
    graph = DecodeGraph(model, batch)
    launched = DecodeLaunches(model, batch)
    rows = {
        "graph step": lambda: graph(tok, pos),
        "launches step": lambda: launched(tok, pos),
        "schedule alone": launched.schedule.launch,
        "op by op step": lambda: model.forward(tok, pos),
    }
    for name, fn in rows.items():
        for _ in range(3):
            fn()
        issue, wall = timed(fn, steps)
        print(
            f"batch {batch} {name:15s}: issue {issue:9.1f} us, wall {wall:9.1f} us "
            f"({len(launched.schedule)} launch calls in the schedule)"
        )


if __name__ == "__main__":
    main()

"""Whether a decode step repeats bit for bit, over many token draws (random Qwen3-30B-A3B-shaped
Q4_0 model, every cache slot filled, position 512). Per draw: A and A2, two eager steps through
exactly the captured kernels (``DecodePlan.as_captured``); B, the eager step as ``bench model``'s
check runs it (``DecodePlan.attention_as_captured``: the fused norm and q/k/v matvec on); R and R2,
two replays of the captured step. Counts the draws where each pair parts. ``--locate``: instead,
every ftlab op's and SDPA's outputs of two A steps held (no copies, so no extra kernels) and
compared op by op: the first op whose outputs part, with every op before it bit-equal.

    python benchmarks/decode_determinism.py [--layers 48] [--draws 100] [--batches 1,8] [--fixed]
    python benchmarks/decode_determinism.py --sdpa            # the captured step on torch's SDPA
    python benchmarks/decode_determinism.py --sdpa --locate [--no-cudnn]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
import torch.nn.functional as F

import ftlab.ops as ops
from ftlab.bench.model import CONFIG, fill_cache, random_model
from ftlab.models import DecodePlan
from ftlab.models.decode_steps import DecodeGraph
from ftlab.models.qwen3_moe import Qwen3Moe


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return [
        t for a in ("q", "d", "s", "data") if isinstance(t := getattr(out, a, None), torch.Tensor)
    ]


class Recorder:
    """Wraps every public function of ``ftlab.ops`` and torch's SDPA: while ``calls`` is a list,
    each call's name and output tensors are appended to it (held, not copied)."""

    def __init__(self) -> None:
        self.calls: list | None = None
        for name in dir(ops):
            if not name.startswith("_") and name[0].islower() and callable(getattr(ops, name)):
                self._wrap(ops, name)
        self._wrap(F, "scaled_dot_product_attention")

    def _wrap(self, mod, name: str) -> None:
        f = getattr(mod, name)

        def g(*a, **k):
            out = f(*a, **k)
            if self.calls is not None:
                self.calls.append((name, _tensors(out)))
            return out

        setattr(mod, name, g)

    def run(self, fn) -> list:
        self.calls = []
        try:
            fn()
            return self.calls
        finally:
            self.calls = None


def first_part(one: list, two: list) -> str | None:
    """The name of the first op whose outputs differ between two recorded steps, or None."""
    for (name, a), (_, b) in zip(one, two, strict=True):
        if not all(torch.equal(x, y) for x, y in zip(a, b, strict=True)):
            return name
    return None


def counts(model, graph, cfg, batch: int, draws: int, fixed: bool, gen: torch.Generator) -> dict:
    dev = model.weights.embed.device
    pos = torch.full((batch, 1), 512, device=dev)
    parts = dict.fromkeys(("A/A2", "A/R", "R/R2", "A/B", "B/R"), 0)
    tok = None
    for d in range(draws):
        if d == 0 or not fixed:
            tok = torch.randint(0, cfg.vocab_size, (batch, 1), generator=gen).to(dev)
        model.forward(tok, pos)  # as bench model: a plain eager step first
        with model.planned(model.plan.attention_as_captured()):
            b = model.forward(tok, pos).clone()
        r = graph(tok, pos).clone()
        r2 = graph(tok, pos).clone()
        with model.planned(model.plan.as_captured()):
            a = model.forward(tok, pos).clone()
            a2 = model.forward(tok, pos).clone()
        for key, (x, y) in {
            "A/A2": (a, a2),
            "A/R": (a, r),
            "R/R2": (r, r2),
            "A/B": (a, b),
            "B/R": (b, r),
        }.items():
            parts[key] += not torch.equal(x, y)
    return parts


def locate(
    model, cfg, batch: int, draws: int, gen: torch.Generator, rec: Recorder
) -> tuple[int, dict]:
    dev = model.weights.embed.device
    pos = torch.full((batch, 1), 512, device=dev)
    parted, where = 0, {}
    for _ in range(draws):
        tok = torch.randint(0, cfg.vocab_size, (batch, 1), generator=gen).to(dev)
        with model.planned(model.plan.as_captured()):
            runs = [rec.run(lambda tok=tok: model.forward(tok, pos)) for _ in range(2)]
        op = first_part(*runs)
        if op is not None:
            parted += 1
            where[op] = where.get(op, 0) + 1
    return parted, where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--fixed", action="store_true", help="one token draw for every round")
    ap.add_argument(
        "--sdpa",
        action="store_true",
        help="the captured step on torch's SDPA "
        "(the plan's hip_attention and attention_q8 off), as before 2026-12-03",
    )
    ap.add_argument(
        "--locate", action="store_true", help="the first op whose outputs part, per draw"
    )
    ap.add_argument("--no-cudnn", action="store_true", help="torch's SDPA without cuDNN's kernel")
    args = ap.parse_args()
    plan = DecodePlan(hip_attention="never", attention_q8=False) if args.sdpa else DecodePlan()
    if args.no_cudnn:
        torch.backends.cuda.enable_cudnn_sdp(False)
    rec = Recorder() if args.locate else None
    dev = torch.device("cuda")
    cfg = replace(CONFIG, num_hidden_layers=args.layers)
    weights = random_model(cfg, dev)
    gen = torch.Generator().manual_seed(1)
    print(
        f"# {args.layers} layers, captured attention {'SDPA' if args.sdpa else 'hip'}"
        f"{', cuDNN off' if args.no_cudnn else ''}{', one token draw' if args.fixed else ''}",
        flush=True,
    )
    for batch in (int(b) for b in args.batches.split(",")):
        model = Qwen3Moe(cfg, weights, max_batch=batch, max_seq_len=520, static=True, plan=plan)
        fill_cache(model.cache)
        t0 = time.time()
        if rec is not None:
            parted, where = locate(model, cfg, batch, args.draws, gen, rec)
            print(
                f"batch {batch}: {parted} of {args.draws} draws part; first parting op {where}",
                flush=True,
            )
        else:
            graph = DecodeGraph(model, batch)
            parts = counts(model, graph, cfg, batch, args.draws, args.fixed, gen)
            print(
                f"batch {batch}: draws of {args.draws} where each pair parts: {parts} "
                f"({time.time() - t0:.0f} s)",
                flush=True,
            )
            del graph
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

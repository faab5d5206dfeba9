"""A / B of decode-step settings in one process: the model of a ``qwen3moe`` GGUF file (as
``ftlab bench model --gguf`` loads it: the file's types, bf16 activations) loaded once, one
captured decode step (``--batch`` tokens at ``--position``) per setting, and the settings'
replays timed in turns, ``--rounds`` rounds of ``--reps`` replays each, so that the host's and
the GPU's drift between processes is out of the comparison. A setting is ``NAME`` (the default
``DecodePlan``) or ``NAME=FIELD,!FIELD,...``: the plan's choices turned on (or, with ``!``, off;
a WHEN choice on is "always", off "never") for its model, e.g.

    python benchmarks/ab_decode.py FILE.gguf hip-q8 sdpa=!hip_attention,!attention_q8 \\
        hip=!attention_q8 [--batch 1] [--position 512] [--rounds 5]

(the defaults attend through hip's kernel with its Q8_1: ``sdpa`` is the captured step on torch's
SDPA, as before 2026-12-03)

``--eager``: the settings' steps launched eagerly (graphs off; each setting's model, the eager
choices made as the step runs), each round's figure the wall time of ``--reps`` steps
over ``--reps`` (the host's launches bound an eager step).

Prints each round's median step time per setting, then each setting's median over the rounds
and its ratio to the first setting's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ftlab.bench.harness import time_us
from ftlab.models import DecodePlan
from ftlab.models.decode_plan import WHEN
from ftlab.models.loader import load_gguf
from ftlab.models.pipeline import DecodeGraph
from ftlab.models.qwen3_moe import Qwen3Moe


def parse_setting(text: str) -> tuple[str, DecodePlan]:
    """``NAME[=FIELD,!FIELD,...]`` -> (name, the default plan with those choices on / off)."""
    name, _, rest = text.partition("=")
    changes: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        field, on = item.lstrip("!"), not item.startswith("!")
        value = getattr(DecodePlan(), field, None)
        if isinstance(value, bool):
            changes[field] = on
        elif value in WHEN:
            changes[field] = "always" if on else "never"
        else:
            raise SystemExit(f"{field!r} is not an on / off choice of ftlab.models.DecodePlan")
    return name, DecodePlan().with_(**changes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument(
        "settings", nargs="+", help="NAME or NAME=FIELD,!FIELD,... (DecodePlan choices on / off)"
    )
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--position", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument(
        "--eager", action="store_true", help="time eager steps (graphs off) instead of replays"
    )
    args = ap.parse_args()
    settings = [parse_setting(s) for s in args.settings]
    dev = torch.device("cuda")
    config, weights = load_gguf(args.file, device=dev, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (args.batch, 1), generator=gen).to(dev)
    positions = torch.full((args.batch, 1), args.position, device=dev)
    steps = {}
    for name, plan in settings:
        model = Qwen3Moe(
            config,
            weights,
            max_batch=args.batch,
            max_seq_len=args.position + 8,
            static=True,
            plan=plan,
        )
        if args.eager:
            steps[name] = (lambda m: lambda: m.forward(tokens, positions))(model)
        else:
            # captured under this setting's plan (it keeps the model)
            graph = DecodeGraph(model, args.batch)
            steps[name] = (lambda g: lambda: g(tokens, positions))(graph)
    timer = _wall_us if args.eager else time_us
    times: dict[str, list[float]] = {name: [] for name, _ in settings}
    how = "eager steps (wall time)" if args.eager else "one captured step per setting"
    print(
        f"{args.file}: decode batch {args.batch} at position {args.position}, {how}, "
        f"{args.rounds} rounds of {args.reps} replays each (median us a step)"
    )
    for r in range(args.rounds):
        for name, _ in settings:
            times[name].append(timer(steps[name], warmup=5, reps=args.reps))
        print(
            f"round {r + 1}: " + "  ".join(f"{name} {times[name][-1]:.1f}" for name, _ in settings)
        )
    first = statistics.median(times[settings[0][0]])
    for name, plan in settings:
        med = statistics.median(times[name])
        print(
            f"{name:>12}: {med:8.1f} us  {args.batch * 1e6 / med:6.1f} tokens/s  "
            f"{med / first:.3f}x the first  "
            f"(spread {min(times[name]):.1f} .. {max(times[name]):.1f}; {plan})"
        )


def _wall_us(fn, warmup: int, reps: int) -> float:
    """Wall time of one ``fn()`` in us: ``reps`` calls back to back, synchronized at both ends."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


if __name__ == "__main__":
    main()

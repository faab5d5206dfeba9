"""Where a decode step's time goes, kernel by kernel: the model of a ``qwen3moe`` GGUF file (as
``ftlab bench model --gguf`` loads it: the file's types, bf16 activations), one decode step of
``--batch`` tokens at position ``--position``, replayed from a CUDA graph ``--steps`` times under
``torch.profiler``; the device time of each kernel name, per step, largest first, with its share
of the step and its calls per step (divide by the layer count for a layer's). On the CPU
(``--device cpu``): the eager step's operators, a smoke run. ``--host``: the eager step (no graph)
under cProfile instead, the Python functions that take its host time, by own time and by
cumulative time, with the eager step's wall time.

    python benchmarks/profile_decode.py FILE.gguf [--batch 1] [--position 512] [--steps 20]
        [--top 30] [--device cuda|cpu] [--host] [--fusions kv,router,qkv] [--attention hip]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from ftlab.bench.harness import time_us
from ftlab.models import layers as model_layers
from ftlab.models.loader import load_gguf
from ftlab.models.pipeline import DecodeGraph
from ftlab.models.qwen3_moe import Qwen3Moe


def kernel_times(prof, device: str) -> dict[str, tuple[float, int]]:
    """{kernel (or, on the CPU, operator) name: (total microseconds, calls)} of a profile."""
    totals: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if device == "cuda" and ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if device == "cpu" and (ev.device_type != torch.autograd.DeviceType.CPU or ev.cpu_parent is not None):
            continue  # top-level operators only: children are inside their parents' time
        t = totals[ev.name]
        t[0] += ev.device_time if device == "cuda" else ev.cpu_time
        t[1] += 1
    return {k: (v[0], v[1]) for k, v in totals.items()}


def host_profile(step, dev: torch.device, batch: int, steps: int, top: int) -> None:
    """The eager step's wall time, then its Python under cProfile: the ``top`` functions by own
    time and by cumulative time (per step)."""
    import cProfile
    import io
    import pstats
    import time

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    wall = (time.perf_counter() - t0) * 1e6 / steps
    print(f"eager step: {wall:.1f} us of wall time ({batch * 1e6 / wall:.1f} tokens/s)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    sync()
    prof.disable()
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(top)
        text = out.getvalue()
        print(f"--- by {key} ({steps} steps)\n" + text[text.find("   ncalls"):].rstrip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--position", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--host", action="store_true", help="cProfile the eager step's Python instead")
    ap.add_argument("--fusions", default="", help="comma-separated decode fusions to turn on: kv (the KV store "
                    "inside qk_norm_rope, layers.KV_STORE_IN_ROPE), router (the post-attention norm inside the "
                    "router, layers.NORM_IN_ROUTER), qkv (the input norm inside the q/k/v matvec, "
                    "layers.NORM_IN_QKV)")  # fmt: skip
    ap.add_argument("--attention", default="auto", help="the decode_attention backend (auto: hip's kernel under layers.DECODE_ATTENTION_HIP, on by default, or for the eager --host step under DECODE_ATTENTION_HIP_EAGER; else SDPA)")
    args = ap.parse_args()
    flags = {"kv": "KV_STORE_IN_ROPE", "router": "NORM_IN_ROUTER", "qkv": "NORM_IN_QKV"}
    for name in filter(None, args.fusions.split(",")):
        if name not in flags:
            raise SystemExit(f"--fusions takes {', '.join(flags)}, got {name!r}")
        setattr(model_layers, flags[name], True)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    config, weights = load_gguf(args.file, device=dev, dtype=dtype)
    model = Qwen3Moe(config, weights, max_batch=args.batch, max_seq_len=args.position + 8, static=True,
                     backends={"decode_attention": args.attention})
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (args.batch, 1), generator=gen).to(dev)
    positions = torch.full((args.batch, 1), args.position, device=dev)
    if args.host:
        host_profile(lambda: model.forward(tokens, positions), dev, args.batch, args.steps, args.top)
        return
    if dev.type == "cuda":
        graph = DecodeGraph(model, args.batch)
        graph(tokens, positions)
        torch.cuda.synchronize()
        step = lambda: graph(tokens, positions)  # noqa: E731
        activities = [ProfilerActivity.CUDA]
    else:
        step = lambda: model.forward(tokens, positions)  # noqa: E731
        activities = [ProfilerActivity.CPU]
    step()
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    times = kernel_times(prof, dev.type)
    total = sum(t for t, _ in times.values()) / args.steps
    layers = config.num_hidden_layers
    print(f"{args.file}: decode batch {args.batch} at position {args.position}, {layers} layers; "
          f"{total:.1f} us a step in {sum(c for _, c in times.values()) / args.steps:.0f} "
          f"{'kernels' if dev.type == 'cuda' else 'operators'} ({args.steps} steps profiled)")  # fmt: skip
    if dev.type == "cuda":
        wall = time_us(step, warmup=3, reps=50)
        print(f"a step takes {wall:.1f} us of wall time replayed ({args.batch * 1e6 / wall:.0f} tokens/s), "
              f"{wall - total:.1f} us more than its kernels")  # fmt: skip
    print(f"{'us/step':>9} {'share':>6} {'calls/step':>10}  name")
    for name, (t, calls) in sorted(times.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{t / args.steps:9.1f} {100 * t / args.steps / total:5.1f}% {calls / args.steps:10.1f}  {name[:110]}")


if __name__ == "__main__":
    main()

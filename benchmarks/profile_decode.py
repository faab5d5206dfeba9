"""Where a decode step's time goes, kernel by kernel: the model of a GGUF file (as ``ftlab bench
model --gguf`` loads it: the file's types, bf16 activations; ``qwen3moe``, ``qwen35moe`` or
``qwen3next``), or with ``--random qwen35moe`` the Qwen3.6-35B-A3B shape with random Q4_0 weights
made on the device (``ftlab bench model --arch qwen35moe``'s model), one decode step of
``--batch`` tokens at position ``--position``, replayed from a CUDA graph ``--steps`` times under
``torch.profiler``; the device time of each kernel name, per step, largest first, with its share
of the step and its calls per step (divide by the layer count for a layer's). On the CPU
(``--device cpu``): the eager step's operators, a smoke run. ``--host``: the eager step (no graph)
under cProfile instead, the Python functions that take its host time, by own time and by
cumulative time, with the eager step's wall time. ``--prefill N``: a prefill pass of one N-token
prompt (the static model, as ``Pipeline.prefill`` with graphs on runs it: launched op by op, the
last position's logits) instead: its wall time beside its kernels' time, the kernels by name, and
the same pass replayed from a captured graph.

    python benchmarks/profile_decode.py FILE.gguf [--batch 1] [--position 512] [--steps 20]
        [--top 30] [--device cuda|cpu] [--host] [--fusions kv,router,qkv] [--attention hip]
    python benchmarks/profile_decode.py --random qwen35moe [--prefill 512] ...
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from ftlab.bench.harness import capture, time_us
from ftlab.models import DecodePlan
from ftlab.models.loader import GGUF_ARCH, gguf_architecture, load_gguf, load_gguf_model
from ftlab.models.pipeline import DecodeGraph
from ftlab.models.qwen3_moe import Qwen3Moe
from ftlab.models.qwen3_next import NextWeights, Qwen3Next


def kernel_times(prof, device: str) -> dict[str, tuple[float, int]]:
    """{kernel (or, on the CPU, operator) name: (total microseconds, calls)} of a profile."""
    totals: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if device == "cuda" and ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if device == "cpu" and (
            ev.device_type != torch.autograd.DeviceType.CPU or ev.cpu_parent is not None
        ):
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
        print(f"--- by {key} ({steps} steps)\n" + text[text.find("   ncalls") :].rstrip())


def load(args, dev: torch.device, dtype: torch.dtype):
    """(config, weights) of the file, or of the random model ``--random`` names."""
    if args.random is None:
        if args.file is None:
            raise SystemExit("give a GGUF file or --random")
        # no tokenizer needed (random files have none)
        if gguf_architecture(args.file) == GGUF_ARCH:
            return load_gguf(args.file, device=dev, dtype=dtype)
        config, weights, _ = load_gguf_model(args.file, device=dev, dtype=dtype)
        return config, weights
    from ftlab.bench.qwen35moe_random import QWEN35_35B_A3B, SMALL, RandomTensors, hf_config
    from ftlab.models.qwen3_next import Qwen3NextConfig, build_weights

    hf = hf_config(QWEN35_35B_A3B if args.random == "qwen35moe" else SMALL)
    config = Qwen3NextConfig.from_hf(hf)
    args.file = f"random {args.random}"
    return config, build_weights(
        config, RandomTensors(hf, dev), device=dev, dtype=dtype, where=args.file
    )


def table(times: dict[str, tuple[float, int]], steps: int, total: float, top: int) -> None:
    print(f"{'us/step':>9} {'share':>6} {'calls/step':>10}  name")
    for name, (t, calls) in sorted(times.items(), key=lambda kv: -kv[1][0])[:top]:
        print(
            f"{t / steps:9.1f} {100 * t / steps / total:5.1f}% {calls / steps:10.1f}  {name[:110]}"
        )


def profile_prefill(model, args, dev: torch.device, gen: torch.Generator) -> None:
    """One ``args.prefill``-token prompt through the static ``model`` (last position's logits):
    wall time launched op by op, its kernels by name, and the pass replayed from a graph."""
    n = args.prefill
    tokens = torch.randint(0, model.config.vocab_size, (1, n), generator=gen).to(dev)
    pos = torch.arange(n, device=dev)[None]
    step = lambda: model.forward(tokens, pos, last_only=True)
    eager = step()
    if dev.type != "cuda":
        print(
            f"{args.file}: prefill {n} tokens ran, logits finite: "
            f"{bool(torch.isfinite(eager).all())}"
        )
        return
    wall = time_us(step, warmup=2, reps=5)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    times = kernel_times(prof, "cuda")
    total = sum(t for t, _ in times.values()) / args.steps
    calls = sum(c for _, c in times.values()) / args.steps
    print(
        f"{args.file}: prefill {n} tokens, {model.config.num_hidden_layers} layers, launched op by "
        f"op: {wall:.1f} us of wall time ({n * 1e6 / wall:.0f} tokens/s), kernels {total:.1f} us "
        f"in {calls:.0f} launches ({args.steps} passes profiled)"
    )
    try:
        replay, out = capture(step, warmup=2)
        replay()
        same = float((out - eager).abs().max()) / float(eager.abs().max())
        t = time_us(replay, warmup=2, reps=5)
        print(
            f"graph-replayed: {t:.1f} us ({n * 1e6 / t:.0f} tokens/s); max |logits - eager's| / "
            f"max |eager's| {same:.2e}"
        )
    except Exception as e:
        print(f"graph capture failed: {type(e).__name__}: {str(e)[:300]}")
    table(times, args.steps, total, args.top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", help="a GGUF file (or --random)")
    ap.add_argument(
        "--random",
        choices=["qwen35moe", "qwen35moe-small"],
        help="random Q4_0 weights of the "
        "Qwen3.6-35B-A3B shape (or the bench's scaled-down one, a CPU smoke run) instead of a file",
    )
    ap.add_argument(
        "--prefill", type=int, default=0, help="profile a prefill pass of this many tokens instead"
    )
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--position", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--host", action="store_true", help="cProfile the eager step's Python instead")
    ap.add_argument(
        "--fusions",
        default="",
        help="comma-separated decode fusions to turn on for every step: kv (the KV store inside "
        "qk_norm_rope, DecodePlan.kv_store_in_rope), router (the post-attention norm inside the "
        "router, norm_in_router), qkv (the input norm inside the q/k/v matvec, norm_in_qkv)",
    )
    ap.add_argument(
        "--attention",
        default="auto",
        help="the decode_attention backend (auto: hip's kernel "
        "where the plan's hip_attention picks it, else SDPA)",
    )
    args = ap.parse_args()
    fields = {
        "kv": ("kv_store_in_rope", True),
        "router": ("norm_in_router", True),
        "qkv": ("norm_in_qkv", "always"),
    }
    changes = {}
    for name in filter(None, args.fusions.split(",")):
        if name not in fields:
            raise SystemExit(f"--fusions takes {', '.join(fields)}, got {name!r}")
        changes[fields[name][0]] = fields[name][1]
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    config, weights = load(args, dev, dtype)
    kind = Qwen3Next if isinstance(weights, NextWeights) else Qwen3Moe
    length = max(args.position, args.prefill) + 8
    plan = DecodePlan({"decode_attention": args.attention}).with_(**changes)
    model = kind(config, weights, max_batch=args.batch, max_seq_len=length, static=True, plan=plan)
    gen = torch.Generator().manual_seed(0)
    if args.prefill:
        return profile_prefill(model, args, dev, gen)
    tokens = torch.randint(0, config.vocab_size, (args.batch, 1), generator=gen).to(dev)
    positions = torch.full((args.batch, 1), args.position, device=dev)
    if args.host:
        host_profile(
            lambda: model.forward(tokens, positions), dev, args.batch, args.steps, args.top
        )
        return
    if dev.type == "cuda":
        graph = DecodeGraph(model, args.batch)
        graph(tokens, positions)
        torch.cuda.synchronize()
        step = lambda: graph(tokens, positions)
        activities = [ProfilerActivity.CUDA]
    else:
        step = lambda: model.forward(tokens, positions)
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
    print(
        f"{args.file}: decode batch {args.batch} at position {args.position}, {layers} layers; "
        f"{total:.1f} us a step in {sum(c for _, c in times.values()) / args.steps:.0f} "
        f"{'kernels' if dev.type == 'cuda' else 'operators'} ({args.steps} steps profiled)"
    )
    if dev.type == "cuda":
        wall = time_us(step, warmup=3, reps=50)
        print(
            f"a step takes {wall:.1f} us of wall time replayed ({args.batch * 1e6 / wall:.0f} "
            f"tokens/s), {wall - total:.1f} us more than its kernels"
        )
    table(times, args.steps, total, args.top)


if __name__ == "__main__":
    main()

"""The host cost of an eager decode step through the hip backend, without a GPU: the model and
the hip entries' Python run on CPU tensors with every kernel launch stubbed out (a tvm-ffi call
does nothing), so what is timed is the Python a step runs -- the ops' dispatch, checks, views,
allocations -- not the kernels. A proxy: on the H200 machine's host the same Python costs about
3x more a call (benchmarks/NOTES.md, "Eager decode"). Outputs are garbage (empty buffers).

    python benchmarks/host_proxy.py FILE.gguf [--batch 1] [--steps 30] [--profile N]

FILE: a small Qwen3-MoE GGUF of the bench's layer shapes (benchmarks/write_random_qwen3moe.py
--layers 4 --vocab 8192 --type Q4_0 --device cpu); reported per layer and per 48-layer step."""

from __future__ import annotations

import argparse
import time

import torch

from ftlab import backends, jit
from ftlab.backends.registry import forget
from ftlab.models import DecodePlan
from ftlab.models.qwen3_moe import Qwen3Moe, load_gguf


class _Stub:
    """A JIT module whose every function is a launch that does nothing."""

    def __getattr__(self, name):
        return _noop


def _noop(*args):
    return None


def stub_hip() -> None:
    """hip serves CPU tensors and launches nothing."""
    jit.module_for = lambda name, device: _Stub()
    jit.load_gpu = lambda name, plat=None: _Stub()
    orig = backends.Impl.cannot_serve

    def cannot_serve(self, plat, device_type, dtype, path=None, probe=True):
        if self.backend == "hip":
            return None
        return orig(self, plat, device_type, dtype, path, probe)

    backends.Impl.cannot_serve = cannot_serve
    forget()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--profile", type=int, default=0, help="print the top N functions of a cProfile"
    )
    ap.add_argument("--sort", default="tottime", help="the profile's order (tottime, cumulative)")
    args = ap.parse_args()
    stub_hip()
    config, weights = load_gguf(args.gguf, device="cpu", dtype=torch.bfloat16, progress=False)
    names = {op: "hip" for op in Qwen3Moe.OPS if "hip" in backends.backends_of(op)}
    names["decode_attention"] = "hip"
    # what an eager step on a GPU takes (CPU tensors here)
    plan = DecodePlan(names, norm_in_qkv="always")
    model = Qwen3Moe(config, weights, max_batch=args.batch, max_seq_len=520, static=True, plan=plan)
    tok = torch.zeros(args.batch, 1, dtype=torch.long)
    pos = torch.full((args.batch, 1), 512)
    for _ in range(3):
        model.forward(tok, pos)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        model.forward(tok, pos)
        times.append(time.perf_counter() - t0)
    times.sort()
    n = config.num_hidden_layers
    med = times[len(times) // 2]
    print(
        f"{n} layers, batch {args.batch}, checks={plan.checks}: step median {med * 1e3:.3f} ms, "
        f"min {times[0] * 1e3:.3f} ms; per layer ~{med / n * 1e6:.1f} us"
    )
    if args.profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.steps):
            model.forward(tok, pos)
        pr.disable()
        pstats.Stats(pr).sort_stats(args.sort).print_stats(args.profile)


if __name__ == "__main__":
    main()

"""The gated delta rule's decode step at Qwen3.6's linear-attention shape (16 key / 32 value heads
of 128, bf16 q, k, v; fp32 state [B, 32, 128, 128]) per backend and, for HIP, per block width
(16 or 32 state columns a block), graph-replayed with the state rotated over copies so that it
comes from DRAM. Prints microseconds, the state's read + write GB/s and its share of the copy
bandwidth measured in the same run, and whether the output and the new state match the
reference (relative L2 error of o < 1e-2, of the state < 1e-5).

    python benchmarks/time_gated_delta_step.py [--batches 1,8,32]
"""

from __future__ import annotations

import argparse

import torch

from ftlab import ops
from ftlab.bench.harness import copy_bandwidth, time_graph_us
from ftlab.hip import gated_delta_rule as hip_dn

HK, HV, D = 16, 32, 128
ROTATE_BYTES = 512 << 20


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-30))


def _batch(b: int, copy: float, dev: torch.device) -> None:
    gen = torch.Generator(device=dev).manual_seed(b)
    q = torch.randn(b, HK, D, device=dev, generator=gen, dtype=torch.bfloat16)
    k = torch.randn(b, HK, D, device=dev, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(b, HV, D, device=dev, generator=gen, dtype=torch.bfloat16)
    g = -torch.nn.functional.softplus(torch.randn(b, HV, device=dev, generator=gen))
    beta = torch.sigmoid(torch.randn(b, HV, device=dev, generator=gen))
    state_bytes = b * HV * D * D * 4
    copies = max(2, min(64, ROTATE_BYTES // state_bytes))
    states = [torch.randn(b, HV, D, D, device=dev, generator=gen) * 0.1 for _ in range(copies)]
    start = states[0].clone()
    want_s = start.clone()
    want_o = ops.gated_delta_step(q, k, v, g, beta, want_s, backend="reference")

    def hip(s, cols):
        return hip_dn.gated_delta_step(q, k, v, g, beta, s, D**-0.5, True, cols)

    variants = {
        "hip cols 16": lambda s: hip(s, 16),
        "hip cols 32": lambda s: hip(s, 32),
        "hip auto": lambda s: hip(s, 0),
        "triton": lambda s: ops.gated_delta_step(q, k, v, g, beta, s, backend="triton"),
    }
    for name, fn in variants.items():
        s = start.clone()
        o = fn(s)
        ok = _rel(o, want_o) < 1e-2 and _rel(s, want_s) < 1e-5
        turn = iter(range(1 << 62))
        us = time_graph_us(lambda f=fn, it=turn: f(states[next(it) % copies]), inner=copies)
        gbs = 2 * state_bytes / (us * 1e-6) / 1e9
        print(
            f"{b:>3} {name:<14} {us:8.2f} {gbs:7.0f} {100 * gbs / copy:6.1f}%  "
            f"{'ok' if ok else 'MISMATCH'}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    args = ap.parse_args()
    dev = torch.device("cuda")
    copy = copy_bandwidth()
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy bandwidth {copy:.0f} GB/s"
    )
    print(f"{'B':>3} {'variant':<14} {'us':>8} {'GB/s':>7} {'% copy':>7}  ok")
    for b in (int(x) for x in args.batches.split(",")):
        _batch(b, copy, dev)


if __name__ == "__main__":
    main()

"""Tiles of Triton's chunk-64 gated delta rule prefill (``ftlab.triton.gated_delta_rule_chunk64``)
in both precisions, on a GPU: ``python benchmarks/sweep_gated_delta_rule_chunk64.py [--quick]``.

Qwen3.6's linear-attention heads (16 key / 32 value heads of 128), bf16, one sequence of T tokens.
For each precision ("fp32": tf32x3 dots and fp32 scratch; "bf16": bf16 operands and scratch) the
table's configuration is timed, then each setting of CONFIGS changed one at a time; every run is
checked against the exact recurrence's bound of its precision on a short prefix (the same kernels
and tiles), and the whole length against the table's output (relative error of o and the final
state). fla's ``chunk_gated_delta_rule`` is timed beside, when importable. Times: the median of
eager calls (the ops allocate their scratch), as ``ftlab bench gated_delta_rule`` reports them.
"""

from __future__ import annotations

import argparse

import torch

from ftlab.bench.harness import copy_bandwidth, require_gpu, time_us
from ftlab.platform import current
from ftlab.testing.gated_delta_bounds import gated_delta_exact_and_tolerance
from ftlab.triton import gated_delta_rule_chunk64 as dc

HK, HV, D = 16, 32, 128
#: each setting tried apart from the table's (compile-checked spill-free only at the table's)
CHOICES = {
    "SCAN_BV": (16, 32, 64),
    "SCAN_NQ": (1, 2, 4),
    "SCAN_WARPS": (4, 8),
    "SCAN_STAGES": (1, 2, 3),
    "OUT_BV": (32, 64, 128),
    "OUT_WARPS": (4, 8),
    "WY_BS": (32, 64),
    "INV_BS": (32, 64),
}


def inputs(t: int, dev: torch.device):
    gen = torch.Generator(device=dev).manual_seed(t)
    q = torch.randn(1, t, HK, D, device=dev, generator=gen, dtype=torch.bfloat16)
    k = torch.randn(1, t, HK, D, device=dev, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(1, t, HV, D, device=dev, generator=gen, dtype=torch.bfloat16)
    g = -torch.nn.functional.softplus(torch.randn(1, t, HV, device=dev, generator=gen))
    beta = torch.sigmoid(torch.randn(1, t, HV, device=dev, generator=gen))
    return q, k, v, g, beta


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))


def within_bound(cfg: dict, precision: str, dev: torch.device) -> bool:
    """The configuration on 200 tokens against the exact recurrence's bound of its precision."""
    q, k, v, g, beta = inputs(200, dev)
    o, s = dc.gated_delta_rule(
        q, k, v, g, beta, None, D**-0.5, True, config=cfg, precision=precision
    )
    eo, es, ob, sb = gated_delta_exact_and_tolerance(
        *(x.cpu() for x in (q, k, v, g, beta)), None, D**-0.5, True, 64, operands=precision
    )
    return bool(
        ((o.cpu().double() - eo).abs() <= ob).all() and ((s.cpu().double() - es).abs() <= sb).all()
    )


def one_length(t: int, dev: torch.device, table: dict, fla) -> None:
    """Every row of one sequence length (module docstring)."""
    q, k, v, g, beta = inputs(t, dev)
    reps = 10 if t <= 4096 else 3
    if fla is not None:
        us = time_us(
            lambda: fla(
                q,
                k,
                v,
                g,
                beta.bfloat16(),
                scale=D**-0.5,
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            ),
            warmup=2,
            reps=reps,
        )
        print(f"T={t} fla chunk_gated_delta_rule: {us:.0f} us", flush=True)
    for precision in ("fp32", "bf16"):
        want_o, want_s = dc.gated_delta_rule(
            q, k, v, g, beta, None, D**-0.5, True, precision=precision
        )
        for name, values in [("table", (None,)), *CHOICES.items()]:
            for value in values:
                if name != "table" and value == table[name]:
                    continue
                cfg = {} if name == "table" else {name: value}

                def call(c=cfg, p=precision):
                    return dc.gated_delta_rule(
                        q, k, v, g, beta, None, D**-0.5, True, config=c, precision=p
                    )

                try:
                    o, s = call()
                    us = time_us(call, warmup=2, reps=reps)
                    ok = within_bound(cfg, precision, dev)
                    line = (
                        f"{us:8.0f} us  o {rel(o, want_o):.1e}  state {rel(s, want_s):.1e}  "
                        f"bound {'ok' if ok else 'FAILED'}"
                    )
                except Exception as e:  # a tile that does not compile or fit: a row that says so
                    line = f"failed: {type(e).__name__}: {str(e)[:120]}"
                print(f"T={t} {precision} {name}={value}: {line}", flush=True)
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="T = 4096 only")
    args = ap.parse_args()
    require_gpu()
    dev = torch.device("cuda")
    table = dc.CONFIGS.get(current(dev).arch, dc.CONFIGS["default"])
    print(
        f"{torch.cuda.get_device_name(dev)}; copy {copy_bandwidth():.0f} GB/s; table {table}",
        flush=True,
    )
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
    except ImportError:
        fla = None
    for t in (4096,) if args.quick else (4096, 16384):
        one_length(t, dev, table, fla)


if __name__ == "__main__":
    main()

"""The one-row (M = 1) K-quant matvec, variant by variant, at ``ftlab bench quant_matmul``'s shapes:
hip's "lanes", "vec" (16-byte pieces, eight lanes a super-block), "tiled", "fused" (vec's pieces in
one launch, x quantized in every block, y in x's dtype), "staged" (fused with the rows copied into
LDS slots asynchronously; K <= 2048, else it runs "fused") and "sliced" (a row's slices of 8
super-blocks held by the lane groups of a block; K <= 16384; "sliced_q8" given x's Q8_1 by its own
launch), and Triton's default; Q4_0 (its region matvec, then the one-launch kernels on groups of
eight blocks) and Q8_0 as well, each graph-replayed with the weights cycled past the L2 (as ``bench
quant`` does), beside the copy bandwidth measured in the same run; each variant's output checked
against the reference on the first rows first. ``--resident`` also times each variant on one weight
called again and again (a weight that fits the L2 stays there: how llama.cpp's ``test-backend-ops
perf`` times MUL_MAT).

    python benchmarks/time_quant_mv1.py [--types Q4_K,Q5_K,Q6_K] [--shapes lm,llama,qkv,o_proj]
        [--variants lanes,vec,tiled,fused,staged,sliced,sliced_q8,triton] [--resident]
"""

from __future__ import annotations

import argparse

import torch

from ftlab import backends, ops
from ftlab.backends import calls
from ftlab.backends.limits import STAGINGS
from ftlab.bench.harness import MIN_INNER, copy_bandwidth, device_info, time_graph_us
from ftlab.bench.quant_matmul import SHAPES, random_weight
from ftlab.hip import quant_matmul as hip_qmm
from ftlab.quant import quant_weight
from ftlab.testing.q4_0 import matmul_tolerance as q4_0_matmul_tolerance
from ftlab.testing.quant_matmul import quant_matmul_tolerance

SHORT = {
    "lm": "lm_head 2048->151936",
    "llama": "llama.cpp 4096x14336",
    "qkv": "qkv 2048->5120",
    "o_proj": "o_proj 4096->2048",
}
ROTATE_BYTES = 256 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    ap.add_argument("--shapes", default="lm,llama,qkv,o_proj")
    ap.add_argument(
        "--variants",
        default="lanes,vec,held,staged,sliced,sliced_q8,triton",
        help="hip's lanes / vec, mv1's stagings (held, staged, sliced, sliced_q8), triton",
    )
    ap.add_argument(
        "--resident", action="store_true", help="also time one weight called again and again"
    )
    args = ap.parse_args()
    dev = torch.device("cuda")
    info = device_info()
    bw = copy_bandwidth()
    print(
        f"# {info.get('name')} ({info.get('arch')}), torch {info.get('torch')}, triton "
        f"{info.get('triton')}, "
        f"ftlab {info.get('commit')}; copy bandwidth {bw:.0f} GB/s; M = 1, bf16 x, graph-replayed"
    )
    for qtype in args.types.split(","):
        for short in args.shapes.split(","):
            time_case(qtype, SHORT[short], bw, dev, args.variants.split(","), args.resident)
            torch.cuda.empty_cache()


def _as_hip(name: str) -> dict:
    """hip quant_matmul's arguments for a variant name or one of mv1's stagings."""
    return {"variant": "mv1", "staging": name} if name in STAGINGS else {"variant": name}


def _why_not(name: str, call) -> str | None:
    """Why hip's variant (or mv1's staging) ``name`` cannot serve ``call``, or None."""
    return (
        backends.why_not("quant_matmul", "hip", "mv1", call, staging=name)
        if name in STAGINGS
        else backends.why_not("quant_matmul", "hip", name, call)
    )


def time_case(
    qtype: str, label: str, bw: float, dev: torch.device, variants: list[str], resident: bool
) -> None:
    """One type at one shape: every variant checked on the first rows, then timed."""
    n, k = SHAPES[label]
    w = random_weight(qtype, n, k, dev)
    reps = max(1, min(32, -(-ROTATE_BYTES // w.nbytes)))
    banks = [w] + [quant_weight(w.data.clone(), w.shape, qtype) for _ in range(reps - 1)]
    inner = reps * -(-MIN_INNER // reps)
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    rows = min(n, 2048)
    part = quant_weight(w.data[:rows], (rows, k), qtype)
    if qtype == "Q4_0":
        exact = ops.q4_0_matmul(x.float(), part, path="int8", backend="reference")
        bound = q4_0_matmul_tolerance(x.float(), part, "int8", x.dtype)
    else:
        # the outputs are in x's dtype
        exact, bound = quant_matmul_tolerance(x.float(), part, "int8", x.dtype)
    if qtype == "Q4_0":  # the region matvec (q4_0_matmul's default), then the one-launch kernels
        runs = [("hip region", lambda wv: ops.q4_0_matmul(x, wv, backend="hip"))]
        runs += [
            (f"hip {v}", lambda wv, v=v: hip_qmm.q4_0_one_row(x, wv, v))
            for v in variants
            if v in STAGINGS
        ]
    else:
        runs = [
            (f"hip {v}", lambda wv, v=v: hip_qmm.quant_matmul(x, wv, "int8", **_as_hip(v)))
            for v in variants
            if v != "triton"
        ]
    if "triton" in variants:
        op = ops.q4_0_matmul if qtype == "Q4_0" else ops.quant_matmul
        runs.append(("triton", lambda wv: op(x, wv, backend="triton")))
    for name, fn in runs:
        variant = name.removeprefix("hip ")
        why = (
            _why_not(variant, calls.matmul(x, w))
            if name.startswith("hip ") and variant != "region"
            else None
        )
        if why is not None:  # refused, never swapped: say so
            print(f"{qtype} {label:>22} {name:>11}: does not serve ({why})")
            continue
        y = fn(part).float()  # every one on the int8 path: within its derived bound
        ok = bool(((y - exact.to(dev)).abs() <= bound.to(dev)).all())
        turn = iter(range(1 << 62))
        t = time_graph_us(lambda f=fn, tn=turn: f(banks[next(tn) % reps]), inner=inner)
        gbps = w.nbytes / t / 1e3
        one = (
            f"  one weight {time_graph_us(lambda f=fn: f(w), inner=MIN_INNER):8.2f} us"
            if resident
            else ""
        )
        print(
            f"{qtype} {label:>22} {name:>11}: {t:8.2f} us {gbps:7.0f} GB/s {100 * gbps / bw:5.1f}% "
            f"of copy  {'ok' if ok else 'WRONG'}{one}"
        )


if __name__ == "__main__":
    main()

"""The one-row (M = 1) K-quant matvec, variant by variant, at ``ftlab bench quant``'s shapes: hip's
"lanes", "vec" (16-byte pieces, eight lanes a super-block), "tiled", "fused" (vec's pieces in
one launch, x quantized in every block, y in x's dtype) and "staged" (fused with the rows copied
into LDS slots asynchronously; K <= 2048, else it runs "fused"), and Triton's default,
each graph-replayed with the weights cycled past the L2 (as ``bench quant`` does), beside the copy
bandwidth measured in the same run; each variant's output checked against the reference on the
first rows first.

    python benchmarks/time_quant_mv1.py [--types Q4_K,Q5_K,Q6_K] [--shapes lm,llama,qkv,o_proj]
"""

from __future__ import annotations

import argparse

import torch

from ftlab import ops
from ftlab.bench.harness import copy_bandwidth, device_info, time_graph_us
from ftlab.bench.quant import MIN_INNER, SHAPES, random_weight
from ftlab.hip import quant_matmul as hip_qmm
from ftlab.quant import QuantWeight
from ftlab.testing.quant_matmul import quant_matmul_tolerance

SHORT = {"lm": "lm_head 2048->151936", "llama": "llama.cpp 4096x14336", "qkv": "qkv 2048->5120",
         "o_proj": "o_proj 4096->2048"}  # fmt: skip
ROTATE_BYTES = 256 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    ap.add_argument("--shapes", default="lm,llama,qkv,o_proj")
    args = ap.parse_args()
    dev = torch.device("cuda")
    info = device_info()
    bw = copy_bandwidth()
    print(f"# {info.get('name')} ({info.get('arch')}), torch {info.get('torch')}, triton {info.get('triton')}, "
          f"ftlab {info.get('commit')}; copy bandwidth {bw:.0f} GB/s; M = 1, bf16 x, graph-replayed")  # fmt: skip
    for qtype in args.types.split(","):
        for short in args.shapes.split(","):
            time_case(qtype, SHORT[short], bw, dev)
            torch.cuda.empty_cache()


def time_case(qtype: str, label: str, bw: float, dev: torch.device) -> None:
    """One type at one shape: every variant checked on the first rows, then timed."""
    n, k = SHAPES[label]
    w = random_weight(qtype, n, k, dev)
    reps = max(1, min(32, -(-ROTATE_BYTES // w.nbytes)))
    banks = [w] + [QuantWeight(w.data.clone(), w.shape, qtype) for _ in range(reps - 1)]
    inner = reps * -(-MIN_INNER // reps)
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    rows = min(n, 2048)
    part = QuantWeight(w.data[:rows], (rows, k), qtype)
    exact, bound = quant_matmul_tolerance(x.float(), part, "int8", x.dtype)  # the outputs are in x's dtype
    runs = [(f"hip {v}", lambda wv, v=v: hip_qmm.quant_matmul(x, wv, "int8", variant=v))
            for v in ("lanes", "vec", "tiled", "fused", "staged")]  # fmt: skip
    runs.append(("triton", lambda wv: ops.quant_matmul(x, wv, backend="triton")))
    for name, fn in runs:
        y = fn(part).float()  # every one on the int8 path: within its derived bound
        ok = bool(((y - exact.to(dev)).abs() <= bound.to(dev)).all())
        turn = iter(range(1 << 62))
        t = time_graph_us(lambda f=fn, tn=turn: f(banks[next(tn) % reps]), inner=inner)
        gbps = w.nbytes / t / 1e3
        print(f"{qtype} {label:>22} {name:>11}: {t:8.2f} us {gbps:7.0f} GB/s {100 * gbps / bw:5.1f}% of copy"
              f"  {'ok' if ok else 'WRONG'}")  # fmt: skip

if __name__ == "__main__":
    main()

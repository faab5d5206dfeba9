"""M = 1 matvec at llama.cpp's MUL_MAT shape (4096 x 14336) two ways, in one run: the weights
cycled past the L2 (what ``ftlab bench q4_0`` / ``bench quant`` report: every call reads DRAM) and
one weight called again and again (what llama.cpp's ``test-backend-ops perf`` times: a 33 MB Q4_0
or Q4_K matrix stays in the H200's 50 MB L2 between calls). Each backend's output is checked
against the int8 reference within its derived bound first; the copy bandwidth is measured in the
same run.

    python benchmarks/time_matvec_resident.py [--types Q4_0,Q8_0,Q4_K,Q5_K,Q6_K] [--n 4096] [--k
    14336]
"""

from __future__ import annotations

import argparse

import torch

from ftlab import ops
from ftlab.bench.harness import copy_bandwidth, device_info, time_graph_us
from ftlab.bench.quant_matmul import SCALE_OFFSETS, random_weight
from ftlab.quant import QTYPES, quant_weight
from ftlab.testing.q4_0 import matmul_tolerance as q4_0_matmul_tolerance
from ftlab.testing.quant_matmul import quant_matmul_tolerance

ROTATE_BYTES = 256 << 20
SCALE_OFFSETS = {**SCALE_OFFSETS, "Q4_0": (0,)}


def weight(qtype: str, n: int, k: int, dev: torch.device):
    if qtype != "Q4_0":
        return random_weight(qtype, n, k, dev)
    qt = QTYPES[qtype]
    gen = torch.Generator(device=dev).manual_seed(0)
    data = torch.randint(0, 256, (n, qt.row_bytes(k)), dtype=torch.uint8, device=dev, generator=gen)
    blocks = data.view(-1, qt.nbytes)
    scale = (torch.rand(blocks.shape[0], device=dev, generator=gen) * 9e-3 + 1e-3).half()
    blocks[:, 0:2] = scale.view(torch.uint8).view(-1, 2)
    return quant_weight(data, (n, k), qtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_0,Q8_0,Q4_K,Q5_K,Q6_K")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=14336)
    args = ap.parse_args()
    dev = torch.device("cuda")
    info = device_info()
    bw = copy_bandwidth()
    print(
        f"# {info.get('name')} ({info.get('arch')}), torch {info.get('torch')}, triton "
        f"{info.get('triton')}, ftlab {info.get('commit')}; copy bandwidth {bw:.0f} GB/s; M = 1, "
        f"bf16 x, graph-replayed, {args.n} x {args.k}"
    )
    for qtype in args.types.split(","):
        time_type(qtype, args.n, args.k, bw, dev)


def time_type(qtype: str, n: int, k: int, bw: float, dev: torch.device) -> None:
    w = weight(qtype, n, k, dev)
    reps = max(1, min(32, -(-ROTATE_BYTES // w.nbytes)))
    banks = [w] + [quant_weight(w.data.clone(), w.shape, qtype) for _ in range(reps - 1)]
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    if qtype == "Q4_0":
        exact = ops.q4_0_matmul(x, w, backend="reference", path="int8").float().cpu()
        bound = q4_0_matmul_tolerance(x, w.to("cpu"), "int8", x.dtype)
    else:
        exact, bound = quant_matmul_tolerance(x.float(), w, "int8", x.dtype)
    op = ops.q4_0_matmul if qtype == "Q4_0" else ops.quant_matmul
    inner = reps * -(-8 // reps)
    for backend in ("hip", "triton"):

        def fn(wv, b=backend):
            return op(x, wv, backend=b, path="int8")

        y = fn(w).float()
        ok = bool(((y - exact.to(dev)).abs() <= bound.to(dev)).all())
        turn = iter(range(1 << 62))
        t_dram = time_graph_us(lambda f=fn, tn=turn: f(banks[next(tn) % reps]), inner=inner)
        t_l2 = time_graph_us(lambda f=fn: f(w), inner=inner)
        print(
            f"{qtype} {backend:>6}: cycled {t_dram:7.2f} us "
            f"({100 * w.nbytes / t_dram / 1e3 / bw:5.1f}% of copy), "
            f"one weight {t_l2:7.2f} us  {'ok' if ok else 'WRONG'}",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""hip's Q4_0 matvec paths side by side at M <= 4 (bf16 x, graph-replayed; weights cycled past the
L2 / one weight called again and again), each checked against the int8 reference within its bound:

- ``dispatch``: what ``ops.q4_0_matmul(backend="hip", path="int8")`` takes for the shape;
- ``quantize+fused_q8``: ``quantize_q8_1`` launched first, then the fused (region) matvec given
  x's Q8_1 (``q4_0_mv_fused_q8``);
- ``fused (quantizes)``: the one-launch fused matvec, every block quantizing all of x.

    python benchmarks/matvec_fused_paths.py
"""

from __future__ import annotations

import torch
from time_matvec_resident import weight

from ftlab import jit, ops
from ftlab.bench.harness import copy_bandwidth, time_graph_us
from ftlab.hip.q4_0 import quantize_q8_1
from ftlab.quant import quant_weight
from ftlab.testing.q4_0 import matmul_tolerance

SHAPES = (
    (1, 4096, 14336),
    (1, 4096, 8192),
    (1, 2048, 4096),
    (1, 14336, 4096),
    (1, 5120, 2048),
    (1, 2048, 2048),
    (2, 4096, 8192),
    (4, 4096, 4096),
    (2, 5120, 2048),
    (4, 5120, 2048),
    (1, 151936, 2048),
)


def main() -> None:
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.0f} GB/s")
    mod = jit.module_for("q4_0", dev)
    for m, n, k in SHAPES:
        w = weight("Q4_0", n, k, dev)
        reps = max(1, min(32, -(-(256 << 20) // w.nbytes)))
        banks = [w] + [quant_weight(w.data.clone(), w.shape, "Q4_0") for _ in range(reps - 1)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        exact = ops.q4_0_matmul(x, w, backend="reference", path="int8").float()
        bound = matmul_tolerance(x, w.to("cpu"), "int8", x.dtype).to(dev)

        def dispatch(wv, x=x):
            return ops.q4_0_matmul(x, wv, backend="hip", path="int8", validate=False)

        def fused_q8(wv, x=x, m=m, n=n):
            x8 = quantize_q8_1(x)
            y = x.new_empty((m, n))
            mod.q4_0_mv_fused_q8(wv.data, x8.q, x8.d, x8.s, y)
            return y

        def fused(wv, x=x, m=m, n=n):
            y = x.new_empty((m, n))
            mod.q4_0_mv_fused(wv.data, x, y)
            return y

        inner = reps * -(-8 // reps)
        for name, fn in (
            ("dispatch", dispatch),
            ("quantize+fused_q8", fused_q8),
            ("fused (quantizes)", fused),
        ):
            try:
                y = fn(w).float()
            except Exception as e:
                print(f"M={m} {n}x{k} {name}: {type(e).__name__}: {e}")
                continue
            ok = bool(((y - exact).abs() <= bound).all())
            turn = iter(range(1 << 62))
            t_dram = time_graph_us(
                lambda f=fn, tn=turn, b=banks, r=reps: f(b[next(tn) % r]), inner=inner
            )
            t_l2 = time_graph_us(lambda f=fn, w=w: f(w), inner=inner)
            print(
                f"M={m} {n}x{k} {name:>20}: cycled {t_dram:7.2f} us "
                f"({100 * w.nbytes / t_dram / 1e3 / bw:5.1f}% "
                f"of copy), one weight {t_l2:7.2f} us  {'ok' if ok else 'WRONG'}",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""Kernel times inside ``ops.fused_moe`` (router, align, grouped GEMMs, combine) at the
Qwen3-30B-A3B layer with bf16 banks, hip beside Triton, T = 32 and 512: eight calls on fresh
tokens and logits under torch.profiler, the table of CUDA kernels by total time.

    python benchmarks/profile_fused_moe.py
"""

import torch
from torch.profiler import ProfilerActivity, profile

from ftlab import ops
from ftlab.bench.moe import EXPERTS, HIDDEN, TOP_K, make_banks


def main() -> None:
    dev = torch.device("cuda")
    gu, dn = make_banks(False, dev)
    for t in (32, 512):
        xs = [torch.randn(t, HIDDEN, device=dev, dtype=torch.bfloat16) for _ in range(8)]
        lg = [torch.randn(t, EXPERTS, device=dev) for _ in range(8)]
        for name in ("hip", "triton"):
            for i in range(8):
                ops.fused_moe(xs[i], lg[i], gu, dn, TOP_K, backend=name)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                for i in range(8):
                    ops.fused_moe(xs[i], lg[i], gu, dn, TOP_K, backend=name)
                torch.cuda.synchronize()
            print(f"== T={t} {name}")
            print(
                p.key_averages().table(
                    sort_by="cuda_time_total", row_limit=12, max_name_column_width=70
                )
            )


if __name__ == "__main__":
    main()

"""``ftlab bench index_store``: KV-cache store and row gather, every backend beside torch.

Cases (bf16 rows of 1024 = 8 KV heads x 128, a 1M-slot cache):
- decode: 64 rows (one decode step of a 64-sequence batch),
- prefill: 8192 rows,
- large scatter: 65536 rows (128 MiB per tensor) at random unique slots.
Torch baselines: ``cache.index_copy_(0, slots, k)`` (store, once for k and once for v)
and ``weights[indices]`` (index). Bytes counted: each row read once and written once.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from ftlab import ops
from ftlab.bench.harness import Measurement, Report, gpu_backends, time_graph_us, time_us

NOTES = [
    "eager: per-call time of back-to-back calls from Python (host launch cost included); "
    "graph: the same calls replayed from a captured CUDA/HIP graph (device time, as a captured "
    "decode step pays).",
    "Bytes: every row read once and written once (store: k and v). Cases that fit in L2 (decode "
    "128 KiB, prefill 16 MiB per tensor) are replayed on the same inputs and can exceed the DRAM "
    "copy bandwidth; the large scatter (128 MiB per tensor, 2 GiB caches) is the DRAM-bound case.",
]
SLOTS = 1 << 20
D = 1024
CASES = {"decode": 64, "prefill": 8192, "large scatter": 65536}


def run(quick: bool = False) -> Report:
    torch.manual_seed(0)
    report = Report.for_device("index_store", NOTES)
    kc = torch.zeros(SLOTS, D, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    names = gpu_backends("store")
    for case, length in tqdm(list(CASES.items()), desc="index_store", unit="case"):
        _bench_case(report, kc, vc, case, length, names, reps=10 if quick else 50)
    return report


def _bench_case(
    report: Report, kc, vc, case: str, length: int, names: list[str], reps: int
) -> None:
    dev = kc.device
    slots = torch.randperm(SLOTS, device=dev)[:length]
    k = torch.randn(length, D, dtype=kc.dtype, device=dev)
    v = torch.randn(length, D, dtype=kc.dtype, device=dev)
    row_bytes = length * D * kc.element_size()
    inner = 20 if length <= 64 else 2  # decode-size launches are too short to time one by one

    def measure(label: str, backend: str, fn, nbytes: int, ok: bool) -> None:
        for mode, t in (
            ("eager", time_us(fn, reps=reps, inner=inner)),
            ("graph", time_graph_us(fn, inner=inner, reps=reps)),
        ):
            report.measurements.append(Measurement(label, backend, t, nbytes, ok, mode))

    # store: check each backend's result (it must equal torch's index_copy_), then time
    label = f"store {case} L={length} D={D}"
    for name in names:
        kc.zero_()
        vc.zero_()
        ops.store(kc, vc, slots, k, v, backend=name)
        ok = (
            torch.equal(kc[slots], k)
            and torch.equal(vc[slots], v)
            and int(kc.any(1).sum()) <= length
        )
        measure(
            label,
            name,
            lambda n=name: ops.store(kc, vc, slots, k, v, check=False, backend=n),
            4 * row_bytes,
            ok,
        )
    measure(
        label,
        "torch: index_copy_ x2",
        lambda: (kc.index_copy_(0, slots, k), vc.index_copy_(0, slots, v)),
        4 * row_bytes,
        True,
    )

    # index: gather the same rows back out of the cache
    expected = kc[slots]
    out = torch.empty_like(expected)
    label = f"index {case} L={length} D={D}"
    for name in names:
        out.fill_(float("nan"))
        ok = torch.equal(ops.index(kc, slots, out=out, backend=name), expected)
        measure(
            label,
            name,
            lambda n=name: ops.index(kc, slots, out=out, check=False, backend=n),
            2 * row_bytes,
            ok,
        )
    measure(label, "torch: weights[indices]", lambda: kc[slots], 2 * row_bytes, True)

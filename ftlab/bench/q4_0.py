"""``ftlab bench q4_0``: Q4_0 matmul at Qwen3-30B-A3B decode shapes (M = 1) and prefill
(M = 512), every backend beside torch baselines, bf16 activations.

Baselines: ``dequantize + matmul`` (ftlab's fastest dequantize, then torch.matmul) and
``fp16 matmul`` on the unquantized fp16 weight. Bandwidth counts weight bytes only
(N * K / 32 * 18 for Q4_0, 2 * N * K for fp16) against the device-to-device copy
bandwidth of the same run.

Weights are rotated: a shape whose weights fit in L2 gets several copies, one per call in
the captured graph, so every call reads DRAM (the "hot" row of the llama.cpp shape reuses
one copy, as a benchmark loop over the same tensors does).
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from ftlab import backends, ops
from ftlab.bench.harness import Measurement, Report, gpu_backends, rotation, time_graph_us
from ftlab.quant import Q4_0Weight

SHAPES = {  # name: (N, K)
    "q_proj 2048->4096": (4096, 2048),
    "k/v_proj 2048->512": (512, 2048),
    "o_proj 4096->2048": (2048, 4096),
    "expert gate/up 2048->768": (768, 2048),
    "expert down 768->2048": (2048, 768),
    "lm_head 2048->151936": (151936, 2048),
    "llama.cpp 4096x14336": (4096, 14336),
}

NOTES = [
    "graph mode: calls replayed from a captured CUDA graph (device time). Weight GB/s counts "
    "only the packed weight bytes read.",
    "int8 path = Q8_1 quantize of the activations + int8-dot kernel (both timed). Triton's "
    "M = 512 row is its dequant-tile tl.dot GEMM; HIP's is the dp4a-tiled GEMM.",
]


def run(quick: bool = False) -> Report:
    report = Report.for_device("q4_0", NOTES)
    names = gpu_backends("q4_0_matmul")
    for label, (n, k) in tqdm(list(SHAPES.items()), desc="q4_0", unit="shape"):
        _bench_shape(report, label, n, k, names, (1,) if quick else (1, 512))
        torch.cuda.empty_cache()
    return report


def _bench_shape(
    report: Report, label: str, n: int, k: int, names: list[str], ms: tuple[int, ...]
) -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    w16 = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
    wq = ops.quantize_q4_0(w16)
    copies = rotation(wq.nbytes)[0]
    banks = [wq] + [Q4_0Weight(wq.data.clone(), wq.shape) for _ in range(copies - 1)]
    for m in ms:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        _bench_rows(
            report, f"{label} M={m}", x, w16, banks, names, hot=label.startswith("llama") and m == 1
        )


def _bench_rows(
    report: Report, case: str, x, w16, banks: list[Q4_0Weight], names: list[str], hot: bool
) -> None:
    wq, reps = banks[0], len(banks)
    flops = 2 * x.shape[0] * w16.shape[0] * w16.shape[1]

    def add(backend: str, fn, inner: int, nbytes: int = wq.nbytes, ok: bool = True) -> None:
        t = time_graph_us(fn, inner=inner)
        report.measurements.append(Measurement(case, backend, t, nbytes, ok, "graph", flops))

    for name in names:
        ok = _validate(x, wq, name)
        turn = iter(range(1 << 62))  # each captured call reads the next copy of the weights
        add(
            name,
            lambda nm=name, t=turn: ops.q4_0_matmul(x, banks[next(t) % reps], backend=nm),
            rotation(wq.nbytes)[1],
            ok=ok,
        )
        if hot:
            add(f"{name} (hot L2)", lambda nm=name: ops.q4_0_matmul(x, wq, backend=nm), 20, ok=ok)
    deq = names[0] if names else "reference"
    add(
        f"torch: dequantize ({deq}) + matmul",
        lambda: x @ ops.dequantize_q4_0(wq, torch.bfloat16, backend=deq).T,
        2,
    )
    add("torch: bf16 matmul, unquantized", lambda: x @ w16.T, 2, nbytes=w16.numel() * 2)


def _validate(x: torch.Tensor, w: Q4_0Weight, backend: str) -> bool:
    """The backend's output against the reference of the same path, computed on the GPU:
    int8 must agree to fp32 rounding, dequant to bf16 rounding of the weights."""
    path = backends.resolve_path("q4_0_matmul", backend, x.device, x.dtype, x.shape[0])[1]
    # fp32 activations, so that no bf16 output rounding hides or fakes a difference; at most
    # 64 rows of the reference's int8 einsum ([M, N, K/32] doubles)
    xf = x.float()
    got = ops.q4_0_matmul(xf, w, path=path, backend=backend)[:64]
    want = ops.q4_0_matmul(xf[:64], w, path=path, backend="reference")
    rel = float((got - want).norm() / want.norm().clamp(min=1e-30))
    return rel < (1e-5 if path == "int8" else 1e-2)

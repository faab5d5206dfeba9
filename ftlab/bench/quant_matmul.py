"""``ftlab bench quant_matmul``: GGUF Q8_0 / Q4_K / Q5_K / Q6_K at Qwen3-30B-A3B shapes --
dequantize, the int8 matvec at M = 1 and 8 (decode) and the prefill matmul at M = 512 -- every
backend, bf16 activations.

Bandwidth: the matmuls count the packed weight bytes read; dequantize counts the packed bytes
read plus the bf16 values written. Both against the device-to-device copy bandwidth measured
in the same run. Weights are random bytes with small ordinary fp16 scales; shapes whose
weights fit in L2 are rotated over several copies, one per captured call, so every call
reads DRAM.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from ftlab import backends, ops
from ftlab.bench.harness import Measurement, Report, gpu_backends, rotation, time_graph_us
from ftlab.quant import QTYPES, QuantWeight, quant_weight

SHAPES = {  # name: (N, K)
    "qkv 2048->5120": (5120, 2048),
    "o_proj 4096->2048": (2048, 4096),
    "lm_head 2048->151936": (151936, 2048),
    "llama.cpp 4096x14336": (4096, 14336),
}
TYPES = ("Q8_0", "Q4_K", "Q5_K", "Q6_K")
SCALE_OFFSETS = {"Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q4_0": (0,)}
VALIDATE_ROWS = 4096  # weight rows the validation compares (the int8 reference is an einsum)

NOTES = [
    "graph mode: calls replayed from a captured CUDA graph (device time).",
    "matmul GB/s counts only the packed weight bytes read; dequantize GB/s the packed bytes read "
    "plus the bf16 values written.",
    "int8 path = Q8_1 quantize of the activations + int8-dot matvec (both timed). M = 512: "
    "Triton's dequant-tile tl.dot GEMM; HIP's dp4a-tiled GEMM.",
]


def random_weight(qtype: str, n: int, k: int, dev: torch.device, seed: int = 0) -> QuantWeight:
    """``[N, K]`` of random ``qtype`` blocks on ``dev`` with fp16 scales in [1e-3, 1e-2)."""
    qt = QTYPES[qtype]
    gen = torch.Generator(device=dev).manual_seed(seed)
    data = torch.randint(0, 256, (n, qt.row_bytes(k)), dtype=torch.uint8, device=dev, generator=gen)
    blocks = data.view(-1, qt.nbytes)
    for off in SCALE_OFFSETS[qtype]:
        scale = (torch.rand(blocks.shape[0], device=dev, generator=gen) * 9e-3 + 1e-3).half()
        blocks[:, off : off + 2] = scale.view(torch.uint8).view(-1, 2)
    return quant_weight(data, (n, k), qtype)


def run(quick: bool = False) -> Report:
    report = Report.for_device("quant", NOTES)
    names = gpu_backends("quant_matmul")
    deq = gpu_backends("dequantize")
    cases = [(t, s) for t in TYPES for s in SHAPES]
    for qtype, label in tqdm(cases, desc="quant", unit="case"):
        n, k = SHAPES[label]
        _bench_case(report, qtype, label, n, k, names, deq, (1,) if quick else (1, 8, 512))
        torch.cuda.empty_cache()
    return report


def _timed(
    report: Report, case: str, backend: str, fn, inner: int, nbytes: int, ok: bool, flops: int
) -> None:
    t = time_graph_us(fn, inner=inner)
    report.measurements.append(Measurement(case, backend, t, nbytes, ok, "graph", flops))


def _bench_case(
    report: Report,
    qtype: str,
    label: str,
    n: int,
    k: int,
    names: list[str],
    deq: list[str],
    ms: tuple[int, ...],
) -> None:
    dev = torch.device("cuda")
    w = random_weight(qtype, n, k, dev)
    reps, inner = rotation(w.nbytes)
    banks = [w] + [QuantWeight(w.data.clone(), w.shape, qtype) for _ in range(reps - 1)]
    for name in deq:
        turn = iter(range(1 << 62))
        _timed(
            report,
            f"{qtype} {label} dequantize",
            name,
            lambda nm=name, t=turn: ops.dequantize(
                banks[next(t) % reps], torch.bfloat16, backend=nm
            ),
            inner,
            w.nbytes + 2 * n * k,
            True,
            0,
        )
    for m in ms:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        for name in names:
            ok = _validate(x, w, name)
            turn = iter(range(1 << 62))
            _timed(
                report,
                f"{qtype} {label} M={m}",
                name,
                lambda nm=name, t=turn, x=x: ops.quant_matmul(x, banks[next(t) % reps], backend=nm),
                inner,
                w.nbytes,
                ok,
                2 * m * n * k,
            )


def _validate(x: torch.Tensor, w: QuantWeight, backend: str) -> bool:
    """The backend's output against the reference of the path it takes, on the first
    ``VALIDATE_ROWS`` weight rows and 8 activation rows, fp32 activations: int8 agrees to fp32
    rounding, dequant to bf16 rounding of the weights."""
    path = backends.resolve_path("quant_matmul", backend, x.device, x.dtype, x.shape[0])[1]
    n = min(w.shape[0], VALIDATE_ROWS)
    part = QuantWeight(w.data[:n], (n, w.shape[1]), w.qtype)
    xf = x[:8].float()
    got = ops.quant_matmul(xf, part, path=path, backend=backend)
    want = ops.quant_matmul(xf, part, path=path, backend="reference")
    rel = float((got - want).norm() / want.norm().clamp(min=1e-30))
    return rel < (1e-5 if path == "int8" else 1e-2)

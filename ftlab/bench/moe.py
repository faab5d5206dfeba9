"""``ftlab bench moe``: one Qwen3-30B-A3B MoE layer (H = 2048, I = 768, E = 128, top-8) --
router + experts + combine, ``ops.fused_moe`` -- for T in {1, 4, 32, 512} tokens, with
dense bf16 and Q4_0 expert banks, every backend beside a torch baseline.

The torch baseline loops over the experts that have tokens: ``index_select`` of their
tokens, the gate/up and down matmuls (Q4_0 banks dequantized per expert first, with
ftlab's fastest dequantize), ``index_add_`` of the weighted result. It synchronizes with
the host (which experts have tokens), so it is timed eagerly; the ftlab backends are timed
as calls replayed from a captured graph (device time).

Bytes count the weights of the experts a call uses (3 matrices each), against the copy
bandwidth of the same run. Every captured call routes a fresh batch of tokens (its own
random logits): at T = 1 its 8 experts are rarely the previous call's, so weights come from
DRAM as in a real decode step, where every layer has its own experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ftlab import backends, ops
from ftlab.bench.harness import Measurement, Report, gpu_backends, time_graph_us, time_us
from ftlab.quant import Q4_0Weight

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8
TOKENS = (1, 4, 32, 512)
INNER = 16  # captured calls per graph, each with its own tokens and routing

NOTES = [
    "graph mode: calls replayed from a captured CUDA graph (device time): router, experts "
    "and combine. eager: the torch baseline, host launches and synchronization included.",
    "GB/s counts the weight bytes of the experts used by the call (gate, up, down).",
    "Q4_0 banks: the decode rows (T <= 8) take the int8 path (Q8_1 activations); at T > 8 "
    "Triton takes the dequant-tile grouped GEMM, HIP the dp4a grouped GEMM on Q8_1 rows.",
]


def expert_bytes(q4: bool) -> int:
    """Bytes of one expert's three matrices."""
    elems = 3 * INTER * HIDDEN
    return elems // 32 * 18 if q4 else elems * 2


def make_banks(q4: bool, device: torch.device):
    """Random expert banks ``w_gate_up [E, 2I, H]``, ``w_down [E, H, I]``: bf16, or Q4_0."""
    gen = torch.Generator(device=device).manual_seed(0)
    gu = (
        torch.randn(EXPERTS, 2 * INTER, HIDDEN, device=device, generator=gen, dtype=torch.bfloat16)
        * HIDDEN**-0.5
    )
    dn = (
        torch.randn(EXPERTS, HIDDEN, INTER, device=device, generator=gen, dtype=torch.bfloat16)
        * INTER**-0.5
    )
    if q4:
        return ops.quantize_q4_0(gu), ops.quantize_q4_0(dn)
    return gu, dn


def torch_moe(x, logits, w_gate_up, w_down, top_k: int, dequant_backend: str = "auto"):
    """The torch baseline: a loop over the experts that have tokens."""
    probs = torch.softmax(logits.float(), -1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        gu, dn = w_gate_up[e], w_down[e]
        if isinstance(gu, Q4_0Weight):
            gu = ops.dequantize_q4_0(gu, x.dtype, backend=dequant_backend)
            dn = ops.dequantize_q4_0(dn, x.dtype, backend=dequant_backend)
        xe = x.index_select(0, tok)
        g_u = xe @ gu.T
        h = F.silu(g_u[:, :INTER]) * g_u[:, INTER:]
        out.index_add_(0, tok, (h @ dn.T).float() * weights[tok, slot, None])
    return out.to(x.dtype)


def run(quick: bool = False) -> Report:
    dev = torch.device("cuda")
    report = Report.for_device("moe", NOTES)
    names = gpu_backends("moe_experts")
    tokens = (1, 512) if quick else TOKENS
    for q4 in (True, False):
        w_gate_up, w_down = make_banks(q4, dev)
        for t in tqdm(tokens, desc=f"moe {'Q4_0' if q4 else 'bf16'}", unit="T"):
            _bench_tokens(report, t, q4, w_gate_up, w_down, names)
        del w_gate_up, w_down
        torch.cuda.empty_cache()
    _targets(report)
    return report


def _bench_tokens(report: Report, t: int, q4: bool, w_gate_up, w_down, names: list[str]) -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(t)
    xs = [
        torch.randn(t, HIDDEN, device=dev, generator=gen, dtype=torch.bfloat16)
        for _ in range(INNER)
    ]
    logits = [torch.randn(t, EXPERTS, device=dev, generator=gen) for _ in range(INNER)]
    used = sum(len(torch.topk(lg, TOP_K, -1).indices.unique()) for lg in logits) / INNER
    nbytes = int(used * expert_bytes(q4))
    case = f"T={t} {'Q4_0' if q4 else 'bf16'}"
    flops = 2 * t * TOP_K * 3 * INTER * HIDDEN
    for name in names:
        ok = _validate(xs[0], logits[0], w_gate_up, w_down, name)
        turn = iter(range(1 << 62))

        def call(nm=name, it=turn):
            i = next(it) % INNER
            return ops.fused_moe(xs[i], logits[i], w_gate_up, w_down, TOP_K, backend=nm)

        report.measurements.append(
            Measurement(case, name, time_graph_us(call, inner=INNER), nbytes, ok, "graph", flops)
        )
    deq = names[0] if names else "reference"
    i = iter(range(1 << 62))
    base = time_us(
        lambda: torch_moe(xs[next(i) % INNER], logits[0], w_gate_up, w_down, TOP_K, deq),
        warmup=3,
        reps=10 if t >= 32 else 30,
    )
    label = f"torch: loop over experts{f' + dequantize ({deq})' if q4 else ''}"
    report.measurements.append(Measurement(case, label, base, nbytes, True, "eager", flops))


def _validate(x, logits, w_gate_up, w_down, backend: str) -> bool:
    """The backend's fused_moe against the reference of the same path, on the first tokens
    (experts are per token, so a prefix of the batch is a valid check): relative error of
    fp32 sums (int8) or of bf16 operand rounding (dequant, dense)."""
    q4 = isinstance(w_gate_up, Q4_0Weight)
    path = (
        backends.resolve_path("moe_experts", backend, x.device, x.dtype, x.shape[0])[1]
        if q4
        else "dequant"
    )
    got = ops.fused_moe(x, logits, w_gate_up, w_down, TOP_K, path=path, backend=backend)[:8].float()
    want = ops.fused_moe(
        x[:8].float(), logits[:8], w_gate_up, w_down, TOP_K, path=path, backend="reference"
    )
    rel = float((got - want).norm() / want.norm().clamp(min=1e-30))
    return rel < (1e-2 if path == "int8" else 2e-2)


def _targets(report: Report) -> None:
    """Notes: the T = 1 Q4_0 bound (2 x bytes / copy + 15 us) and the T = 512 speedups."""
    rows = {(m.case, m.backend): m for m in report.measurements}
    for (case, backend), m in rows.items():
        if case == "T=1 Q4_0" and m.mode == "graph":
            bound = 2 * m.bytes_moved / (report.copy_gbps * 1e3) + 15
            verdict = "within" if m.time_us <= bound else "over"
            report.notes.append(
                f"T=1 Q4_0 {backend}: {m.time_us:.1f} us, {verdict} the bound 2 x "
                f"{m.bytes_moved / 1e6:.1f} MB "
                f"/ {report.copy_gbps:.0f} GB/s + 15 us = {bound:.1f} us"
            )
        if case.startswith("T=512") and m.mode == "graph":
            base = next(
                (b for (c, n), b in rows.items() if c == case and n.startswith("torch")), None
            )
            if base:
                report.notes.append(
                    f"{case} {backend}: {base.time_us / m.time_us:.1f}x the torch baseline"
                )

"""``ftlab bench gated_delta_rule``: the gated delta rule at Qwen3-Next's linear-attention shape (16
key / 32 value heads of 128, bf16), prefill at T = 512 ... 65536 (one sequence) and decode (one
token, batch 1 and 32), every backend beside fla's kernels when ``fla`` is importable.

Prefill is timed twice for every row, ftlab's and fla's alike: on the GPU's clock (mode "graph":
one call captured in a CUDA/HIP graph and replayed, warm caches; where a call cannot be captured,
"events": device events around calls launched back to back, so the queue stays full), and as the
eager wall time of one call from the host (mode "eager wall": host launches, Python and scratch
allocation included, what a call costs its caller) -- a separate, labelled row, never the
comparison. Bytes count q, k, v, g, beta read and o written. Decode is replayed from a captured
graph, each call on the next of several state copies so that the state comes from DRAM; bytes
count the fp32 state read and written (the tokens are negligible) against the copy bandwidth of
the same run.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from ftlab import backends, ops
from ftlab.bench.harness import (
    Measurement,
    Report,
    copy_bandwidth,
    device_info,
    require_gpu,
    time_graph_us,
    time_us,
    wall_us,
)

HK, HV, D = 16, 32, 128
PREFILL_T = (512, 4096, 16384, 32768, 65536)
DECODE_B = (1, 32)
ROTATE_BYTES = 512 << 20  # decode states rotated until one graph reads many times L2

NOTES = [
    "prefill: every row twice -- 'graph' (or 'events'): the GPU's clock, a captured call replayed "
    "(calls launched back to back where it cannot be captured); 'eager wall': one call on the "
    "host's clock, launches and scratch allocation included. GB/s counts q, k, v, g, "
    "beta read and o written. Triton runs the chunked form (chunks of 64); HIP the chunked "
    "form on the matrix cores (its default for bf16), and as 'hip scan' the token-by-token scan. "
    "Rows '<backend> bf16': precision='bf16', each fp32 operand of a product rounded to bf16 once "
    "(fla's precision; checked, as fla is, to 1e-2 of the state).",
    "decode: graph mode, the state (fp32 [B, 32, 128, 128]) rotated over copies so that it is "
    "read from DRAM; GB/s counts the state read and written.",
    "fla: fla-org/flash-linear-attention's chunk_gated_delta_rule / "
    "fused_recurrent_gated_delta_rule with the L2 norm in the kernel, when importable.",
]


def _fla():
    """fla's (chunk, fused_recurrent) gated delta rule functions, or None."""
    try:
        from fla.ops.gated_delta_rule import (
            chunk_gated_delta_rule,
            fused_recurrent_gated_delta_rule,
        )
    except ImportError:
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def _inputs(b: int, t: int, dev: torch.device):
    gen = torch.Generator(device=dev).manual_seed(t + b)
    q = torch.randn(b, t, HK, D, device=dev, generator=gen, dtype=torch.bfloat16)
    k = torch.randn(b, t, HK, D, device=dev, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(b, t, HV, D, device=dev, generator=gen, dtype=torch.bfloat16)
    g = -torch.nn.functional.softplus(torch.randn(b, t, HV, device=dev, generator=gen))
    beta = torch.sigmoid(torch.randn(b, t, HV, device=dev, generator=gen)).to(torch.bfloat16)
    return q, k, v, g, beta


def _close(got: torch.Tensor, want: torch.Tensor, limit: float) -> bool:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-30)) < limit


def run(quick: bool = False) -> Report:
    require_gpu()
    dev = torch.device("cuda")
    report = Report("gated_delta_rule", device_info(), copy_bandwidth(), notes=NOTES)
    fla = _fla()
    names = [
        n
        for n in ("hip", "triton")
        if n in backends.available_backends("gated_delta_rule", dev, torch.bfloat16)
    ]
    for t in tqdm(PREFILL_T[:2] if quick else PREFILL_T, desc="gated_delta_rule prefill", unit="T"):
        _prefill(report, t, names, fla, dev)
        torch.cuda.empty_cache()
    for b in DECODE_B:
        _decode(report, b, names, fla, dev)
        torch.cuda.empty_cache()
    return report


def _prefill(report: Report, t: int, names: list[str], fla, dev: torch.device) -> None:
    q, k, v, g, beta = _inputs(1, t, dev)
    nbytes = (
        sum(x.numel() * x.element_size() for x in (q, k, v, g, beta)) + v.numel() * v.element_size()
    )
    want_o, want_s = ops.gated_delta_rule(q, k, v, g, beta, backend="reference")
    case = f"prefill T={t}"
    reps = 3 if t > 4096 else 10
    # (backend, precision, label, the state's relative error allowed: fla's for bf16 operands)
    rows = [(n, "fp32", n, 1e-4) for n in names] + [(n, "bf16", f"{n} bf16", 1e-2) for n in names]
    for name, precision, label, s_limit in rows:
        o, s = ops.gated_delta_rule(q, k, v, g, beta, precision=precision, backend=name)
        ok = _close(o, want_o, 1e-2) and _close(s, want_s, s_limit)
        timed_rows(
            report,
            case,
            label,
            lambda nm=name, p=precision: ops.gated_delta_rule(
                q, k, v, g, beta, precision=p, backend=nm
            ),
            nbytes,
            ok,
            reps,
        )
    # HIP's token-by-token scan, asked for by its method ("hip" is the chunked form here)
    if "hip" in names:
        from ftlab.hip import gated_delta_rule as hip_dn

        gf, bf = g.float(), beta.float()

        def hip_scan():
            return hip_dn.gated_delta_rule(q, k, v, gf, bf, None, D**-0.5, True, 64, variant="scan")

        o, s = hip_scan()
        ok = _close(o, want_o, 1e-2) and _close(s, want_s, 1e-4)
        timed_rows(report, case, "hip scan", hip_scan, nbytes, ok, reps)
    if fla is not None:
        chunk = fla[0]
        rep = HV // HK
        for label, qq, kk in (
            ("fla chunk_gated_delta_rule", q, k),
            (
                "fla chunk_gated_delta_rule (q, k repeated)",
                q.repeat_interleave(rep, 2),
                k.repeat_interleave(rep, 2),
            ),
        ):

            def call(qq=qq, kk=kk):
                return chunk(
                    qq,
                    kk,
                    v,
                    g,
                    beta,
                    scale=D**-0.5,
                    output_final_state=True,
                    use_qk_l2norm_in_kernel=True,
                )

            try:
                o, s = call()
                ok = _close(o, want_o, 1e-2) and _close(s, want_s, 1e-2)
            except Exception as e:  # an fla version without grouped value heads, say
                report.notes.append(f"{label} at T={t} failed: {type(e).__name__}: {e}"[:300])
            else:
                timed_rows(report, case, label, call, nbytes, ok, reps)
                break


def device_time_us(fn, reps: int) -> tuple[float, str]:
    """``fn``'s time on the GPU's clock and how it was taken: ("graph") one call captured and
    replayed; ("events") where capture fails, calls launched back to back between device
    events (the host ahead of the GPU once the queue fills)."""
    try:
        return time_graph_us(fn, inner=1, reps=reps), "graph"
    except Exception:  # a call that synchronizes with the host, or that a capture refuses
        torch.cuda.synchronize()
        return time_us(fn, warmup=2, reps=reps, inner=4), "events"


def timed_rows(report: Report, case: str, label: str, fn, nbytes: int, ok: bool, reps: int) -> None:
    """Two rows of ``fn``: its device time (the comparison), then its eager wall time."""
    us, mode = device_time_us(fn, reps)
    report.measurements.append(Measurement(case, label, us, nbytes, ok, mode))
    wall = wall_us(fn, warmup=1, reps=reps)
    report.measurements.append(Measurement(case, label, wall, nbytes, ok, "eager wall"))


def _decode(report: Report, b: int, names: list[str], fla, dev: torch.device) -> None:
    q, k, v, g, beta = (x[:, 0] for x in _inputs(b, 1, dev))
    state_bytes = b * HV * D * D * 4
    copies = max(2, min(64, ROTATE_BYTES // state_bytes))
    states = [torch.randn(b, HV, D, D, device=dev) * 0.1 for _ in range(copies)]
    nbytes = 2 * state_bytes
    case = f"decode B={b}"
    start = states[0].clone()  # timing updates the copies in place: every check starts here
    want_s = start.clone()
    want_o = ops.gated_delta_step(q, k, v, g, beta, want_s, backend="reference")
    for name in names:
        s = start.clone()
        o = ops.gated_delta_step(q, k, v, g, beta, s, backend=name)
        ok = _close(o, want_o, 1e-2) and _close(s, want_s, 1e-5)
        turn = iter(range(1 << 62))  # each captured call advances the next state copy

        def step(nm=name, it=turn):
            return ops.gated_delta_step(q, k, v, g, beta, states[next(it) % copies], backend=nm)

        report.measurements.append(
            Measurement(case, name, time_graph_us(step, inner=copies), nbytes, ok, "graph")
        )
    if fla is not None:
        recurrent = fla[1]
        turn = iter(range(1 << 62))

        def call(it=turn):
            return recurrent(
                q[:, None],
                k[:, None],
                v[:, None],
                g=g[:, None],
                beta=beta[:, None],
                scale=D**-0.5,
                initial_state=states[next(it) % copies],
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )

        try:
            o, _ = recurrent(
                q[:, None],
                k[:, None],
                v[:, None],
                g=g[:, None],
                beta=beta[:, None],
                scale=D**-0.5,
                initial_state=start.clone(),
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )
            ok = _close(o[:, 0], want_o, 1e-2)
            us = time_graph_us(call, inner=copies)
        except Exception as e:
            report.notes.append(
                f"fla fused_recurrent_gated_delta_rule at B={b} failed: {type(e).__name__}: {e}"[
                    :300
                ]
            )
        else:
            report.measurements.append(
                Measurement(case, "fla fused_recurrent (new state)", us, nbytes, ok, "graph")
            )

"""The hybrid schedule as a timeline: what the GPU stream and the CPU do in each decode step, for
notebooks (``notebooks/04_graph_replay_moe.ipynb``).

:func:`trace` runs ``steps`` steps of an executor and returns spans ``(lane, label, start_us,
end_us)`` on one clock (microseconds from the first span):

- graph handshakes (on a GPU): the stream's phases are timed with CUDA events the handshake records
  through its ``mark`` hook around the submit (pack, D2H copy, signal), the GPU experts and the join
  (wait, H2D copy, combine); the CPU worker's phases come from its own steady-clock log (saw the
  step, computed it). The two clocks are aligned once per step through an event the host waits for,
  so the GPU spans are placed within some tens of microseconds (the synchronization's latency);
- eager (any device): each phase is timed on the host, with a synchronization after it.
"""

from __future__ import annotations

import time

import torch

Span = tuple[str, str, float, float]


def trace(
    executor,
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    steps: int = 3,
    warmup: int = 2,
) -> list[Span]:
    """Spans of ``steps`` decode steps of ``executor`` on (x, weights, ids), after ``warmup``
    untraced ones (the first steps after a pause pay for waking the CPU worker's OpenMP team)."""
    for _ in range(warmup):
        executor(x, weights, ids)
    _sync(x.device)
    executor.check()
    if executor.mechanism == "eager":
        return _trace_eager(executor, x, weights, ids, steps)
    return _trace_channel(executor, x, weights, ids, steps)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _trace_eager(ex, x, weights, ids, steps: int) -> list[Span]:
    from ftlab import ops

    spans: list[Span] = []
    clock = time.perf_counter_ns
    origin = clock()

    def span(lane: str, label: str, fn):
        t0 = clock()
        out = fn()
        _sync(x.device)
        spans.append((lane, label, (t0 - origin) / 1e3, (clock() - origin) / 1e3))
        return out

    for _ in range(steps):
        gpu_ids, cpu_ids = span("device stream", "split", lambda: ex.split(ids))
        xh, wh, ch = span(
            "copies", "to host", lambda cpu_ids=cpu_ids: (x.cpu(), weights.cpu(), cpu_ids.cpu())
        )
        y_cpu = span(
            "CPU",
            "CPU experts",
            lambda xh=xh, wh=wh, ch=ch: ops.moe_experts(
                xh, ex.host_gate_up, ex.host_down, wh, ch, path="int8", backend="cpu"
            ),
        )
        y_gpu = span(
            "device stream", "GPU experts", lambda gpu_ids=gpu_ids: ex.gpu_part(x, weights)(gpu_ids)
        )
        back = span("copies", "to device", lambda y_cpu=y_cpu: y_cpu.to(x.device))
        span("device stream", "sum", lambda y_gpu=y_gpu, back=back: y_gpu + back)
    return spans


def _trace_channel(ex, x, weights, ids, steps: int) -> list[Span]:
    hs = ex.handshake
    ch = hs.cpu.channel(x.shape[0], ids.shape[1])
    spans: list[Span] = []
    origin = None
    for _ in range(steps):
        anchor = torch.cuda.Event(enable_timing=True)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        anchor.record()
        torch.cuda.synchronize()
        host_anchor = int(hs.cpu.module.hs_now_ns())  # the anchor completed just before this
        hs(
            x,
            weights,
            ids,
            ex.table,
            ex.gpu_part(x, weights),
            mark=lambda i, events=events: events[i].record(),
        )
        torch.cuda.synchronize()
        at = [host_anchor + anchor.elapsed_time(e) * 1e6 for e in events]
        origin = at[0] if origin is None else origin
        us = [(t - origin) / 1e3 for t in at]
        spans += [
            ("device stream", "pack + D2H + signal", us[0], us[1]),
            ("device stream", "GPU experts", us[1], us[2]),
            ("device stream", "wait + H2D + combine", us[2], us[3]),
        ]
        step = int(ch.stats()["last_step"])
        row = next((r for r in ch.timeline().tolist() if r[0] == step and r[3] > 0), None)
        if row is not None:
            _, seen, start, end = row
            spans.append(("CPU", "picked up", (seen - origin) / 1e3, (start - origin) / 1e3 + 0.5))
            spans.append(("CPU", "CPU experts", (start - origin) / 1e3, (end - origin) / 1e3))
    ex.check()
    return spans


def plot(spans: list[Span], title: str = "", ax=None):
    """Draw the spans as a timeline (one row per lane) with matplotlib; returns the axes."""
    import matplotlib.pyplot as plt

    lanes = list(dict.fromkeys(lane for lane, *_ in spans))
    labels = list(dict.fromkeys(label for _, label, *_ in spans))
    colors = plt.get_cmap("tab10")
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.8 + 0.6 * len(lanes)))
    for lane, label, t0, t1 in spans:
        y = lanes.index(lane)
        ax.broken_barh(
            [(t0, max(t1 - t0, 0.5))], (y - 0.35, 0.7), color=colors(labels.index(label) % 10)
        )
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_xlabel("microseconds")
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors(i % 10)) for i in range(len(labels))]
    ax.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35),
        ncol=min(len(labels), 4),
        fontsize="small",
    )
    if title:
        ax.set_title(title)
    return ax

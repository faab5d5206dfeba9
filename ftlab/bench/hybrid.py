"""``ftlab bench hybrid``: the hybrid CPU/GPU MoE at one Qwen3-30B-A3B layer (H 2048, I 768, 128
experts top-8, Q4_0), with 100%, 50% and 25% of the experts resident on the GPU.

Measured:
- the CPU expert kernels (the ``cpu`` backend of ``moe_experts``, ``ftlab/cpu``) on the routes a
step sends to the CPU, their GB/s
  (expert weight bytes read) against this machine's memory copy bandwidth (``torch`` copy of
  512 MiB, bytes read + written), with the thread count in the notes;
- on a GPU: the decode step of ``HybridDecodeExecutor`` eager (split, synchronous CPU part, GPU
  part, sum) and replayed from a captured graph through each graph handshake (10 steps a graph,
  device time a step), and the CPU worker's mean job time as a share of the graph step.

At T = 1 the 8 routes of a step go to the CPU in proportion to the experts not resident:
0, 4 and 6 routes for 100%, 50% and 25% resident.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from ftlab.bench.harness import Measurement, Report, device_info, host_copy_gbps

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8
RESIDENT = (1.0, 0.5, 0.25)


def _validate(
    y: torch.Tensor,
    x: torch.Tensor,
    gu,
    dn,
    w: torch.Tensor,
    ids: torch.Tensor,
    gpu_ids: torch.Tensor | None = None,
) -> bool:
    """y against the reference's int8 path over all experts, within ``experts_tolerance`` (a
    hybrid step's, ``hybrid_tolerance`` with its GPU slot ids)."""
    import ftlab.testing as ft
    from ftlab import ops

    x, w, ids = x.cpu(), w.cpu(), ids.cpu()
    want = ops.moe_experts(x, gu, dn, w, ids, path="int8", backend="reference")
    if gpu_ids is None:
        bound = ft.experts_tolerance(x, gu, dn, w, ids, "int8", want)
    else:
        bound = ft.hybrid_tolerance(x, gu, dn, w, ids, gpu_ids, "int8", want)
    return bool(((y.cpu().float() - want.float()).abs() <= bound).all())


def _median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(quick: bool = False) -> Report:
    from ftlab import backends
    from ftlab.bench.model import random_q4_0

    copy = host_copy_gbps(512 << 20)
    report = Report(
        "hybrid",
        device_info(),
        copy,
        copy_what="host memory",
        notes=[
            "copy bandwidth: host memory (torch copy of 512 MiB, bytes read + written) -- the CPU "
            "part's limit.",
            f"CPU threads: {torch.get_num_threads()} "
            f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), "
            f"{os.cpu_count()} cores visible.",
            "cpu experts rows: the native CPU kernels on the routes of one token sent to the CPU "
            "(eager, wall clock); GB/s counts the Q4_0 bytes of those experts.",
        ],
    )
    gen = torch.Generator().manual_seed(0)
    cpu = torch.device("cpu")
    # the backend entry itself: the kernel's time, without ops' argument checks
    cpu_experts = backends.resolve("moe_experts", "cpu", cpu, torch.bfloat16).fn
    gu = random_q4_0((EXPERTS, 2 * INTER, HIDDEN), cpu, gen)
    dn = random_q4_0((EXPERTS, HIDDEN, INTER), cpu, gen)
    per_expert = (gu.nbytes + dn.nbytes) // EXPERTS
    x = torch.randn(1, HIDDEN, generator=gen).to(torch.bfloat16)
    w = torch.full((1, TOP_K), 1.0 / TOP_K)
    for resident in RESIDENT:
        routes = round(TOP_K * (1 - resident))
        if routes == 0:
            continue
        ids = torch.full((1, TOP_K), -1, dtype=torch.int32)

        def step(ids=ids, routes=routes):
            ids[0, :routes] = torch.randperm(EXPERTS, generator=gen)[:routes].to(torch.int32)
            return cpu_experts(x, gu, dn, w, ids, "int8")

        ok = _validate(step(), x, gu, dn, w, ids)
        t = _median_s(step, 5 if quick else 30)
        report.measurements.append(
            Measurement(
                f"T=1, {resident:.0%} resident: {routes} routes on the CPU",
                "cpu experts",
                t * 1e6,
                routes * per_expert,
                ok,
                "eager",
            )
        )
    if torch.cuda.is_available():
        _gpu_steps(report, gu, dn, quick)
    return report


def _route_ids(slots: int, routes: int, dev: torch.device) -> torch.Tensor:
    """[1, TOP_K] ids with ``routes`` of them on non-resident experts (resident: 0..slots-1)."""
    cpu = [slots + i for i in range(routes)]
    gpu = [(3 * i) % max(slots, 1) for i in range(TOP_K - routes)]
    return torch.tensor([cpu + gpu], dtype=torch.int32, device=dev)


def _gpu_steps(report: Report, gu, dn, quick: bool) -> None:
    """The executor's decode step on the GPU at each residency: eager (split, synchronous CPU
    part, GPU part, sum) and replayed from a captured graph through each graph handshake, with
    the CPU worker's mean job time and its share of the step."""
    from ftlab.bench.harness import time_graph_us
    from ftlab.hybrid import HybridDecodeExecutor

    dev = torch.device("cuda")
    x = torch.randn(1, HIDDEN, device=dev, dtype=torch.bfloat16)
    w = torch.softmax(torch.randn(1, TOP_K, device=dev), -1)
    for resident in RESIDENT:
        slots = round(EXPERTS * resident)
        routes = round(TOP_K * (1 - resident))
        ids = _route_ids(slots, routes, dev)
        case = f"T=1, {resident:.0%} resident: {routes} routes on the CPU"
        for mechanism in ("eager", "stream_memop", "host_func"):
            ex = HybridDecodeExecutor(gu, dn, slots, dev, mechanism=mechanism)
            ex.end_step(torch.arange(slots))  # experts 0..slots-1 resident
            if ex.mechanism != mechanism:
                report.notes.append(f"{case}: {mechanism} unavailable ({ex.mechanism_reason})")
                ex.close()
                continue

            def step(ex=ex, ids=ids):
                return ex(x, w, ids)

            y = step()
            torch.cuda.synchronize()
            ok = _validate(y, x, gu, dn, w, ids, ex.split(ids)[0])
            if mechanism == "eager":

                def synced(step=step):
                    step()
                    torch.cuda.synchronize()

                t = _median_s(synced, 5 if quick else 20) * 1e6
                mode = "eager"
            else:
                ch = ex.handshake.cpu.channel(1, TOP_K)
                before = ch.stats()
                t = time_graph_us(step, inner=10, reps=5 if quick else 20)
                after = ch.stats()
                ex.check()
                mode = "graph"
                jobs = after["jobs"] - before["jobs"]
                if routes and jobs:
                    cpu_us = (after["cpu_ns"] - before["cpu_ns"]) / jobs / 1e3
                    report.notes.append(
                        f"{case}, {mechanism} graph: CPU job {cpu_us:.0f} us mean over {jobs} "
                        f"jobs, {cpu_us / t:.0%} of the {t:.0f} us step"
                    )
            report.measurements.append(
                Measurement(case, f"hybrid step ({mechanism})", t, 0, ok, mode)
            )
            ex.close()
        torch.cuda.empty_cache()
    _layers_in_one_graph(report, gu, dn, x, w, quick)


def _layers_in_one_graph(
    report: Report,
    gu,
    dn,
    x: torch.Tensor,
    w: torch.Tensor,
    quick: bool,
    layers: int = 8,
    resident: float = 0.5,
) -> None:
    """``layers`` hybrid layers (the same banks, each its own executor) one after another in one
    graph, as a decode step runs them: one CPU worker serves every layer's channel. Every layer
    takes the same input (chained through random weights without norms, activations shrink into
    fp32 subnormals within a few layers, which the CPU computes at a fraction of its speed)."""
    from ftlab.bench.harness import time_graph_us
    from ftlab.hybrid import HybridDecodeExecutor

    dev = x.device
    slots = round(EXPERTS * resident)
    routes = round(TOP_K * (1 - resident))
    ids = _route_ids(slots, routes, dev)
    for mechanism in ("stream_memop", "host_func"):
        exs = [HybridDecodeExecutor(gu, dn, slots, dev, mechanism=mechanism) for _ in range(layers)]
        if any(ex.mechanism != mechanism for ex in exs):
            for ex in exs:
                ex.close()
            continue
        for ex in exs:
            ex.end_step(torch.arange(slots))

        def step(exs=exs):
            return torch.stack([ex(x, w, ids) for ex in exs])

        want = torch.stack([ex.eager(x, w, ids) for ex in exs])
        ok = bool(torch.equal(step(), want))
        t = time_graph_us(step, inner=2, reps=5 if quick else 20)
        for ex in exs:
            ex.check()
        case = (
            f"{layers} layers in one graph, {resident:.0%} resident: "
            f"{routes} routes a layer on the CPU"
        )
        report.measurements.append(
            Measurement(case, f"hybrid step ({mechanism})", t, 0, ok, "graph")
        )
        report.notes.append(
            f"{case}, {mechanism}: {t / layers:.0f} us a layer (equal to the eager schedule bit "
            f"for bit: {ok})"
        )
        for ex in exs:
            ex.close()
        torch.cuda.empty_cache()

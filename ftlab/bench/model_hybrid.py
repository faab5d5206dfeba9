"""``ftlab bench model --gguf FILE --hybrid-slots N [--llama-bench BIN]``: decode at batch 1 with
``N`` of every layer's routed experts on the GPU and the rest run on the CPU (:mod:`ftlab.hybrid`),
beside llama.cpp's ``llama-bench -ncmoe L`` on the same file: the experts of its first ``L``
layers on the CPU, ``L`` chosen so that both engines keep the same share of the expert bytes on
the CPU (``L = layers * (E - N) / E``, rounded; 24 of 48 layers for 64 of 128 experts).

ftlab's rows, one a placement (``Pipeline(hybrid_policy=...)``,
:func:`ftlab.hybrid.layer_executors`):

- ``layers``: the experts of the first ``L`` layers on the CPU, the others' on the GPU: where
  ``-ncmoe`` puts them;
- ``static``: experts ``0 .. N-1`` of every layer on the GPU for good: nothing crosses PCIe
  between steps but the handshakes, one a layer;
- ``lru``: the GPU slots follow the routes, a step's missed experts copied in after it (the
  Pipeline's default).

A step is the decode step a ``Pipeline`` runs (the graph replayed where every layer's handshake
passed its probe, else eager) and then ``end_step`` (the residency update, one synchronization),
so the time is the host's wall clock over :data:`STEPS` steps, the median of :data:`ROUNDS`
rounds. Validated: finite logits, and the replay bit-equal to the same step launched eagerly
through the graph's kernels, before any residency update and again after the warm-up steps
(lru's slots then hold experts)."""

from __future__ import annotations

import gc
import statistics
import time

import torch
from tqdm import tqdm

from ftlab.bench.harness import Measurement, Report
from ftlab.bench.model import decode_bytes, fill_cache, parted_note
from ftlab.hybrid import cpu_layers, layer_executors
from ftlab.hybrid.handshake import default_threads
from ftlab.models.decode_steps import DecodeGraph
from ftlab.models.qwen3_moe.config import Qwen3MoeConfig
from ftlab.models.qwen3_moe.model import Qwen3Moe
from ftlab.models.qwen3_moe.model_weights import ModelWeights

POLICIES = ("layers", "static", "lru")
STEPS = 32  # decode steps a timed round
ROUNDS = 3


def llama_cpu_layers(config: Qwen3MoeConfig, slots: int) -> int:
    """llama.cpp's ``-ncmoe`` for the same share of the expert bytes on the CPU as ``slots`` of
    every layer's experts on the GPU (:func:`ftlab.hybrid.cpu_layers`)."""
    return cpu_layers(config.num_hidden_layers, config.num_experts, slots)


def bench_hybrid(
    report: Report,
    config: Qwen3MoeConfig,
    weights: ModelWeights,
    slots: int,
    length: int,
    quick: bool = False,
) -> None:
    """The rows of :data:`POLICIES`, decode batch 1 at position ``length``, into ``report``."""
    dev = weights.embed.device
    host = [
        (lw.w_gate_up.to("cpu"), lw.w_down.to("cpu"))
        for lw in tqdm(weights.layers, desc="expert banks to the host", unit="layer")
    ]
    share = (config.num_experts - slots) / config.num_experts
    report.notes.append(
        f"hybrid decode: {slots} of {config.num_experts} routed experts a layer on the GPU, "
        f"{share:.0%} of the expert bytes run on the CPU ({default_threads()} OpenMP threads of "
        "the CPU worker); a step is the Pipeline's (graph where the handshakes passed their "
        f"probes) plus its residency update, host clock over {4 if quick else STEPS} steps, median "
        f"of {1 if quick else ROUNDS} rounds; layers: every expert of the first "
        f"{llama_cpu_layers(config, slots)} layers on the CPU; static: experts 0..{slots - 1} of "
        "every layer on the GPU for good; lru: a step's missed experts copied in after it"
    )
    for policy in POLICIES:
        executors = layer_executors(host, slots, dev, policy, path="auto")
        try:
            _policy_row(report, config, weights, executors, policy, length, quick)
        finally:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            for ex in executors:
                if ex is not None:
                    ex.close()
            del executors
            gc.collect()  # a failed row's model and graph too, before the next placement allocates
            if dev.type == "cuda":
                torch.cuda.empty_cache()


def _policy_row(
    report: Report,
    config: Qwen3MoeConfig,
    weights: ModelWeights,
    executors: list,
    policy: str,
    length: int,
    quick: bool,
) -> None:
    rounds, n_steps, warmup = (1, 4, 1) if quick else (ROUNDS, STEPS, 4)
    dev = weights.embed.device
    model = Qwen3Moe(
        config, weights, max_batch=1, max_seq_len=length + 8, static=True, hybrid=executors
    )
    fill_cache(model.cache)
    gen = torch.Generator().manual_seed(2)
    # a fresh token id every step (warm-up and timed): a residency that adapts (lru) must not see
    # the same few routes again and again
    count = warmup + rounds * n_steps + 2
    tokens = [
        torch.randint(0, config.vocab_size, (1, 1), generator=gen).to(dev) for _ in range(count)
    ]
    served = [2]  # tokens[0] and [1] are the replay checks'
    pos = torch.full((1, 1), length, device=dev)
    eager = model.forward(tokens[0], pos).clone()
    ok = bool(torch.isfinite(eager).all())
    live = [ex for ex in executors if ex is not None]  # the layers with CPU experts
    capturable = dev.type == "cuda" and all(ex.capturable for ex in live)
    mode = "graph" if capturable else "eager"
    if capturable:
        graph = DecodeGraph(model, 1)

        def replay_is_eager(t: torch.Tensor, when: str) -> bool:
            """The replay bit-equal to the same step through the graph's kernels, launched
            eagerly."""
            with model.planned(model.plan.attention_as_captured()):
                same = model.forward(t, pos).clone()
            replayed = graph(t, pos)
            if torch.equal(replayed, same):
                return True
            report.notes.append(
                parted_note(f"hybrid decode ({policy}){when}: the graph step", replayed, same)
            )
            return False

        ok = replay_is_eager(tokens[0], "") and ok

        def step(t: torch.Tensor) -> torch.Tensor:
            return graph(t, pos)
    else:

        def step(t: torch.Tensor) -> torch.Tensor:
            return model.forward(t, pos)

    model.end_step()

    def steps(n: int) -> torch.Tensor:
        out = eager
        for _ in range(n):
            out = step(tokens[served[0] % len(tokens)])
            served[0] += 1
            model.end_step()
        return out

    steps(warmup)  # every channel and its worker started; lru's slots filled
    if capturable:  # again with the slots the warm-up left: the GPU slots' routes checked too
        ok = replay_is_eager(tokens[1], ", after the warm-up") and ok
        model.end_step()
    for ex in live:  # the timed steps' residency counts only
        ex.policy.hits = ex.policy.misses = 0
    before = _cpu_jobs(live)
    samples = []
    for _ in range(rounds):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        out = steps(n_steps)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        samples.append((time.perf_counter() - start) / n_steps * 1e6)
        ok = ok and bool(torch.isfinite(out).all())
    us = statistics.median(samples)
    jobs, cpu_ns = (a - b for a, b in zip(_cpu_jobs(live), before, strict=True))
    hits = sum(ex.policy.hits for ex in live)
    misses = sum(ex.policy.misses for ex in live)
    # a token's k experts a layer
    nbytes = int(decode_bytes(config, weights, config.num_experts_per_tok, 1))
    mech = live[0].mechanism if live else "none"
    report.measurements.append(
        Measurement(
            f"hybrid decode batch 1, {policy}: {1e6 / us:.0f} tokens/s",
            "auto",
            us,
            nbytes,
            ok,
            mode,
        )
    )
    total = rounds * n_steps
    cpu = (
        (
            f"; the CPU worker's jobs {cpu_ns / 1e3 / max(jobs, 1):.0f} us each, "
            f"{cpu_ns / 1e3 / total:.0f} us a step ({jobs / total:.0f} a step)"
        )
        if jobs
        else ""
    )
    report.notes.append(
        f"hybrid decode ({policy}): {1e6 / us:.1f} tokens/s, {us:.0f} us a step ({mode}, handshake "
        f"{mech}); routed experts found on the GPU {hits} times, on the CPU {misses} (timed steps, "
        f"the {len(live)} layers with CPU experts){cpu}"
    )


def _cpu_jobs(executors: list) -> tuple[int, int]:
    """(jobs, nanoseconds) the CPU worker spent on the channels of ``executors`` so far (graph
    handshakes; (0, 0) for eager ones, which keep no counts)."""
    jobs = ns = 0
    for ex in executors:
        for ch in getattr(getattr(ex.handshake, "cpu", None), "channels", {}).values():
            st = ch.stats()
            jobs, ns = jobs + st["jobs"], ns + st["cpu_ns"]
    return jobs, ns

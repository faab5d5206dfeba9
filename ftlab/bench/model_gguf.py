"""``ftlab bench model --gguf FILE``: the model bench on the model of a llama.cpp GGUF file, e.g.
the Qwen3-30B-A3B shape in Q4_K_M that ``benchmarks/make_kquant_model.sh`` makes from random
weights.

First the engine as a user runs it (:mod:`ftlab.bench.user_path`: ``Pipeline.load``,
``prefill``, ``generate``; rows of kind ``"user path"``, the only ones set beside llama.cpp's).
Then, unless ``diagnostics=False``, the model called directly (rows of kind ``"diagnostic"``:
kernels' schedules and graph-replayed passes no public call takes). The file's
``general.architecture`` picks the model: ``qwen3moe`` is loaded by
:func:`~ftlab.models.loader.load_gguf` and timed as ``ftlab bench model`` times its random model
(:func:`ftlab.bench.model.bench_weights`: prefill, decode batch 1 and 8, graph and eager);
``qwen35moe`` / ``qwen3next`` are read by :func:`~ftlab.models.qwen3_next.gguf.read_gguf_hf` and
timed through the pipeline as ``--arch qwen35moe`` times its model
(:func:`ftlab.bench.qwen35moe.bench_pipeline`). Weights keep the file's types (Q4_0, Q8_0, Q4_K,
Q5_K, Q6_K packed; others dequantized, with a warning), activations are bf16; prompts are random
token ids (no tokenizer is read: a file of llama.cpp's ``none`` vocabulary benches too).

The bound of a decode step counts the bytes of the tensors as the model holds them -- each packed
tensor at its own type's size -- so a K-quant mix (Q4_K with Q6_K attn_v, ffn_down_exps and
output) is bound by what it really reads. The notes name the file, its size and how many tensors
of each GGUF type it holds.

``llama_bench``: the path of llama.cpp's ``llama-bench``, run on the same file in the same run
(``-ngl 99 -fa 1 -p <prompt> -n 128 -d 0,<prompt> -r 3 -o json``): its prefill and decode tokens/s
become rows of backend ``llama.cpp`` beside ftlab's, decode both from an empty cache (its tg128)
and at depth <prompt>, where ftlab's decode rows run (a llama-bench without ``-d`` is run again
without it: no depth rows, and a note saying so; :mod:`ftlab.bench.llama_bench` runs it).

``hybrid_slots`` (a ``qwen3moe`` file): also decode at batch 1 with that many of every layer's
experts on the GPU and the rest on the CPU (:mod:`ftlab.bench.model_hybrid`), and llama-bench
again with ``-ncmoe`` at the same share of the expert bytes on the CPU.

On the CPU (``device="cpu"``: fp32 activations, eager, host clock, host copy bandwidth) it is a
check that the bench runs, not a measurement.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

from ftlab.bench.harness import Report, require_gpu
from ftlab.bench.llama_bench import llama_bench_args, run_llama_bench, run_llama_bench_ncmoe
from ftlab.bench.model import PREFILL, bench_weights, timer
from ftlab.bench.qwen35moe import bench_pipeline
from ftlab.bench.user_path import bench_user_path, label_diagnostics
from ftlab.formats.gguf import GGUFError, open_gguf
from ftlab.models import pipeline_args as check
from ftlab.models.loader import GGUF_ARCH, gguf_architecture, load_gguf
from ftlab.models.qwen3_next.config import Qwen3NextConfig
from ftlab.models.qwen3_next.gguf import read_gguf_hf
from ftlab.models.qwen3_next.weights import build_weights

NOTES = [
    "prefill: one prompt of {length} random token ids, eager (host launches included); on a GPU "
    "also graph: the same pass replayed from a captured CUDA graph (the static model: every cache "
    "slot read under a mask).",
    "decode: one token per sequence per step at position {length}; graph = the step replayed from "
    "a captured CUDA graph, eager = launched op by op from Python, launches = eager's kernels "
    "launched from a schedule recorded once (ftlab.models.decode_steps: no graph), validated bit "
    "for bit against the eager step.",
    "bound: the bytes a decode step reads, every tensor at its size in the file's type (packed) or "
    "as the dense tensor ftlab holds, over the copy bandwidth measured in this run.",
]


def run(
    path: str | Path,
    quick: bool = False,
    device: str = "cuda",
    prefill: int | tuple[int, ...] = PREFILL,
    llama_bench: str | Path | None = None,
    tp: int = 1,
    hybrid_slots: int | None = None,
    diagnostics: bool = True,
    depth: int | None = None,
) -> Report:
    """The bench of the model of the GGUF file ``path`` on ``device`` (``"cuda"``: a GPU is
    required; ``"cpu"``: eager, a smoke run) with prompts of ``prefill`` tokens (decode steps at
    that position); ``quick``: fewer repetitions; ``llama_bench``: llama.cpp's ``llama-bench``
    to run on the same file (module docstring). The report is ``model-gguf-<file stem>``.
    GGUFError for a file ftlab cannot load. A llama-bench that fails leaves a note saying why in
    the report (ftlab's rows are kept) instead of raising.

    ``tp > 1`` (a ``qwen3moe`` file; in ``torchrun --nproc-per-node tp``, or an initialized process
    group of that size): tensor / expert parallelism as ``Pipeline.load(tp=...)`` cuts the model
    (each rank reads only its experts, on its own GPU ``cuda:LOCAL_RANK``); every rank runs the
    same calls, the report holds rank 0's times (the report is ``model-gguf-<stem>-tp<tp>``) and
    the cost of one all-reduce of a decode step's ``[B, hidden]`` activations. The process group
    stays up when this returns or raises (``ftlab bench`` tears it down,
    :func:`ftlab.models.tensor_parallel.close`).

    ``hybrid_slots``: the hybrid rows (module docstring) of a ``qwen3moe`` file, ``tp = 1`` only;
    an int in [0, the file's expert count]. ``diagnostics``: False leaves out the diagnostic rows
    (the user path only; a ``tp > 1`` run or ``hybrid_slots`` has them regardless).

    ``prefill`` may be a tuple of prompt lengths: the user path and llama-bench time a prefill of
    each (the diagnostics the first); ``depth``: where the deep decode rows run (default: the
    first prompt's length), ftlab's and llama-bench's (``-d 0,depth``)."""
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
    if not isinstance(device, str):
        raise TypeError(f"device must be a str, got {type(device).__name__}")
    dev = torch.device(device)
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    prompts = (prefill,) if not isinstance(prefill, (tuple, list)) else tuple(prefill)
    if not prompts or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in prompts):
        raise ValueError(f"prefill must be an int >= 1 (or a tuple of them), got {prefill!r}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ValueError(f"depth must be an int >= 1 (or None: the first prompt's), got {depth!r}")
    prefill, depth = prompts[0], prompts[0] if depth is None else depth
    if llama_bench is not None and not Path(llama_bench).is_file():
        raise ValueError(
            f"llama_bench must be the path of llama.cpp's llama-bench, got {str(llama_bench)!r} "
            "(no such file)"
        )
    check.hybrid_slots(hybrid_slots)
    check.flag("diagnostics", diagnostics)
    path = Path(path)
    arch = gguf_architecture(path)  # the file's structure checked first
    tp = check.tp(tp)
    if hybrid_slots is not None and (arch != GGUF_ARCH or tp > 1):
        raise ValueError(
            f"hybrid_slots benches a {GGUF_ARCH} file (Qwen3-MoE) with tp = 1 only; {path.name} is "
            f"{arch!r}, tp = {tp}"
        )
    if tp > 1 and arch != GGUF_ARCH:
        raise ValueError(
            f"tp > 1 benches a {GGUF_ARCH} file (Qwen3-MoE) only; {path.name} is {arch!r}"
        )
    if tp > 1 and llama_bench is not None:
        raise ValueError("llama_bench cannot go with tp > 1: run llama-bench in a one-GPU run")
    if dev.type == "cuda":
        require_gpu()
    group = None
    if tp > 1:
        from ftlab.models.tensor_parallel import process_group

        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        group = process_group(tp, dev)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    notes = [file_note(path), type_note(path)] + [n.format(length=prefill) for n in NOTES]
    name = f"model-gguf-{_slug(path.stem)}" + (f"-tp{tp}" if tp > 1 else "")
    report = Report.for_device(name, notes, dev)
    if tp == 1:  # the engine as a user runs it: Pipeline.load / prefill / generate
        bench_user_path(report, path, dev, dtype, prompts, runs=1 if quick else 3, depth=depth)
    config = None
    if diagnostics or tp > 1 or hybrid_slots is not None:
        config = _diagnostics(report, path, arch, dev, dtype, prefill, quick, group, hybrid_slots)
        label_diagnostics(report)
    if llama_bench is not None:
        try:
            rows = run_llama_bench(
                llama_bench, path, prompts, dev.type == "cuda", report.notes, depth=depth
            )
        except RuntimeError as e:
            report.notes.append(f"llama.cpp: no figures, {e}"[:600])
            return report
        report.measurements.extend(rows)
        gpu = dev.type == "cuda"
        depth = depth if any("at depth" in m.case for m in rows) else 0
        deep = (
            (
                f"; its decode at depth {depth} is where ftlab's decode rows run, its tg128 "
                "without depth starts from an empty cache"
            )
            if depth
            else ""
        )
        report.notes.append(
            f"llama.cpp: {Path(llama_bench).name} "
            f"{' '.join(llama_bench_args(path, prompts, gpu, depth=depth))} on the same file in "
            f"this run (its own timing: mean of its repetitions{deep})"
        )
        if hybrid_slots is not None:
            from ftlab.bench.model_hybrid import llama_cpu_layers

            layers = llama_cpu_layers(config, hybrid_slots)
            try:
                hybrid = run_llama_bench_ncmoe(
                    llama_bench, path, layers, gpu, prefill, report.notes
                )
            except RuntimeError as e:
                report.notes.append(f"llama.cpp -ncmoe {layers}: no figure, {e}"[:600])
                return report
            report.measurements.extend(hybrid)
            depth = prefill if len(hybrid) > 1 else 0
            report.notes.append(
                f"llama.cpp hybrid: {Path(llama_bench).name} "
                f"{' '.join(llama_bench_args(path, 0, gpu, layers, depth))}: the experts of its "
                "first "
                f"{layers} of {config.num_hidden_layers} layers on the CPU (its default threads)"
            )
    return report


def _diagnostics(report, path, arch, dev, dtype, prefill, quick, group, hybrid_slots):
    """The rows of the model called directly (labelled diagnostic by the caller): a
    ``qwen3moe`` file's weights through :func:`~ftlab.bench.model.bench_weights` (and the hybrid
    rows), a hybrid one's through :func:`~ftlab.bench.qwen35moe.bench_pipeline`; the config."""
    clock = timer(dev, quick)
    if group is not None:
        from ftlab.models.pipeline import rank_heads, rank_ranges
        from ftlab.models.tensor_parallel import shard_qwen3_moe

        # a rank reads its experts, vocabulary rows and heads only
        experts, vocab = rank_ranges(path, group)
        config, weights = load_gguf(
            path,
            device=torch.device("cpu"),
            dtype=dtype,
            experts=experts,
            vocab=vocab,
            heads=rank_heads(path, group),
        )
        weights = shard_qwen3_moe(config, weights, group, dev)
        report.notes.insert(2, _shape_note(arch, config))
        report.notes.append(
            f"tp = {group.world} ranks, one {dev.type} device each (rank 0's times; copy bandwidth "
            "and bound are one device's, the bytes a rank's): attention heads, experts and "
            "vocabulary cut across the ranks"
        )
        bench_weights(report, config, weights, prefill, clock, group)
        report.notes.append(collective_note(group, config.hidden_size, dev, dtype, clock))
    elif arch == GGUF_ARCH:
        config, weights = load_gguf(path, device=dev, dtype=dtype)
        check.hybrid_slots(hybrid_slots, config.num_experts)
        report.notes.insert(2, _shape_note(arch, config))
        bench_weights(report, config, weights, prefill, clock)
        if hybrid_slots is not None:
            from ftlab.bench.model_hybrid import bench_hybrid

            bench_hybrid(report, config, weights, hybrid_slots, prefill, quick)
    else:
        hf, tensors, perms = read_gguf_hf(path, dev, dtype)
        try:
            config = Qwen3NextConfig.from_hf(hf)
        except ValueError as e:
            raise GGUFError(f"{path}: {e}") from e
        weights = build_weights(
            config,
            tensors,
            device=dev,
            dtype=dtype,
            where=str(path),
            input_perms=perms,
            progress=lambda r: tqdm(r, desc=f"loading {path.name}", unit="layer"),
        )
        del tensors
        report.notes.insert(2, _shape_note(arch, config))
        bench_pipeline(report, config, weights, prefill, clock, path.name)
    return config


def collective_note(group, hidden: int, dev: torch.device, dtype: torch.dtype, clock) -> str:
    """The time of one all-reduce of ``[B, hidden]`` activations of ``dtype`` (B of
    ``DECODE_BATCHES``) over ``group``'s ranks, captured in a graph on a GPU; a decode step of a
    Qwen3-MoE model makes two a layer (o_proj and the experts), one for the embedding."""
    from ftlab.bench.harness import time_graph_us
    from ftlab.bench.model import DECODE_BATCHES

    times = []
    for batch in DECODE_BATCHES:
        buf = torch.zeros(batch, hidden, dtype=dtype, device=dev)
        if dev.type == "cuda":
            us = time_graph_us(lambda b=buf: group.all_reduce(b), inner=10, reps=20)
        else:
            us = clock(lambda b=buf: group.all_reduce(b), 2, 5)
        times.append(f"[{batch}, {hidden}] {us:.1f} us")
    mode = "graph-replayed" if dev.type == "cuda" else "eager, host clock"
    return (
        f"collectives: one all-reduce of {str(dtype).removeprefix('torch.')} activations ({mode}, "
        f"over {group.world} ranks): {', '.join(times)}; a decode step makes 2 a layer + 1 (the "
        "embedding) and one all-gather of the logits"
    )


def _slug(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", stem).strip("-") or "model"


def file_note(path: Path) -> str:
    size = path.stat().st_size
    return f"file: {path.name}, {size} bytes ({_size(size)})"


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def type_counts(path: str | Path) -> dict[str, tuple[int, int]]:
    """``{GGUF type name: (tensors, bytes)}`` of a GGUF file's tensors, most tensors first."""
    counts, sizes = Counter(), Counter()
    for t in open_gguf(path).tensors:
        counts[t.tensor_type.name] += 1
        sizes[t.tensor_type.name] += int(t.n_bytes)
    return {
        kind: (n, sizes[kind]) for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    }


def type_note(path: Path) -> str:
    counts = type_counts(path)
    listed = ", ".join(f"{kind} {n} ({_size(nbytes)})" for kind, (n, nbytes) in counts.items())
    return f"tensor types (tensors, bytes), {sum(n for n, _ in counts.values())} tensors: {listed}"


def _shape_note(arch: str, c) -> str:
    hybrid = ""
    if isinstance(c, Qwen3NextConfig):
        hybrid = (
            f" ({len(c.linear_layers)} Gated DeltaNet + {len(c.attention_layers)} gated attention)"
        )
    return (
        f"shape ({arch}): {c.num_hidden_layers} layers{hybrid}, hidden {c.hidden_size}, attention "
        f"{c.num_attention_heads} / {c.num_key_value_heads} heads x {c.head_dim}, {c.num_experts} "
        f"experts top-{c.num_experts_per_tok} of {c.moe_intermediate_size}, vocab {c.vocab_size}"
    )

"""llama.cpp's ``llama-bench`` run on a GGUF file beside ftlab's model bench (``ftlab bench model
--gguf FILE --llama-bench PATH``, :mod:`ftlab.bench.model_gguf`): its command line (``-ngl 99 -fa
1 -p <prompt> -n 128 -d 0,<prompt> -r 3 -o json``, and ``-ncmoe`` for the hybrid rows) and its
JSON results as report rows of backend ``llama.cpp``: prefill and decode tokens/s, decode from an
empty cache (its tg128) and at depth <prompt>. A llama-bench without ``-d`` is run again without
it: no depth rows, and a note saying so."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ftlab.bench.harness import Measurement

LLAMA_BENCH_GEN = 128  # tokens llama-bench generates in its decode test (its tg128)


def prompts_of(prefill: int | tuple[int, ...]) -> tuple[int, ...]:
    """The prompt lengths of ``prefill`` (an int or a tuple of them), as a tuple."""
    return (prefill,) if isinstance(prefill, int) else tuple(prefill)


def llama_bench_args(
    path: Path,
    prefill: int | tuple[int, ...],
    gpu: bool,
    ncmoe: int | None = None,
    depth: int = 0,
) -> list[str]:
    """The arguments ``llama-bench`` runs with: the file, all layers offloaded and flash attention
    on a GPU, a prompt of ``prefill`` tokens (each of them, for a tuple: ``-p 512,4096``),
    :data:`LLAMA_BENCH_GEN` generated, JSON out; ``ncmoe``: the experts of the first ``ncmoe``
    layers kept on the CPU (``-ncmoe``); ``depth`` > 0: each test also run after ``depth`` tokens
    in the cache (``-d 0,depth``), where ftlab's deep decode rows run."""
    offload = ["-ngl", "99", "-fa", "1"] if gpu else ["-ngl", "0"]
    cpu_moe = [] if ncmoe is None else ["-ncmoe", str(ncmoe)]
    depths = [] if depth <= 0 else ["-d", f"0,{depth}"]
    return [
        "-m",
        str(path),
        *offload,
        *cpu_moe,
        "-p",
        ",".join(map(str, prompts_of(prefill))),
        "-n",
        str(LLAMA_BENCH_GEN),
        *depths,
        "-r",
        "3",
        "-o",
        "json",
    ]


def _decode_rows(results: list, depth: int) -> dict[int, float]:
    """{depth: tokens/s} of llama-bench's decode results (``tg128``, no prompt) at depth 0 and
    ``depth``."""
    found = {}
    for r in results:
        d = r.get("n_depth", 0)
        if (
            r.get("n_gen", 0) == LLAMA_BENCH_GEN
            and r.get("n_prompt", 0) == 0
            and r.get("avg_ts", 0) > 0
            and d in (0, depth)
        ):
            found[d] = r["avg_ts"]
    return found


def _llama_results(binary: str | Path, args: list[str]) -> tuple[str, list]:
    """(the command line, llama-bench's JSON results); RuntimeError if it fails or prints no
    JSON."""
    cmd = [str(binary), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {tail[0]}")
    try:
        results = json.loads(done.stdout)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"{' '.join(cmd)} printed no JSON ({e})") from e
    return " ".join(cmd), results if isinstance(results, list) else []


def _llama_results_at(
    binary: str | Path,
    path: Path,
    prefill: int | tuple[int, ...],
    gpu: bool,
    ncmoe: int | None,
    depth: int,
    notes: list[str] | None,
) -> tuple[str, list, int]:
    """:func:`_llama_results` of :func:`llama_bench_args` with ``depth``; a llama-bench that fails
    with ``-d`` (one older than the option) is run again without it, the depth given up (0 is
    returned for it) and why appended to ``notes``. (command, results, the depth run)."""
    try:
        cmd, results = _llama_results(binary, llama_bench_args(path, prefill, gpu, ncmoe, depth))
        return cmd, results, depth
    except RuntimeError as e:
        if depth <= 0:
            raise
        first = str(e)
    cmd, results = _llama_results(binary, llama_bench_args(path, prefill, gpu, ncmoe))
    if notes is not None:
        notes.append(
            f"llama.cpp: no rows at depth {depth} (llama-bench failed with -d: {first}"[:600] + ")"
        )
    return cmd, results, 0


def run_llama_bench_ncmoe(
    binary: str | Path,
    path: Path,
    layers: int,
    gpu: bool,
    depth: int = 0,
    notes: list[str] | None = None,
) -> list[Measurement]:
    """llama-bench's decode (``tg128``, no prompt test) with the experts of its first ``layers``
    layers on the CPU (``-ncmoe``), at depth 0 and (``depth`` > 0) ``depth``, as rows of backend
    ``llama.cpp``; RuntimeError naming the command if it fails or prints no decode result (a
    llama-bench without ``-d``: depth 0 only, and a line in ``notes``)."""
    cmd, results, depth = _llama_results_at(binary, path, 0, gpu, layers, depth, notes)
    found = _decode_rows(results, depth)
    missing = [d for d in sorted({0, depth}) if d not in found]
    if missing:
        raise RuntimeError(f"{cmd} gave no decode result at depth {', '.join(map(str, missing))}")
    rows = []
    for d in sorted(found):
        at = f" at depth {d}" if d else ""
        rows.append(
            Measurement(
                f"hybrid decode batch 1, -ncmoe {layers}{at}: {found[d]:.0f} tokens/s",
                "llama.cpp",
                1e6 / found[d],
                0,
                True,
                "llama-bench",
            )
        )
    return rows


def run_llama_bench(
    binary: str | Path,
    path: Path,
    prefill: int | tuple[int, ...],
    gpu: bool,
    notes: list[str] | None = None,
    depth: int | None = None,
) -> list[Measurement]:
    """llama-bench's prefill (``pp<prefill>``, each length of a tuple) and decode (``tg128``)
    results on ``path`` as rows of backend ``llama.cpp`` (time: one token's, or the prompt's, at
    its mean tokens/s), decode at depth 0 and at ``depth`` (default: the first prompt's length;
    where ftlab's decode rows run); RuntimeError naming the command if it fails or prints no
    result of each test (a llama-bench without ``-d``: no depth row, and a line in ``notes``)."""
    prompts = prompts_of(prefill)
    depth = prompts[0] if depth is None else depth
    cmd, results, depth = _llama_results_at(binary, path, prompts, gpu, None, depth, notes)
    rows = {}
    for r in results:
        n_prompt, n_gen, ts = r.get("n_prompt", 0), r.get("n_gen", 0), r.get("avg_ts", 0)
        if n_prompt in prompts and n_gen == 0 and ts > 0 and r.get("n_depth", 0) == 0:
            rows[f"prefill {n_prompt}"] = Measurement(
                f"prefill {n_prompt} tokens: {ts:.0f} tokens/s",
                "llama.cpp",
                n_prompt / ts * 1e6,
                0,
                True,
                "llama-bench",
            )
    for d, ts in _decode_rows(results, depth).items():
        at = f" at depth {d}" if d else ""
        rows[f"decode{at}"] = Measurement(
            f"decode batch 1{at}: {ts:.0f} tokens/s", "llama.cpp", 1e6 / ts, 0, True, "llama-bench"
        )
    keys = [f"prefill {p}" for p in prompts] + ["decode"]
    keys += [f"decode at depth {depth}"] if depth else []
    missing = [k for k in keys if k not in rows]
    if missing:
        raise RuntimeError(f"{cmd} gave no {' or '.join(missing)} result")
    return [rows[k] for k in keys]

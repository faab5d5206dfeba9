"""The engine as a user runs it: ``Pipeline.load``, ``Pipeline.prefill`` and
``Pipeline.generate``, called exactly as documented (defaults: graphs on where the device has
them), each call timed on the host clock from the call to its result (the device synchronized),
rows of kind ``"user path"`` -- the only ftlab rows the README sets beside llama.cpp.

- load: ``Pipeline.load(path, device=..., dtype=bfloat16)`` with the file's bytes in the page cache
  (read once just before, that read timed in a note);
- prefill: ``pipe.prefill(ids)`` of ``prompt`` random token ids, new ones each call (as a new
  prompt: nothing to resume from in the prefix cache; a warm-up call first: kernel builds and
  graph captures are a first call's, not a prefill's);
- decode: ``pipe.generate(ids, new_tokens, ignore_eos=True)`` consumed to the end, greedy and
  top-p; the rate is the tokens after the first over their time (the first comes from the
  prefill), as llama-bench's tg counts the tokens it generates. Depth 0 starts from a one-token
  prompt, depth ``prompt`` from the prefill's prompt (llama-bench's ``-d``).

Each figure is the median of ``runs`` calls after the warm-up; the notes list every run's.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ftlab.bench.harness import Measurement, Report
from ftlab.models.generation_timing import timed

USER_PATH = "user path"
DIAGNOSTIC = "diagnostic"
NEW_TOKENS = 128
RESUME_NEW = 64  # the new tokens after a shared prefix (bench_user_path's resume rows)
TOP_P = {"temperature": 0.8, "top_p": 0.95, "seed": 0}
PPL_CTX, PPL_WINDOWS = 512, 8  # the accuracy row's window and most windows


def read_file_s(path: Path, chunk: int = 64 << 20) -> float:
    """Seconds to read every byte of ``path`` (after which the page cache holds what fits)."""
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        while f.readinto(buf):
            pass
    return time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode_rate(pieces) -> tuple[float, int]:
    """``(tokens/s, tokens)`` of a consumed generation: the tokens after the first over their
    time."""
    last = None
    for _, timing in timed(pieces):
        last = timing
    if last is None or last.tokens < 2:
        raise RuntimeError("the generation gave fewer than two tokens: no decode rate")
    return (last.tokens - 1) / (last.seconds - last.first_token_s), last.tokens


def bench_user_path(
    report: Report,
    path: Path,
    device: torch.device,
    dtype: torch.dtype,
    prompt: int | tuple[int, ...],
    runs: int = 3,
    new_tokens: int = NEW_TOKENS,
    pipeline: type | None = None,
    depth: int | None = None,
) -> None:
    """Add the user path rows of the GGUF file ``path`` on ``device`` to ``report`` (module
    docstring): load, prefill of ``prompt`` tokens (each length of a tuple), decode of
    ``new_tokens`` tokens at depth 0 and ``depth`` (default: the first prompt's length; greedy)
    and at depth 0 top-p, each the median of ``runs`` calls. ``pipeline``: the class whose
    ``load`` is called (default :class:`~ftlab.models.pipeline.Pipeline`)."""
    if pipeline is None:
        from ftlab.models.pipeline import Pipeline as pipeline
    prompts = (prompt,) if isinstance(prompt, int) else tuple(prompt)
    depth = prompts[0] if depth is None else depth
    longest = max(*prompts, depth)
    seconds = read_file_s(path)
    size = path.stat().st_size
    report.notes.append(
        f"user path: the file's {size / 1e9:.2f} GB read once before the load in {seconds:.2f} s "
        f"({size / seconds / 1e9:.2f} GB/s), so the load reads it from the page cache"
    )
    start = time.perf_counter()
    seq = longest + new_tokens + 1
    pipe = pipeline.load(path, device=device, dtype=dtype, max_seq_len=seq)
    _sync(device)
    load_s = time.perf_counter() - start
    row = _rows(report, pipe)
    row(f"load: {load_s:.2f} s", load_s * 1e6, "Pipeline.load")
    ids = torch.randint(
        pipe.config.vocab_size, (longest,), generator=torch.Generator().manual_seed(0)
    )
    for n in prompts:
        _time_prefill(report, row, pipe, device, n, runs)
    _time_resume(report, row, pipe, device, longest, min(RESUME_NEW, new_tokens), runs)
    for at, sampling in ((0, {}), (depth, {}), (0, TOP_P)):
        _time_decode(report, row, pipe, ids[: max(at, 1)], at, sampling, runs, new_tokens)
    _perplexity(report, row, pipe, device)
    report.notes.append(
        f"user path: Pipeline.load(path, device={str(device)!r}, dtype={dtype}, max_seq_len={seq}) "
        f"(graphs: {pipe.decode_path}); prefill(ids) of {', '.join(map(str, prompts))} random ids; "
        f"generate(ids, {new_tokens}, ignore_eos=True) consumed, greedy and "
        f"{', '.join(f'{k}={v}' for k, v in TOP_P.items())}; host clock, one warm-up call, "
        f"median of {runs}"
    )
    del pipe
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _time_prefill(report, row, pipe, device, n: int, runs: int) -> None:
    """Each call a new prompt of ``n`` random ids (seeded): nothing of it in the pipeline's
    prefix cache, which a repeated prompt would resume from whole."""
    seeds = iter(range(1, 1 << 30))

    def prefill() -> float:
        gen = torch.Generator().manual_seed(next(seeds))
        ids = torch.randint(pipe.config.vocab_size, (n,), generator=gen)
        start = time.perf_counter()
        pipe.prefill(ids)
        _sync(device)
        return time.perf_counter() - start

    times = _runs(prefill, runs)
    median = statistics.median(times)
    row(f"prefill {n} tokens: {n / median:.0f} tokens/s", median * 1e6, "Pipeline.prefill")
    _note(report, f"prefill {n} tokens", [n / t for t in times])
    if device.type == "cuda":  # what one more prompt's prefill takes at its peak
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        prefill()
        peak = torch.cuda.max_memory_allocated(device)
        held = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in pipe.memory().items())
        report.notes.append(
            f"user path: prefill {n} tokens, device memory (GiB): peak {peak / 2**30:.2f}, of "
            f"which scratch above what was allocated before {(peak - before) / 2**30:.2f}; "
            f"the pipeline holds {held}"
        )


def _time_resume(report, row, pipe, device, prefix: int, new: int, runs: int) -> None:
    """Time to first token of a prompt of ``prefix`` shared tokens (prefilled once before, as a
    prompt of its own: its snapshot in the prefix cache) and ``new`` new ones, and of the same
    prompts computed whole (the cache emptied before each): the multi-turn and shared-prefix
    case. The tokens each resumed prompt did not compute again are noted."""
    gen = torch.Generator().manual_seed(7)
    shared = torch.randint(pipe.config.vocab_size, (prefix,), generator=gen)
    pipe.prefill(shared)
    reused = []

    def prompt() -> torch.Tensor:
        return torch.cat([shared, torch.randint(pipe.config.vocab_size, (new,), generator=gen)])

    def resumed() -> float:
        ids = prompt()
        start = time.perf_counter()
        pipe.prefill(ids)
        _sync(device)
        reused.append(pipe.reused)
        return time.perf_counter() - start

    def whole() -> float:
        ids = prompt()
        pipe.prefix_cache.clear()
        pipe.reset()
        start = time.perf_counter()
        pipe.prefill(ids)
        _sync(device)
        return time.perf_counter() - start

    warm = statistics.median(_runs(resumed, runs))
    cold = statistics.median(_runs(whole, runs))
    case = f"prefill {prefix} shared + {new} new tokens"
    row(f"{case}, prefix cached: first token {warm * 1e3:.1f} ms", warm * 1e6, "Pipeline.prefill")
    row(f"{case}, recomputed: first token {cold * 1e3:.1f} ms", cold * 1e6, "Pipeline.prefill")
    report.notes.append(
        f"user path: {case}: time to first token {warm * 1e3:.1f} ms resuming from the prefix "
        f"cache's snapshot, {cold * 1e3:.1f} ms computed whole ({cold / warm:.1f}x); tokens "
        f"resumed each run: {reused} (of {prefix} shared)"
    )


def _time_decode(report, row, pipe, start_ids, depth, sampling, runs, new_tokens) -> None:
    def decode() -> float:
        pieces = pipe.generate(start_ids, new_tokens, ignore_eos=True, **sampling)
        return _decode_rate(pieces)[0]

    rates = _runs(decode, runs)
    rate = statistics.median(rates)
    at = f" at depth {depth}" if depth else ""
    how = (
        f", top-p {sampling['top_p']} at temperature {sampling['temperature']}" if sampling else ""
    )
    case = f"decode batch 1{at}{how}"
    row(f"{case}: {rate:.0f} tokens/s", 1e6 / rate, "Pipeline.generate")
    _note(report, case, rates)


def _perplexity(report, row, pipe, device) -> None:
    from ftlab import eval as fteval
    from ftlab.models.trained import held_out_text

    ctx = min(PPL_CTX, pipe.max_seq_len)
    ids = pipe.tokenizer.encode(held_out_text())[: ctx * PPL_WINDOWS]
    if len(ids) < ctx:
        report.notes.append(f"user path: no accuracy row: the held-out text has {len(ids)} tokens")
        return
    start = time.perf_counter()
    result = fteval.evaluate(pipe, ids, ctx=ctx, progress=False)
    _sync(device)
    seconds = time.perf_counter() - start
    row(
        f"perplexity of the held-out text: {result.perplexity:.6g} "
        f"(ctx {ctx}, {result.windows} windows, {result.tokens} tokens scored)",
        seconds * 1e6,
        "ftlab.eval.evaluate",
    )


def _rows(report: Report, pipe) -> Callable[[str, float, str], None]:
    def row(case: str, time_us: float, call: str) -> None:
        mode = pipe.decode_path if call == "Pipeline.generate" else "public API"
        report.measurements.append(
            Measurement(case, "ftlab", time_us, 0, False, mode, kind=USER_PATH, call=call)
        )

    return row


def _runs(fn: Callable[[], float], runs: int) -> list[float]:
    fn()  # warm-up: kernel builds, graph captures, the first call's allocations
    return [fn() for _ in range(runs)]


def _note(report: Report, case: str, rates: list[float]) -> None:
    listed = ", ".join(f"{r:.0f}" for r in rates)
    report.notes.append(f"user path: {case}, tokens/s of each run: {listed}")


def label_diagnostics(report: Report) -> None:
    """Every ftlab row of ``report`` that is not of the user path is a diagnostic: the model
    called directly, or a pass no public API takes."""
    for m in report.measurements:
        if m.backend != "llama.cpp" and not m.kind:
            m.kind = DIAGNOSTIC

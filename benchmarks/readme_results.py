"""The README's generated sections, rendered from what the repository holds so that they cannot
drift from it: the op table from the routing table (``ftlab.backends``, ``ftlab.catalog``) and
the results tables from the committed JSON results in ``benchmarks/results/`` (the schema
:class:`ftlab.bench.harness.Report` writes: ``name``, ``device`` with its date and commit,
``copy_gbps``, ``results``). Each section sits between ``<!-- NAME:begin -->`` and
``<!-- NAME:end -->`` in README.md.

    python benchmarks/readme_results.py            # print the sections
    python benchmarks/readme_results.py --write    # rewrite them in README.md
    python benchmarks/readme_results.py --check    # exit 1 where README.md differs

Which rows, and why they may stand as they do:

- kernel rows (:data:`KERNELS`): ftlab's kernels in one run of one file, against the copy
  bandwidth measured in that run or against a peer timed in the same run, every side in the same
  mode (graph replay: device time) and validated against the reference first;
- user path rows: every measurement whose ``kind`` (or ``label``) is ``"user path"`` -- the engine
  through its public API (``Pipeline.load`` / ``prefill`` / ``generate``) -- from the newest file
  of each (bench, device), beside llama.cpp's row of the same case in the same file;
- diagnostic rows (:data:`DIAGNOSTICS`): whole-model passes that the model bench times by
  calling a model directly (a prefill replayed from a captured graph is on no public API path),
  never set beside llama.cpp.

A row reads one file, so one device and one run: H100 and H200 figures never share a row.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
USER_PATH = "user path"
DIAGNOSTIC = "diagnostic"
LLAMA_CPP = "llama.cpp"
TIMED = {"graph": "graph replay", "eager": "eager (host launches included)"}


@dataclass(frozen=True)
class Kernel:
    """One kernel row: ftlab's hip and triton ``mode`` measurements of ``case`` in ``file``,
    against ``peer`` (a backend of the same file, same mode) or, without one, the copy bandwidth
    measured in that run."""

    op: str
    what: str
    file: str
    case: str
    mode: str = "graph"
    peer: str | None = None


@dataclass(frozen=True)
class Diagnostic:
    """One diagnostic row: ftlab's ``mode`` measurement of ``case`` (the text before its colon)."""

    file: str
    case: str
    mode: str
    what: str


OURS = ("hip", "triton")
_INDEX = "2026-11-30-nvidia-h200-index_store.json"
_Q4_0 = "2026-11-30-nvidia-h200-q4_0.json"
_QUANT = "2026-12-01-nvidia-h200-quant-hip-mv1.json"
_MOE = "2026-12-04-nvidia-h200-moe-mma-swizzled.json"
_DELTA = "2026-12-05-nvidia-h200-deltanet.json"
_FLA_STEP = "fla fused_recurrent (new state)"
_FLA_CHUNK = "fla chunk_gated_delta_rule"
_MODEL = "2026-12-04-nvidia-h200-model-gguf-{}.json"
_LM_HEAD = "lm_head 2048 -> 151936, one row"

KERNELS = (
    Kernel("index", "gather 65536 rows of 1024 bf16", _INDEX, "index large scatter L=65536 D=1024"),
    Kernel(
        "store", "scatter 65536 rows of 1024 bf16", _INDEX, "store large scatter L=65536 D=1024"
    ),
    Kernel("q4_0_matmul", f"Q4_0 {_LM_HEAD}", _Q4_0, "lm_head 2048->151936 M=1"),
    Kernel("quant_matmul", f"Q4_K {_LM_HEAD}", _QUANT, "Q4_K lm_head 2048->151936 M=1"),
    Kernel("quant_matmul", f"Q6_K {_LM_HEAD}", _QUANT, "Q6_K lm_head 2048->151936 M=1"),
    Kernel("fused_moe", "Qwen3-30B-A3B layer, Q4_0 experts, 1 token", _MOE, "T=1 Q4_0"),
    Kernel("fused_moe", "Qwen3-30B-A3B layer, bf16 experts, 512 tokens", _MOE, "T=512 bf16"),
    Kernel("gated_delta_step", "Qwen3.6 shape, 1 sequence", _DELTA, "decode B=1", peer=_FLA_STEP),
    Kernel(
        "gated_delta_step", "Qwen3.6 shape, 32 sequences", _DELTA, "decode B=32", peer=_FLA_STEP
    ),
    Kernel(
        "gated_delta_rule",
        "Qwen3.6 shape, 512 tokens",
        _DELTA,
        "prefill T=512",
        "eager",
        _FLA_CHUNK,
    ),
    Kernel(
        "gated_delta_rule",
        "Qwen3.6 shape, 16384 tokens",
        _DELTA,
        "prefill T=16384",
        "eager",
        _FLA_CHUNK,
    ),
)
MODELS = {
    "Qwen3-30B-A3B Q4_0": _MODEL.format("qwen3moe-30b-a3b-random-q4_0-gates"),
    "Qwen3-30B-A3B Q4_K_M": _MODEL.format("qwen3moe-30b-a3b-random-q4_k_m-lm-hip"),
    "Qwen3.6-35B-A3B Q4_0": _MODEL.format("qwen36-35b-a3b-random-q4_0-shared-slot"),
}
DIAGNOSTICS = tuple(
    Diagnostic(file, case, "graph", f"{model}: {what}")
    for model, file in MODELS.items()
    for case, what in (
        ("prefill 512 tokens", "prefill of 512 tokens, a static pass replayed from a graph"),
        ("decode batch 1", "decode step at batch 1, replayed from a graph"),
    )
)


def load_results(folder: Path = RESULTS) -> dict[str, dict]:
    """The JSON results of ``folder`` in the harness's schema, by file name (sweeps written in
    other schemas are left out)."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if {"name", "device", "results"} <= data.keys():
            out[path.name] = data
    return out


def kind(m: dict) -> str | None:
    """What a measurement says it is (``"user path"``, ``"diagnostic"``, ...), where it says."""
    return m.get("kind") or m.get("label")


def _stem(case: str) -> str:
    return case.split(":", 1)[0].strip()


def _tokens_per_s(case: str) -> float | None:
    found = re.search(r"([\d.]+) tokens/s", case)
    return float(found.group(1)) if found else None


def _time(us: float) -> str:
    return f"{us:.1f} us" if us < 1000 else f"{us / 1000:.2f} ms"


def _source(name: str, data: dict) -> list[str]:
    """The device, run and file cells of a row read from ``data``, the file ``name``."""
    d = data["device"]
    run = f"{d['date']} · `{d.get('commit', '?')}`"
    return [f"{d['name']} ({d['arch']})", run, f"[{name}](benchmarks/results/{name})"]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _measurement(results: dict[str, dict], file: str, want, what: str, kinds: tuple) -> dict:
    """The one measurement of ``file`` that ``want`` accepts: validated against the reference,
    its kind one of ``kinds``; ValueError naming ``what`` otherwise."""
    if file not in results:
        raise ValueError(f"{what}: file must be a result in benchmarks/results/, got {file!r}")
    found = [m for m in results[file]["results"] if want(m)]
    if len(found) != 1:
        raise ValueError(f"{what}: {file} must hold one such measurement, got {len(found)}")
    m = found[0]
    if not m["validated"]:
        raise ValueError(f"{what}: must be validated before it is shown, got an unvalidated row")
    if kind(m) not in kinds:
        raise ValueError(f"{what}: kind must be one of {kinds}, got {kind(m)!r}")
    return m


def kernel_row(results: dict[str, dict], k: Kernel) -> list[str]:
    """The cells of ``k``: every side from its one file, timed in ``k.mode``."""

    def get(backend: str) -> dict:
        def want(m: dict) -> bool:
            return (m["case"], m["backend"], m["mode"]) == (k.case, backend, k.mode)

        return _measurement(results, k.file, want, f"{k.op} {k.case!r} {backend}", (None, "kernel"))

    ours = [get(b) for b in OURS]
    if k.peer:
        ftlab = " · ".join(f"{m['backend']} {_time(m['time_us'])}" for m in ours)
        against = f"{k.peer} {_time(get(k.peer)['time_us'])}"
    else:
        ftlab = " · ".join(
            f"{m['backend']} {_time(m['time_us'])} ({m['pct_of_copy']:.1f}%)" for m in ours
        )
        against = f"copy {results[k.file]['copy_gbps']:.0f} GB/s (100%)"
    timed = TIMED[k.mode]
    return [f"`{k.op}`", k.what, ftlab, against, timed, *_source(k.file, results[k.file])]


def diagnostic_row(results: dict[str, dict], g: Diagnostic) -> list[str]:
    """The cells of ``g``, labelled diagnostic."""

    def want(m: dict) -> bool:
        ftlab = m["backend"] != LLAMA_CPP
        return ftlab and (_stem(m["case"]), m["mode"]) == (g.case, g.mode)

    m = _measurement(results, g.file, want, f"{g.case!r} {g.mode}", (None, DIAGNOSTIC))
    figure = f"{_tokens_per_s(m['case']):.0f} tokens/s"
    return [DIAGNOSTIC, g.what, figure, *_source(g.file, results[g.file])]


def newest_user_path(results: dict[str, dict]) -> list[str]:
    """The newest file (by date, then name) of each (bench, device) that holds user path rows."""
    newest: dict[tuple[str, str], tuple[str, str]] = {}
    for name, data in results.items():
        if any(kind(m) == USER_PATH for m in data["results"]):
            key, when = (data["name"], data["device"]["name"]), (data["device"]["date"], name)
            newest[key] = max(newest.get(key, when), when)
    return sorted(name for _, name in newest.values())


def user_path_rows(results: dict[str, dict]) -> list[list[str]]:
    """ftlab's user path rows, each beside llama.cpp's row of the same case in the same file."""
    rows = []
    for name in newest_user_path(results):
        data = results[name]
        llama = {_stem(m["case"]): m["case"] for m in data["results"] if m["backend"] == LLAMA_CPP}
        for m in (m for m in data["results"] if kind(m) == USER_PATH):
            case = _stem(m["case"])
            ours, theirs = _tokens_per_s(m["case"]), _tokens_per_s(llama.get(case, ""))
            cells = [
                # a row without a rate: its figure as the case gives it (a load's seconds, a
                # perplexity), else its time
                f"{ours:.0f} tokens/s"
                if ours
                else (
                    m["case"].split(":", 1)[1].strip() if ":" in m["case"] else _time(m["time_us"])
                ),
                f"{theirs:.0f} tokens/s" if theirs else "-",
                f"{ours / theirs:.2f}x" if ours and theirs else "-",
            ]
            model = data["name"].removeprefix("model-gguf-")
            rows.append([model, case, *cells, *_source(name, data)])
    return rows


def results_section(results: dict[str, dict]) -> str:
    """The README's results: kernels, the engine through its public API, diagnostics."""
    source = ["device", "run", "file"]
    kernels = [kernel_row(results, k) for k in KERNELS]
    users = user_path_rows(results)
    engine = ["model", "case", "ftlab (public API)", "llama.cpp (same file, same run)", "ratio"]
    diagnostics = [diagnostic_row(results, g) for g in DIAGNOSTICS]
    return "\n\n".join(
        [
            "**Kernels** (% of the copy bandwidth measured in the same run):",
            _table(["op", "what", "ftlab", "against", "timed", *source], kernels),
            "**The engine through its public API, beside llama.cpp** (`ftlab bench model --gguf "
            f"FILE --llama-bench BIN`, measurements of kind `{USER_PATH}`):",
            _table([*engine, *source], users) if users else "None committed yet.",
            "**Diagnostic** (the model bench calling a model directly, with no llama.cpp beside "
            "it: no public API path replays a prefill from a graph):",
            _table(["kind", "what", "ftlab", *source], diagnostics),
        ]
    )


def op_table() -> str:
    """One row per op of the routing table: family, what it computes, backends, contract."""
    from ftlab import backends, catalog

    rows = []
    for op in sorted(backends.ops(), key=lambda op: (backends.spec(op).family, op)):
        d = catalog.describe(op)
        impls = [n if i["auto"] else f"{n} (by name)" for n, i in d["implementations"].items()]
        docs = f"[OPS.md]({d['docs']})"
        rows.append([f"`{d['family']}`", f"`{op}`", d["summary"], ", ".join(impls), docs])
    return _table(["family", "op", "what it computes", "backends", "contract"], rows)


def sections(results: dict[str, dict]) -> dict[str, str]:
    """The generated sections by marker name."""
    return {"ops": op_table(), "results": results_section(results)}


def render(readme: str, parts: dict[str, str]) -> str:
    """``readme`` with each part between its markers; ValueError where a marker pair is missing."""
    for name, body in parts.items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        if (
            readme.count(begin) != 1
            or readme.count(end) != 1
            or readme.index(begin) > readme.index(end)
        ):
            raise ValueError(f"README must hold {begin} then {end}, once each")
        head, rest = readme.split(begin)
        readme = f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}"
    return readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the sections in the README")
    action.add_argument("--check", action="store_true", help="exit 1 where the README differs")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    parts = sections(load_results(args.results))
    if not (args.write or args.check):
        print("\n\n".join(parts.values()))
        return 0
    old = args.readme.read_text()
    new = render(old, parts)
    if args.write:
        args.readme.write_text(new)
        return 0
    if new != old:
        diff = difflib.unified_diff(
            old.splitlines(True), new.splitlines(True), "README", "rendered"
        )
        sys.stdout.writelines(diff)
        print(f"{args.readme} differs from what {Path(__file__).name} renders: run it with --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

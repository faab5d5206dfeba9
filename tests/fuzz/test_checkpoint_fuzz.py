"""Fuzz the checkpoint loaders with seeded mutations of the tiny model (tests/fuzz/runner.py
says what every case must do: refuse with ftlab's own error naming the file, or load and
give finite logits; no other exception, no hang, no crash, no unbounded allocation).

- ``test_fuzz`` is the CI run: CI_CASES cases per checkpoint (14000 in all), ~35 s on 2 cores.
- ``test_fuzz_long`` runs ``FTLAB_FUZZ_CASES`` cases per checkpoint (seeds from
  ``FTLAB_FUZZ_SEED``, default 100000: not the CI run's). CI runs ``pytest -q tests``, slow
  tests included, so besides the ``slow`` marker it is skipped unless FTLAB_FUZZ_CASES is set:
  ``FTLAB_FUZZ_CASES=50000 pytest -q -s tests/fuzz -k long``.
- Each run prints its counts by mutation kind (``-s`` shows them) and, with
  ``FTLAB_FUZZ_REPORT=<file>``, appends them to that file as JSON lines.
- A failing case is reported with its seed, its mutation and the command that replays it.
"""

import json
import os
import shutil

import pytest

from ftlab.models import tiny
from tests.fuzz import runner

CI_CASES = {"gguf-f32": 3000, "gguf-q4_0": 3000, "hf": 8000}
SEED_BASE = {"gguf-f32": 0, "gguf-q4_0": 1_000_000, "hf": 2_000_000}  # distinct cases per target
WORKERS = min(2, len(os.sched_getaffinity(0)))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A private copy of the tiny model: the cache directory is shared."""
    path = tmp_path_factory.mktemp("tiny")
    for name in ("config.json", "model.safetensors", "model-f32.gguf", "model-q4_0.gguf"):
        shutil.copy(tiny.ensure("tiny-qwen3-moe") / name, path / name)
    return path


def fuzz(target: str, seeds: list[int], source, work) -> runner.FuzzReport:
    report = runner.run(target, source, seeds, work, workers=WORKERS)
    print("\n" + report.table())
    if os.environ.get("FTLAB_FUZZ_REPORT"):
        counts = {r["kind"] + " " + r["outcome"]: 0 for r in report.records}
        for r in report.records:
            counts[r["kind"] + " " + r["outcome"]] += 1
        with open(os.environ["FTLAB_FUZZ_REPORT"], "a") as f:
            f.write(
                json.dumps(
                    {
                        "target": target,
                        "cases": len(report.records),
                        "seconds": round(report.seconds, 1),
                        "counts": counts,
                    }
                )
                + "\n"
            )
    failures = report.failures
    assert len(report.records) == len(seeds), "every seed has a record"
    lines = [
        f"seed {r['seed']} ({r['kind']}): {r['detail']}\n    {r['outcome']}\n    "
        + (r["error"] or "").strip().replace("\n", "\n    ")[-1500:]
        + f"\n    replay: python -m tests.fuzz.runner --target {target} --seed {r['seed']}"
        for r in failures[:10]
    ]
    assert not failures, f"{len(failures)} of {len(seeds)} cases failed:\n" + "\n".join(lines)
    return report


@pytest.mark.parametrize("target", list(CI_CASES))
def test_fuzz(target, source, tmp_path):
    base = SEED_BASE[target]
    report = fuzz(target, list(range(base, base + CI_CASES[target])), source, tmp_path)
    kinds = {r["kind"] for r in report.records}
    assert len(kinds) >= 9, f"every mutation kind is drawn, got {sorted(kinds)}"
    assert any(r["outcome"] == "loaded" for r in report.records)


@pytest.mark.slow
@pytest.mark.skipif("FTLAB_FUZZ_CASES" not in os.environ, reason="set FTLAB_FUZZ_CASES=<n> to run")
@pytest.mark.parametrize("target", list(CI_CASES))
def test_fuzz_long(target, source, tmp_path):
    start = SEED_BASE[target] + int(os.environ.get("FTLAB_FUZZ_SEED", "100000"))
    fuzz(target, list(range(start, start + int(os.environ["FTLAB_FUZZ_CASES"]))), source, tmp_path)


def test_the_harness_catches_crash_hang_timeout_and_memory(source, tmp_path):
    """The detectors themselves: faults injected in place of cases 1..4 fail exactly those
    cases (the 2 GiB allocation would succeed without the 1 GiB address-space headroom), the
    worker is replaced after a crash or hang, and the other cases still run."""
    faults = {1: "segfault", 2: "hang", 3: "slow", 4: "memory"}
    report = runner.run(
        "hf",
        source,
        list(range(6)),
        tmp_path,
        workers=1,
        case_seconds=1.0,
        hang_seconds=4.0,
        headroom_gib=1.0,
        inject=faults,
    )
    outcomes = {r["seed"]: r["outcome"] for r in report.records}
    assert sorted(outcomes) == list(range(6))
    assert outcomes[1] == "failed: worker exited with -11 (signal 11)"
    assert outcomes[2] == "failed: hang: no progress for 4 s"
    assert outcomes[3] == "failed: timeout"
    assert outcomes[4] == "failed: MemoryError"
    assert not outcomes[0].startswith("failed") and not outcomes[5].startswith("failed")

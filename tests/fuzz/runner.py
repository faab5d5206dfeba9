"""Checkpoint fuzzing: seeded mutations (:mod:`ftlab.testing.checkpoint_fuzz`) of the tiny
models, loaded in worker subprocesses that hold every case to the loaders' contract.

A case passes when loading either raises ftlab's own error naming the file (GGUFError for a
GGUF file, CheckpointError for a HF directory) or succeeds and gives finite logits for a
short prompt. Non-finite logits are accepted only from a mutation of stored values
(``Mutation.values_only``): the loaders do not scan values, by design. Any other exception
(IndexError, struct.error, MemoryError, a torch RuntimeError...) fails the case, as does a
case that runs past its time limit (an alarm in the worker; a watchdog in the parent for a
hang that never returns to Python), and a worker that dies (a segfault): the parent reports
the seed and mutation of the case in flight and starts a new worker on the seeds left. Each
worker runs under an address-space limit a few GiB above its own size after warm-up, so an
unbounded allocation fails as MemoryError instead of swapping the machine to death.

Replay one case: ``python -m tests.fuzz.runner --target gguf-f32 --seed 123`` (from the
repository root) prints the mutation and the outcome, with the traceback of a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {"gguf-f32": "model-f32.gguf", "gguf-q4_0": "model-q4_0.gguf", "hf": "."}


class CaseTimeout(BaseException):
    """A case ran past its time limit (BaseException: no ``except Exception`` swallows it)."""


def _alarm(signum, frame):
    raise CaseTimeout()


def check_case(target: str, path: Path, mutation) -> str:
    """Load ``path`` (``mutation``'s copy) as ``target`` does and return the outcome ("loaded",
    "loaded, non-finite logits" or "refused: <error class>"); raise when the case breaks the
    contract: a copy that asks for what ftlab does not compute (``mutation.unsupported``) must
    be refused."""
    import torch

    from ftlab.formats import CheckpointError
    from ftlab.formats.gguf import GGUFError, open_gguf
    from ftlab.models.loader import load_gguf, load_hf
    from ftlab.models.qwen3_moe import Qwen3Moe
    from ftlab.models.tokenizer import Tokenizer

    expected = CheckpointError if target == "hf" else GGUFError
    try:
        if target == "hf":
            config, weights = load_hf(path, progress=False)  # dtype: the config's
        else:
            config, weights = load_gguf(path, dtype=torch.float32, progress=False)
            Tokenizer.from_gguf(open_gguf(path))
    except expected as e:
        if str(path) not in str(e):
            raise AssertionError(f"the error does not name {path}: {e}") from e
        return f"refused: {type(e).__name__}"
    if mutation.unsupported:
        raise AssertionError("loaded, but it asks for what ftlab does not compute: refuse it")
    tokens = torch.arange(1, 5)[None] % config.vocab_size
    logits = Qwen3Moe(config, weights, max_seq_len=8).forward(tokens, torch.arange(4)[None])
    if bool(torch.isfinite(logits).all()):
        return "loaded"
    if not mutation.values_only:
        raise AssertionError("loaded, but the logits are not finite")
    return "loaded, non-finite logits"


def _mutator(target: str, source: Path):
    from ftlab.testing.checkpoint_fuzz import GGUFMutator
    from ftlab.testing.hf_fuzz import HFMutator

    return HFMutator(source) if target == "hf" else GGUFMutator(source / TARGETS[target])


def _prepare(target: str, mutator, seed: int, case_dir: Path):
    """Write case ``seed`` into ``case_dir``; the path to load and the mutation."""
    shutil.rmtree(case_dir, ignore_errors=True)
    case_dir.mkdir(parents=True)
    if target == "hf":
        return case_dir, mutator.mutate(seed, case_dir)
    data, mutation = mutator.mutate(seed)
    path = case_dir / "model.gguf"
    path.write_bytes(data)
    return path, mutation


def _emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _inject(fault: str) -> str:
    """A fault of the kind the harness must catch, in place of a case (its self-test)."""
    if fault == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":  # stuck where the alarm cannot reach, as in a native loop
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    if fault in ("hang", "slow"):
        time.sleep(3600)
    if fault == "memory":  # 2 GiB: more than the self-test's headroom, less than the machine
        return str(len(bytearray(2**31)))
    raise ValueError(f"fault must be segfault, hang, slow or memory, got {fault!r}")


def worker(
    target: str,
    source: Path,
    seeds: list[int],
    work: Path,
    case_seconds: float,
    headroom_gib: float,
    inject: dict[int, str],
) -> None:
    """Run ``seeds`` in this process, one JSON line before ("start") and after each case;
    ``inject``: seed -> fault run instead of that case."""
    import torch

    import ftlab
    from ftlab.testing.checkpoint_fuzz import Mutation

    torch.set_num_threads(1)
    mutator = _mutator(target, source)
    warm = source if target == "hf" else source / TARGETS[target]
    unmutated = Mutation("none", "the checkpoint as it is")
    assert check_case(target, warm, unmutated) == "loaded", "the unmutated checkpoint must load"
    _emit({"worker": os.getpid(), "ftlab": ftlab.__file__})
    limit = _vm_bytes() + int(headroom_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    signal.signal(signal.SIGALRM, _alarm)
    for seed in seeds:
        # the seed is in flight from here: a worker lost while mutating fails this seed, not the run
        _emit({"start": seed, "kind": "mutating", "detail": "writing the mutated copy"})
        try:
            path, mutation = _prepare(target, mutator, seed, work / "case")
        except Exception:
            _emit(
                {
                    "seed": seed,
                    "kind": "mutating",
                    "detail": "writing the mutated copy",
                    "outcome": "failed: mutating",
                    "error": traceback.format_exc(limit=-8),
                    "seconds": 0.0,
                }
            )
            continue
        _emit({"start": seed, "kind": mutation.kind, "detail": mutation.detail})
        t0, error = time.perf_counter(), None
        signal.setitimer(signal.ITIMER_REAL, case_seconds)
        try:
            if seed in inject:
                outcome = _inject(inject[seed])
            else:
                outcome = check_case(target, path, mutation)
        except CaseTimeout:
            outcome, error = "failed: timeout", f"ran past {case_seconds} s"
        except BaseException as e:  # every other exception fails the case
            outcome, error = f"failed: {type(e).__name__}", traceback.format_exc(limit=-8)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        _emit(
            {
                "seed": seed,
                "kind": mutation.kind,
                "detail": mutation.detail,
                "outcome": outcome,
                "error": error,
                "seconds": round(time.perf_counter() - t0, 4),
            }
        )


@dataclass
class FuzzReport:
    """Per-case records of a run, and the counts to quote."""

    target: str
    records: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.records if r["outcome"].startswith("failed")]

    def table(self) -> str:
        """Cases by mutation kind: how many loaded (finite logits), loaded with non-finite logits
        (values only), were refused, failed."""
        rows: dict[str, Counter] = defaultdict(Counter)
        for r in self.records:
            o = r["outcome"]
            col = (
                "failed" if o.startswith("failed") else "refused" if o.startswith("refused") else o
            )
            rows[r["kind"]][col] += 1
            rows["total"][col] += 1
        cols = {
            "loaded": "loaded",
            "loaded, non-finite logits": "nonfinite",
            "refused": "refused",
            "failed": "failed",
        }
        lines = [
            f"{self.target}: {len(self.records)} cases in {self.seconds:.1f} s",
            f"  {'kind':24} {'cases':>6} " + " ".join(f"{c:>9}" for c in cols.values()),
        ]
        for kind in sorted(rows, key=lambda k: (k == "total", k)):
            n = sum(rows[kind].values())
            lines.append(f"  {kind:24} {n:6} " + " ".join(f"{rows[kind][c]:9}" for c in cols))
        return "\n".join(lines)


def _spawn(
    target: str,
    source: Path,
    seeds: list[int],
    work: Path,
    case_seconds: float,
    headroom_gib: float,
    inject: dict[int, str],
    log,
) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "tests.fuzz.runner",
        "--worker",
        "--target",
        target,
        "--source",
        str(source),
        "--work",
        str(work),
        "--case-seconds",
        str(case_seconds),
        "--headroom-gib",
        str(headroom_gib),
        "--seeds",
        ",".join(map(str, seeds)),
        "--inject",
        ",".join(f"{s}:{f}" for s, f in inject.items()),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    # unbuffered: the parent reads what the pipe holds and splits the lines itself (a buffered
    # readline could keep a second line in its buffer, where select no longer sees it)
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, bufsize=0)


def run(
    target: str,
    source: Path,
    seeds: list[int],
    work: Path,
    workers: int = 2,
    case_seconds: float = 10.0,
    hang_seconds: float = 60.0,
    headroom_gib: float = 3.0,
    inject: dict[int, str] | None = None,
    startup_seconds: float = 120.0,
) -> FuzzReport:
    """Fuzz ``target`` of the tiny model in ``source`` with ``seeds``, spread over ``workers``
    subprocesses (see the module docstring for what a case must do). ``inject``: seed -> a
    fault ("segfault", "hang", "slow", "memory") run instead of that case, to test the
    harness itself. A worker has ``startup_seconds`` (or ``hang_seconds`` if longer) for its first
    line (importing torch and ftlab, loading the unmutated checkpoint: seconds on a loaded 2-core
    machine), then ``hang_seconds`` between lines."""
    report, t0 = FuzzReport(target), time.perf_counter()
    queues = [seeds[i::workers] for i in range(workers)]
    selector = selectors.DefaultSelector()

    def start(i: int, todo: list[int]) -> None:
        if todo:
            log = open(work / f"worker-{i}.log", "a")  # closed when the worker ends
            proc = _spawn(
                target,
                source,
                todo,
                work / f"worker-{i}",
                case_seconds,
                headroom_gib,
                inject or {},
                log,
            )
            state = {
                "i": i,
                "todo": todo,
                "current": None,
                "seen": time.monotonic(),
                "log": log,
                "ready": False,
                "pending": b"",
            }
            selector.register(proc.stdout, selectors.EVENT_READ, (proc, state))

    def lost(proc, state, why: str) -> None:
        """The worker died or hung: fail the case in flight, go on with the seeds after it."""
        selector.unregister(proc.stdout)
        proc.kill()
        proc.wait()
        state["log"].close()
        current = state["current"]
        if current is None:  # died before its first case: nothing more to learn from it
            tail = (work / f"worker-{state['i']}.log").read_text()[-3000:]
            raise RuntimeError(f"fuzz worker for {target} failed to start: {why}\n{tail}")
        report.records.append(
            {
                "seed": current["start"],
                "kind": current["kind"],
                "detail": current["detail"],
                "outcome": f"failed: {why}",
                "error": why,
                "seconds": None,
            }
        )
        start(state["i"], state["todo"][state["todo"].index(current["start"]) + 1 :])

    for i, todo in enumerate(queues):
        start(i, todo)
    while selector.get_map():
        for key, _ in selector.select(timeout=1.0):
            proc, state = key.data
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                code = proc.wait()
                if state["current"] is not None or code != 0:
                    lost(
                        proc,
                        state,
                        f"worker exited with {code} (signal {-code})"
                        if code < 0
                        else f"worker exited with {code}",
                    )
                else:
                    if state["pending"]:
                        raise RuntimeError(
                            f"fuzz worker for {target} ended mid-line: {state['pending'][-200:]!r}"
                        )
                    selector.unregister(proc.stdout)
                    state["log"].close()
                continue
            state["seen"], state["ready"] = time.monotonic(), True
            *lines, state["pending"] = (state["pending"] + chunk).split(b"\n")
            for line in lines:
                record = json.loads(line)
                if "start" in record:
                    state["current"] = record
                elif "outcome" in record:
                    state["current"] = None
                    report.records.append(record)
                elif not record["ftlab"].startswith(str(ROOT)):
                    raise RuntimeError(
                        f"the worker imported {record['ftlab']}, not the ftlab of {ROOT}"
                    )
        for key in list(selector.get_map().values()):
            proc, state = key.data
            allowed = hang_seconds if state["ready"] else max(hang_seconds, startup_seconds)
            if time.monotonic() - state["seen"] > allowed:
                lost(proc, state, f"hang: no progress for {allowed:.0f} s")
    report.seconds = time.perf_counter() - t0
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=sorted(TARGETS), required=True)
    p.add_argument("--seed", type=int, help="replay this one case here, in this process")
    p.add_argument("--source", type=Path, help="tiny model directory (default: tiny.ensure())")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seeds", help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--case-seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    p.add_argument("--headroom-gib", type=float, default=3.0, help=argparse.SUPPRESS)
    p.add_argument("--inject", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        seeds = [int(s) for s in args.seeds.split(",")]
        inject = {int(s): f for s, f in (x.split(":") for x in args.inject.split(",") if x)}
        worker(
            args.target, args.source, seeds, args.work, args.case_seconds, args.headroom_gib, inject
        )
        return
    import tempfile

    from ftlab.models import tiny

    source = args.source or tiny.ensure("tiny-qwen3-moe")
    with tempfile.TemporaryDirectory() as tmp:
        path, mutation = _prepare(args.target, _mutator(args.target, source), args.seed, Path(tmp))
        print(f"seed {args.seed}: {mutation.kind}: {mutation.detail}")
        print(check_case(args.target, path, mutation))


if __name__ == "__main__":
    main()

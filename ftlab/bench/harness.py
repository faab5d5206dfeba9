"""Benchmark harness shared by every op: validate, then time, and report bandwidth next to
the device-to-device copy bandwidth measured in the same run (the practical roofline).

Timing uses CUDA/HIP events around many launches after warm-up and reports the median.
Results go to ``benchmarks/results/<date>-<device>-<name>.json|md`` with the device,
arch, driver, torch/Triton versions and the git commit.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ftlab import backends
from ftlab import platform as ftplatform

RESULTS_DIR = Path("benchmarks") / "results"
#: weight bytes a captured graph reads at the least, over rotated copies of a weight that fits in
#: L2 (:func:`rotation`), so that every call reads DRAM
ROTATE_BYTES = 256 << 20
#: at least this many calls per captured graph, so that the gap between graph replays is spread
#: thin (at 2 calls a graph it showed in the Q4_0 lm_head's per-call time)
MIN_INNER = 8


@dataclass
class Measurement:
    case: str  # e.g. "store decode L=64 D=1024"
    backend: str  # "hip", "triton", "torch: index_copy_", ...
    time_us: float
    bytes_moved: int
    validated: bool  # output checked against the reference before timing
    mode: str = "eager"  # "eager": host launch included; "graph": replayed from a captured graph
    flops: int = 0  # arithmetic of one call, where compute matters
    # "user path": the engine through its public API (ftlab.bench.user_path); "diagnostic": a
    # model called directly, or a pass no public API takes; "": a kernel row
    kind: str = ""
    call: str = ""  # the public call a user path row times ("Pipeline.prefill", ...)

    @property
    def tflops(self) -> float:
        return self.flops / (self.time_us * 1e-6) / 1e12

    @property
    def gbps(self) -> float:
        return self.bytes_moved / (self.time_us * 1e-6) / 1e9


@dataclass
class Report:
    name: str
    device: dict
    copy_gbps: float
    measurements: list[Measurement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    copy_what: str = "device-to-device"  # whose copy bandwidth copy_gbps is

    @classmethod
    def for_device(cls, name: str, notes: list[str], device: torch.device | str = "cuda") -> Report:
        """The empty report ``name`` of a bench that times ``device``, with a copy of ``notes``:
        the device's description and the copy bandwidth measured now -- device-to-device on a GPU
        (raises without one: :func:`require_gpu`), the host memory's on the CPU."""
        if torch.device(device).type != "cuda":
            return cls(name, device_info(), host_copy_gbps(), notes=list(notes), copy_what="host")
        require_gpu()
        return cls(name, device_info(), copy_bandwidth(), notes=list(notes))

    @classmethod
    def from_json(cls, data: dict) -> Report:
        keep = {
            "case",
            "backend",
            "time_us",
            "bytes_moved",
            "validated",
            "mode",
            "flops",
            "kind",
            "call",
        }
        rows = [Measurement(**{k: v for k, v in r.items() if k in keep}) for r in data["results"]]
        return cls(data["name"], data["device"], data["copy_gbps"], rows, data.get("notes", []))

    def to_json(self) -> dict:
        rows = []
        for m in self.measurements:
            rows.append(
                dict(
                    asdict(m),
                    gbps=round(m.gbps, 1),
                    pct_of_copy=round(100 * m.gbps / self.copy_gbps, 1),
                    **({"tflops": round(m.tflops, 1)} if m.flops else {}),
                )
            )
        return {
            "name": self.name,
            "device": self.device,
            "copy_gbps": round(self.copy_gbps, 1),
            "notes": self.notes,
            "results": rows,
        }

    def markdown(self) -> str:
        d = self.device
        lines = [
            f"# ftlab bench {self.name}",
            "",
            f"- device: {d['name']} ({d['arch']}), driver {d.get('driver', '?')}",
            f"- torch {d['torch']}, triton {d.get('triton', '-')}, ftlab commit "
            f"{d.get('commit', '?')}",
            f"- date: {d['date']}",
            f"- {self.copy_what} copy bandwidth measured in this run: **{self.copy_gbps:.0f} "
            "GB/s** (bytes read + written)",
            "",
        ]
        with_flops = any(m.flops for m in self.measurements)
        with_kind = any(m.kind for m in self.measurements)
        extra = " TFLOP/s |" if with_flops else ""
        first = "| kind " if with_kind else ""
        lines.append(
            first
            + "| case | backend | mode | time (us) | GB/s | % of copy |"
            + extra
            + " validated |"
        )
        lines.append(
            ("|---" if with_kind else "")
            + "|---|---|---|---:|---:|---:|"
            + ("---:|" if with_flops else "")
            + "---|"
        )
        for m in self.measurements:
            tf = f" {m.tflops:.1f} |" if with_flops else ""
            kind = f"| {m.kind or '-'} " if with_kind else ""
            lines.append(
                f"{kind}| {m.case} | {m.backend} | {m.mode} | {m.time_us:.2f} | {m.gbps:.0f} | "
                f"{100 * m.gbps / self.copy_gbps:.1f} |{tf} {'yes' if m.validated else 'no'} |"
            )
        if self.notes:
            lines += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def table(self) -> str:
        md = self.markdown()
        return md[md.index("| case") :]

    def write(self, out_dir: Path = RESULTS_DIR) -> tuple[Path, Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        slug = re.sub(r"[^a-z0-9]+", "-", self.device["name"].lower()).strip("-")
        stem = out_dir / f"{self.device['date']}-{slug}-{self.name}"
        json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
        json_path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        md_path.write_text(self.markdown())
        return json_path, md_path


def require_gpu() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(
            "ftlab bench needs a CUDA or ROCm GPU: timings from a CPU are not reported"
        )


def gpu_backends(op: str, dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """The GPU backends (``hip``, then ``triton``) that serve ``op`` on the GPU for ``dtype``."""
    dev = torch.device("cuda")
    return [b for b in ("hip", "triton") if b in backends.available_backends(op, dev, dtype)]


def rotation(nbytes: int) -> tuple[int, int]:
    """(copies, calls per captured graph) for a weight of ``nbytes`` that each call reads once:
    copies (1 to 32) until a graph reads :data:`ROTATE_BYTES`, and a whole number of rounds over
    them of at least :data:`MIN_INNER` calls."""
    copies = max(1, min(32, -(-ROTATE_BYTES // nbytes)))
    return copies, copies * -(-MIN_INNER // copies)


def device_info() -> dict:
    plat = ftplatform.current()
    info = {
        "name": torch.cuda.get_device_name() if torch.cuda.is_available() else plat.name,
        "arch": plat.arch or "cpu",
        "torch": torch.__version__,
        "date": dt.date.today().isoformat(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    build = ftplatform.torch_build() or ""
    if build.startswith("ROCm"):
        info["driver"] = build.replace("ROCm/", "")
    else:
        try:
            info["driver"] = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                .stdout.strip()
                .splitlines()[0]
            )
        except (OSError, IndexError, subprocess.SubprocessError):
            info["driver"] = f"CUDA {torch.version.cuda}"
    if os.environ.get("FTLAB_COMMIT"):  # a copy of the tree without .git (e.g. a remote GPU box)
        info["commit"] = os.environ["FTLAB_COMMIT"]
        return info
    try:
        root = Path(__file__).resolve().parents[2]
        info["commit"] = (
            subprocess.run(
                ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        info["commit"] = "unknown"
    return info


def time_us(fn: Callable[[], object], warmup: int = 10, reps: int = 50, inner: int = 1) -> float:
    """Median time of one ``fn()`` in microseconds, from device events.

    ``inner`` calls are timed together per sample (for launches too short to time alone).
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / inner)
    return statistics.median(samples)


def wall_us(fn: Callable[[], object], warmup: int = 1, reps: int = 10) -> float:
    """Median host wall time of one ``fn()`` in microseconds, from the call until the device is
    done with it (synchronized): what an eager call costs its caller, launches included."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def capture(fn: Callable[[], object], warmup: int = 3) -> tuple[Callable[[], None], object]:
    """``fn`` (no host synchronization) captured in a CUDA/HIP graph on the current device after
    ``warmup`` calls on a side stream (compiles and allocations outside the capture): (replay,
    what the captured call returned -- tensors each replay overwrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def time_graph_us(fn: Callable[[], object], inner: int = 20, reps: int = 50) -> float:
    """Median device time of one ``fn()`` in microseconds, replaying a CUDA/HIP graph that
    holds ``inner`` calls: what a captured decode step pays, without host launch cost."""
    # >= 3 warm-up calls
    replay, _ = capture(lambda: [fn() for _ in range(inner)], warmup=-(-3 // inner))
    return time_us(replay, warmup=3, reps=reps) / inner


def host_copy_gbps(nbytes: int = 1 << 26) -> float:
    """Host memory copy bandwidth in GB/s (bytes read + written): the median of five torch copies
    of ``nbytes`` after one that touches the destination's pages."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        samples.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(samples) / 1e9


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = time_us(lambda: dst.copy_(src), warmup=5, reps=30)
    return 2 * nbytes / (t * 1e-6) / 1e9

"""Compile every kernel for every target without a GPU and report its resources.

- HIP device code (``hip/csrc/<op>.hip``, which includes only ``port.h``) is compiled
  device-only with clang-19 for each gfx target (bare-clang branch of port.h, no ROCm)
  and with nvcc for sm_90.
- Triton kernels are compiled with ``triton.compile(ASTSource(...), target=GPUTarget(...))``
  for the same targets, for the configurations each ``ftlab/triton/*.py`` module lists in its
  ``compile_specs(target)`` (built from the kernels' own signatures, ``ftlab.triton.compile_spec``).
  That must happen in a process where TRITON_INTERPRET is unset: :func:`triton_rows`
  runs in a child process.

Each row: registers, spills, scratch and LDS per kernel per target. A row fails on any
spill or scratch (unless ``BUDGETS`` allows it) and on LDS over the chip's limit.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ftlab import platform as ftplatform

CSRC = Path(__file__).resolve().parent / "hip" / "csrc"
TARGETS = ftplatform.GFX_CHECK_TARGETS + ftplatform.SM_CHECK_TARGETS
#: kernel name prefix -> allowed scratch bytes (none so far: every kernel must not spill)
BUDGETS: dict[str, int] = {}


def triton_modules() -> list[str]:
    """Every ``ftlab.triton`` module that lists compile specs (a ``compile_specs`` function),
    found in the package rather than listed by hand."""
    import ftlab.triton

    names = [f"ftlab.triton.{info.name}" for info in pkgutil.iter_modules(ftlab.triton.__path__)]
    return sorted(n for n in names if hasattr(importlib.import_module(n), "compile_specs"))


def family(stem: str) -> str:
    """The op family a kernel source or Triton module belongs to (``moe_gemm`` -> ``moe``,
    ``q4_0_matvec`` -> ``q4_0``): the longest family name of the routing table it starts with;
    a source of no op family (the hybrid handshake) is its own."""
    from ftlab import backends

    names = {backends.spec(op).family for op in backends.ops()}
    found = [f for f in names if stem == f or stem.startswith(f + "_")]
    return max(found, key=len) if found else stem


@dataclass
class Row:
    backend: str  # "hip" | "triton"
    kernel: str  # readable name with its configuration
    target: str
    vgpr: int | None = None  # vector registers (NVIDIA: registers per thread)
    sgpr: int | None = None  # scalar registers (AMD only)
    spill: int = 0  # spilled registers (AMD) or spill bytes (NVIDIA)
    scratch: int = 0  # private / stack bytes per thread
    lds: int = 0  # shared memory bytes per block
    error: str = ""
    module: str = ""  # op family: "moe" for csrc/moe_gemm.hip and triton/moe_route.py

    @property
    def lds_limit(self) -> int:
        return ftplatform.ARCHS[self.target].lds_bytes

    @property
    def problems(self) -> list[str]:
        out = [self.error] if self.error else []
        allowed = next((b for p, b in BUDGETS.items() if self.kernel.startswith(p)), 0)
        if self.spill:
            out.append(f"{self.spill} spilled")
        if self.scratch > allowed:
            out.append(f"scratch {self.scratch} B > budget {allowed} B")
        if self.lds > self.lds_limit:
            out.append(f"LDS {self.lds} B > {self.lds_limit} B")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems


# ------------------------------------------------------------------ HIP


def clang() -> str | None:
    return shutil.which("clang-19")


def nvcc() -> str | None:
    from ftlab import jit

    try:
        return str(jit.find_gpu_toolchain("cuda").compiler)
    except jit.ToolchainError:
        return shutil.which("nvcc")


def device_sources() -> list[Path]:
    return sorted(p for p in CSRC.glob("*.hip") if not p.stem.endswith("_launch"))


def _demangle(names: list[str]) -> dict[str, str]:
    filt = shutil.which("c++filt")
    if not filt or not names:
        return {n: n for n in names}
    out = subprocess.run(
        [filt], input="\n".join(names), capture_output=True, text=True
    ).stdout.split("\n")
    return {n: _short(d) for n, d in zip(names, out, strict=False)}


def _short(name: str) -> str:
    """``void ftlab::index_rows_kernel<ftlab::bytes16, int>(...)`` -> ``index_rows_kernel<bytes16,
    int32>``."""
    name = re.sub(r"^void ", "", name)
    name = name[: name.index(">(") + 1] if ">(" in name else name.split("(")[0]
    for long_name, short in (
        ("ftlab::", ""),
        ("unsigned int __vector(4)", "bytes16"),
        ("unsigned int __vector(2)", "bytes8"),
        ("uint4", "bytes16"),
        ("uint2", "bytes8"),
        ("unsigned char", "bytes1"),
        ("unsigned short", "bytes2"),
        ("unsigned int", "bytes4"),
        (", long>", ", int64>"),
        (", int>", ", int32>"),
    ):
        name = name.replace(long_name, short)
    return name


def hip_gfx_rows(source: Path, gfx: str) -> list[Row]:
    cmd = [
        clang(),
        "-x",
        "hip",
        f"--offload-arch={gfx}",
        "--offload-device-only",
        "-nogpuinc",
        "-nogpulib",
        "-O3",
        "-S",
        "-o",
        os.devnull,
        f"-I{CSRC}",
        "-Rpass-analysis=kernel-resource-usage",
        str(source),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        return [_compile_failure(source, gfx, "clang-19", res.stderr)]
    rows: dict[str, Row] = {}
    current = None
    for line in res.stderr.splitlines():
        m = re.search(r"remark:\s+Function Name: (\S+)", line)
        if m:
            current = rows.setdefault(m.group(1), Row("hip", m.group(1), gfx))
            continue
        m = re.search(
            r"remark:\s+(SGPRs|VGPRs|ScratchSize \[bytes/lane\]|SGPRs Spill|VGPRs Spill|"
            r"LDS Size \[bytes/block\]): (\d+)",
            line,
        )
        if m and current is not None:
            key, value = m.group(1), int(m.group(2))
            if key == "SGPRs":
                current.sgpr = value
            elif key == "VGPRs":
                current.vgpr = value
            elif key.startswith("ScratchSize"):
                current.scratch = value
            elif key.endswith("Spill"):
                current.spill += value
            else:
                current.lds = value
    return _finish(rows, source, gfx)


def hip_sm_rows(source: Path, sm: str) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            nvcc(),
            "-x",
            "cu",
            f"-arch={sm}",
            "--resource-usage",
            "-c",
            "-o",
            f"{tmp}/k.o",
            f"-I{CSRC}",
            str(source),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        return [_compile_failure(source, sm, "nvcc", res.stderr)]
    rows: dict[str, Row] = {}
    current = None
    for line in (res.stdout + res.stderr).splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = rows.setdefault(m.group(1), Row("hip", m.group(1), sm))
            continue
        m = re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
        )
        if m and current is not None:
            current.scratch = int(m.group(1))
            current.spill = int(m.group(2)) + int(m.group(3))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current is not None:
            current.vgpr = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            current.lds = int(s.group(1)) if s else 0
    return _finish(rows, source, sm)


def _compile_failure(source: Path, target: str, tool: str, stderr: str) -> Row:
    return Row(
        "hip",
        source.stem,
        target,
        error=f"{tool} failed: {stderr.strip()[-2000:]}",
        module=family(source.stem),
    )


def _finish(rows: dict[str, Row], source: Path, target: str) -> list[Row]:
    names = _demangle(list(rows))
    for mangled, row in rows.items():
        row.kernel = names[mangled]
        row.module = family(source.stem)
    return list(rows.values()) or [
        Row("hip", source.stem, target, error="no kernels were emitted", module=family(source.stem))
    ]


def hip_rows(
    targets: tuple[str, ...] = TARGETS, only: tuple[str, ...] | None = None
) -> tuple[list[Row], list[str]]:
    """Rows for every HIP kernel and target (of the device sources named in ``only``, by stem,
    when given), and notes on what could not be checked."""
    rows: list[Row] = []
    notes: list[str] = []
    for source in device_sources():
        if only is not None and source.stem not in only:
            continue
        for target in targets:
            if target.startswith("gfx"):
                if clang() is None:
                    notes.append(
                        f"clang-19 not found: HIP {source.name} not compile-checked for {target}"
                    )
                    continue
                rows += hip_gfx_rows(source, target)
            else:
                if nvcc() is None:
                    notes.append(
                        f"nvcc not found: HIP {source.name} not compile-checked for {target}"
                    )
                    continue
                rows += hip_sm_rows(source, target)
    return rows, notes


# ------------------------------------------------------------------ Triton


def _gpu_target(target: str):
    from triton.backends.compiler import GPUTarget

    if target.startswith("gfx"):
        return GPUTarget("hip", target, ftplatform.ARCHS[target].wave_size)
    return GPUTarget("cuda", int(target.removeprefix("sm_")), 32)


def _cubin_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, local/stack bytes) of a Triton cubin, read by Triton's bundled cuobjdump."""
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        text = subprocess.run(
            [str(cuobjdump), "--dump-resource-usage", str(path)], capture_output=True, text=True
        ).stdout
    regs = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    local = re.search(r"LOCAL:(\d+)", text)
    if not regs:
        raise RuntimeError(f"cuobjdump reported no register count: {text.strip()[-500:]}")
    return int(regs.group(1)), max(
        int(stack.group(1)) if stack else 0, int(local.group(1)) if local else 0
    )


def _amd_meta(asm: str, key: str) -> int:
    m = re.search(re.escape(key) + r":\s+(\d+)", asm)
    return int(m.group(1)) if m else 0


def triton_rows_here(
    targets: tuple[str, ...] = TARGETS, only: tuple[str, ...] | None = None
) -> list[Row]:
    """Compile every spec of :func:`triton_modules` (those named in ``only``, by module name, when
    given) in this process (TRITON_INTERPRET must be unset)."""
    import triton
    from triton.compiler import ASTSource

    rows = []
    for module_name in triton_modules():
        if only is not None and module_name.rsplit(".", 1)[-1] not in only:
            continue
        module = importlib.import_module(module_name)
        for target in targets:
            for spec in module.compile_specs(target):
                row = Row(
                    "triton", spec.label, target, module=family(module_name.rsplit(".", 1)[-1])
                )
                try:
                    src = ASTSource(
                        spec.kernel, spec.signature, constexprs=spec.constexprs, attrs=spec.attrs
                    )
                    compiled = triton.compile(
                        src,
                        target=_gpu_target(target),
                        options={"num_warps": spec.num_warps, **spec.options},
                    )
                    row.lds = int(compiled.metadata.shared)
                    if target.startswith("gfx"):
                        asm = compiled.asm["amdgcn"]
                        row.vgpr = _amd_meta(asm, ".vgpr_count")
                        row.sgpr = _amd_meta(asm, ".sgpr_count")
                        row.spill = _amd_meta(asm, ".vgpr_spill_count") + _amd_meta(
                            asm, ".sgpr_spill_count"
                        )
                        row.scratch = _amd_meta(asm, ".private_segment_fixed_size")
                    else:
                        # spills land in local memory, so scratch > 0 is what flags them here
                        row.vgpr, row.scratch = _cubin_usage(compiled.asm["cubin"])
                except Exception as e:  # a compile failure is a row that fails, not a crash
                    row.error = f"{type(e).__name__}: {str(e).strip()[-1500:]}"
                rows.append(row)
    return rows


def triton_rows(
    targets: tuple[str, ...] = TARGETS, only: tuple[str, ...] | None = None
) -> list[Row]:
    """:func:`triton_rows_here` in child processes without TRITON_INTERPRET, one a core at a time:
    the (target, module) pairs are dealt into ``2 x cores`` jobs (each compiler run is
    single-threaded, and compiling every kernel for every target in one process took ~10 minutes
    on a 2-core machine); the rows come back in :func:`triton_rows_here`'s order."""
    from concurrent.futures import ThreadPoolExecutor

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    names = [m.rsplit(".", 1)[-1] for m in triton_modules()]
    names = [n for n in names if only is None or n in only]
    pairs = [(t, n) for n in names for t in targets]
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    jobs = max(1, min(len(pairs), 2 * cores))
    dealt = [pairs[i::jobs] for i in range(jobs)]

    def run_job(job: list[tuple[str, str]]) -> dict[tuple[str, str], list[Row]] | str:
        code = (
            "import json, sys, dataclasses; from ftlab import compile_check as c; out = [[t, n, "
            "[dataclasses.asdict(r) for r in c.triton_rows_here((t,), (n,))]] for t, n in "
            f"{job!r}]; json.dump(out, sys.stdout)"
        )
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if res.returncode:
            return res.stderr.strip()[-2000:]
        return {(t, n): [Row(**r) for r in rows] for t, n, rows in json.loads(res.stdout)}

    # the cores this process may run on (a container's share)
    with ThreadPoolExecutor(cores) as pool:
        results = list(pool.map(run_job, [job for job in dealt if job]))
    failed = [r for r in results if isinstance(r, str)]
    if failed:
        return [
            Row("triton", "(all)", t, error=f"compile process failed: {failed[0]}") for t in targets
        ]
    got = {key: rows for r in results for key, rows in r.items()}
    return [row for n in names for t in targets for row in got[(t, n)]]


# ------------------------------------------------------------------ report


def run(
    targets: tuple[str, ...] = TARGETS, only: tuple[str, ...] | None = None
) -> tuple[list[Row], list[str]]:
    """HIP and Triton rows for ``targets``; ``only``: the families (device source stems, Triton
    module names) to check, all when None."""
    rows, notes = hip_rows(targets, only)
    try:
        import triton  # noqa: F401

        rows += triton_rows(targets, only)
    except ImportError:
        notes.append("triton not installed: Triton kernels not compile-checked")
    return rows, notes


def table(rows: list[Row]) -> str:
    head = (
        "| backend | kernel | target | VGPR | SGPR | spill | scratch B | LDS B (limit) | status |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        status = (
            "ok" if r.ok else "FAIL: " + "; ".join(p.replace("\n", " ")[:200] for p in r.problems)
        )
        lds = f"{r.lds} ({r.lds_limit // 1024} KiB)"
        lines.append(
            f"| {r.backend} | `{r.kernel}` | {r.target} | {r.vgpr if r.vgpr is not None else '-'} "
            f"| {r.sgpr if r.sgpr is not None else '-'} | {r.spill} | {r.scratch} | {lds} | "
            f"{status} |"
        )
    return "\n".join(lines)


def to_json(rows: list[Row]) -> list[dict]:
    return [dict(asdict(r), ok=r.ok, problems=r.problems) for r in rows]

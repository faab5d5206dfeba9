"""Where everything about an op lives, found from its one name (``ftlab ops NAME``).

An op's family (``backends.spec(op).family``) is its module name in every folder: the public
function in ``ftlab/ops/<family>.py``, the specification in ``ftlab/reference/<family>.py``, the
kernels in ``ftlab/triton/<family>*.py`` and ``ftlab/hip/<family>.py`` +
``ftlab/hip/csrc/<family>*.hip``, the native CPU kernels (``moe_experts`` only) in
``ftlab/cpu/``, the cross-backend case functions in ``ftlab/testing/<family>.py``, the property
tests in ``tests/property/test_<family>.py``, the benchmark ``ftlab bench <family>`` and the
contract in ``docs/OPS.md``. :func:`describe` lists them from the routing table, so a new op
or backend appears here by being registered.
"""

from __future__ import annotations

import re
from pathlib import Path

from ftlab import backends

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent  # the checkout (tests/ and docs/ exist only there, not in an installed wheel)

#: The native sources that belong to no one op family (every other one's name starts with its
#: family's), and what they are; ``ftlab ops NAME`` lists those a family's kernels include.
SHARED = {
    "hip/csrc/port.h": "the portability header every kernel includes (HIP, CUDA, bare clang)",
    "hip/csrc/mma.h": "the matrix-core tiles (MMA, MFMA, WMMA) of the GEMMs",
    "hip/csrc/launch_common.h": "launch helpers: programmatic dependent launch",
    "hip/csrc/quant_units.h": "the GGUF block types' int8 units (quant_matmul, moe, quants)",
    "hip/csrc/quant_records.h": "the one-row kernels' activation records (quant_matmul, moe)",
    "hip/csrc/quant_vec.h": "a K-quant row in 16-byte pieces (quant_matmul, moe)",
    "hip/csrc/handshake.hip": "the hybrid executor's graph handshake (ftlab.hybrid)",
    "hip/csrc/handshake_host.h": "the hybrid handshake's host side",
    "hip/csrc/handshake_launch.hip": "the hybrid handshake's tvm-ffi entries",
    "cpu/csrc/cpu_job.h": "the CPU expert worker's job (ftlab.hybrid)",
    "cpu/csrc/launch_runner.cc": "launch schedules replayed from C++ (ftlab.launches)",
}
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _family_files(folder: Path, family: str, *suffixes: str) -> list[str]:
    """``<family><suffix>`` and ``<family>_*<suffix>`` in ``folder`` for each suffix (``moe.py``,
    ``moe_gemm.py``; ``moe.hip``, ``moe_launch.hip``, ``moe_common.h``)."""
    found = []
    for suffix in suffixes:
        found += [folder / f"{family}{suffix}", *sorted(folder.glob(f"{family}_*{suffix}"))]
    return [_rel(p) for p in found if p.is_file()]


def shared_includes(files: list[str]) -> list[str]:
    """The :data:`SHARED` sources that ``files`` (relative to the checkout) include, directly
    or through each other."""
    seen: set[str] = set()
    todo = [ROOT / f for f in files]
    while todo:
        path = todo.pop()
        if not path.is_file():
            continue
        for name in _INCLUDE.findall(path.read_text()):
            rel = _rel(path.parent / name) if (path.parent / name).is_file() else None
            if rel and rel not in seen and rel.removeprefix("ftlab/") in SHARED:
                seen.add(rel)
                todo.append(ROOT / rel)
    return sorted(seen)


def describe(op: str) -> dict[str, object]:
    """Everything about ``op``: its summary, family, Q4_0 paths, each backend's entry point,
    capability and files, the tests, case functions, benchmark and docs. Paths are relative to
    the checkout; entries whose files are absent (an installed wheel has no tests/) are left
    out."""
    spec = backends.spec(op)
    fam = spec.family
    impls = {}
    for name, impl in spec.impls.items():
        caps = impl.caps
        target = (
            impl.target
            if isinstance(impl.target, str)
            else f"{impl.target.__module__}:{impl.target.__name__}"
        )
        files: list[str] = []
        if name in ("reference", "triton"):
            files = _family_files(PACKAGE / name, fam, ".py")
        elif name in ("hip", "cpu"):  # the launch wrapper, then the native sources
            files = _family_files(PACKAGE / name, fam, ".py") + _family_files(
                PACKAGE / name / "csrc", fam, ".hip", ".h", ".cc"
            )
        elif isinstance(impl.target, str):
            module = impl.target.partition(":")[0]
            path = ROOT / (module.replace(".", "/") + ".py")
            files = [_rel(path)] if path.is_file() else []
        impls[name] = {
            "entry": target,
            "files": files,
            "platforms": sorted(caps.platforms),
            "dtypes": None
            if caps.dtypes is None
            else sorted(str(d).removeprefix("torch.") for d in caps.dtypes),
            "paths": list(caps.paths),
            "prefill_path": caps.prefill_path,
            "auto": caps.auto,
        }
    out: dict[str, object] = {
        "op": op,
        "summary": spec.summary,
        "family": fam,
        "paths": list(spec.paths),
        "public": f"ftlab.ops.{op} ({_rel(PACKAGE / 'ops' / f'{fam}.py')})",
        "implementations": impls,
        "shared": shared_includes([f for i in impls.values() for f in i["files"]]),
        "case functions": _family_files(PACKAGE / "testing", fam, ".py"),
        "tests": _family_files(ROOT / "tests" / "property", f"test_{fam}", ".py")
        + _family_files(ROOT / "tests" / "unit", f"test_{fam}", ".py"),
        "variants": {
            b: [k.name for k in ks] for (o, b), ks in backends.rules.KERNELS.items() if o == op
        },
        "bench": f"ftlab bench {fam}" if (PACKAGE / "bench" / f"{fam}.py").is_file() else None,
        "docs": f"docs/OPS.md#{op}" if (ROOT / "docs" / "OPS.md").is_file() else None,
    }
    return {k: v for k, v in out.items() if v not in (None, [])}


def format_op(op: str) -> str:
    """:func:`describe` as readable text."""
    d = describe(op)
    lines = [
        f"{d['op']}: {d['summary']}",
        f"  family   : {d['family']}",
        f"  public   : {d['public']}",
    ]
    if d.get("paths"):
        lines.append(
            f"  paths    : {', '.join(d['paths'])} (auto: int8 up to {backends.DECODE_MAX_TOKENS} "
            "rows)"
        )
    for name, impl in d["implementations"].items():
        extra = [", ".join(impl["platforms"])]
        if impl["paths"]:
            extra.append(f"paths {'/'.join(impl['paths'])}, prefill {impl['prefill_path']}")
        if not impl["auto"]:
            extra.append("by name only")
        lines.append(f"  {name:<9}: {impl['entry']}  [{'; '.join(extra)}]")
        for f in impl["files"]:
            lines.append(f"{'':13}{f}")
    for backend, names in d.get("variants", {}).items():
        lines.append(
            f"  variants : {backend}: {', '.join(names)} (ftlab ops {op} --explain: which runs)"
        )
    for key in ("shared", "case functions", "tests", "bench", "docs"):
        if key in d:
            value = d[key]
            lines.append(f"  {key:<9}: {', '.join(value) if isinstance(value, list) else value}")
    return "\n".join(lines)


def table() -> str:
    """One line per op: name, family, backends."""
    rows = [f"{'op':<16} {'family':<13} backends"]
    for op in backends.ops():
        spec = backends.spec(op)
        rows.append(f"{op:<16} {spec.family:<13} {', '.join(spec.impls)}")
    return "\n".join(rows)

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

from pathlib import Path

from ftlab import backends

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent  # the checkout (tests/ and docs/ exist only there, not in an installed wheel)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _family_files(folder: Path, family: str, *suffixes: str) -> list[str]:
    """``<family><suffix>`` and ``<family>_*<suffix>`` in ``folder`` for each suffix (``moe.py``,
    ``moe_gemm.py``; ``moe.hip``, ``moe_launch.hip``, ``moe_common.h``)."""
    found = []
    for suffix in suffixes:
        found += [folder / f"{family}{suffix}", *sorted(folder.glob(f"{family}_*{suffix}"))]
    return [_rel(p) for p in found if p.is_file()]


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
        target = impl.target if isinstance(impl.target, str) else f"{impl.target.__module__}:{impl.target.__name__}"
        files: list[str] = []
        if name in ("reference", "triton"):
            files = _family_files(PACKAGE / name, fam, ".py")
        elif name in ("hip", "cpu"):  # the launch wrapper, then the native sources
            files = _family_files(PACKAGE / name, fam, ".py") + _family_files(PACKAGE / name / "csrc", fam, ".hip",
                                                                              ".h", ".cc")  # fmt: skip
        elif isinstance(impl.target, str):
            module = impl.target.partition(":")[0]
            path = ROOT / (module.replace(".", "/") + ".py")
            files = [_rel(path)] if path.is_file() else []
        impls[name] = {
            "entry": target,
            "files": files,
            "platforms": sorted(caps.platforms),
            "dtypes": None if caps.dtypes is None else sorted(str(d).removeprefix("torch.") for d in caps.dtypes),
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
        "case functions": _family_files(PACKAGE / "testing", fam, ".py"),
        "tests": _family_files(ROOT / "tests" / "property", f"test_{fam}", ".py"),
        "bench": f"ftlab bench {fam}" if (PACKAGE / "bench" / f"{fam}.py").is_file() else None,
        "docs": f"docs/OPS.md#{op}" if (ROOT / "docs" / "OPS.md").is_file() else None,
    }
    return {k: v for k, v in out.items() if v not in (None, [])}


def format_op(op: str) -> str:
    """:func:`describe` as readable text."""
    d = describe(op)
    lines = [f"{d['op']}: {d['summary']}", f"  family   : {d['family']}", f"  public   : {d['public']}"]
    if d.get("paths"):
        lines.append(f"  paths    : {', '.join(d['paths'])} (auto: int8 up to {backends.DECODE_MAX_TOKENS} rows)")
    for name, impl in d["implementations"].items():
        extra = [", ".join(impl["platforms"])]
        if impl["paths"]:
            extra.append(f"paths {'/'.join(impl['paths'])}, prefill {impl['prefill_path']}")
        if not impl["auto"]:
            extra.append("by name only")
        lines.append(f"  {name:<9}: {impl['entry']}  [{'; '.join(extra)}]")
        for f in impl["files"]:
            lines.append(f"{'':13}{f}")
    for key in ("case functions", "tests", "bench", "docs"):
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

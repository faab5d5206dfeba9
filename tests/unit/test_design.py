"""The shape of the code, checked: no import cycle between ftlab modules, no module reaching into
another's private names, files a reader can hold in mind, every document a source cites present,
and every op's pieces found from its one name."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ftlab import backends, catalog

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ftlab"
MAX_LINES = 450
SOURCES = sorted(p for ext in ("py", "hip", "h", "cc") for p in PACKAGE.rglob(f"*.{ext}"))
PY_MODULES = {
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
    for p in sorted(PACKAGE.rglob("*.py"))
}


def _imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported ftlab module, names taken from it, line) for every import in the file, at any
    depth (imports inside functions count: they are still a dependency)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("ftlab")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            if not base.startswith("ftlab"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in PY_MODULES:  # `from ftlab import ops`: the submodule itself
                    out.append((sub, [], node.lineno))
                else:
                    out.append((base, [alias.name], node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in PY_MODULES}
    for module, path in PY_MODULES.items():
        for target, _, _ in _imports(module, path):
            if target in PY_MODULES and target != module:
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    """Package ``__init__`` re-exports aside (a package importing its own submodules), no two
    ftlab modules depend on each other, directly or through others, lazily or not."""
    graph = _graph()
    for module in graph:  # a package's __init__ importing its submodules is how it exports them
        graph[module] = {
            t
            for t in graph[module]
            if not (PY_MODULES[module].name == "__init__.py" and t.startswith(module + "."))
        }
    assert _cycles(graph) == []


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _private_uses(path: Path, module: str, foreign: bool = True) -> list[str]:
    """Private names of another module: ``from ftlab.x import _y``, and ``alias._y`` where
    ``alias`` is an imported ftlab module -- or, with ``foreign``, any imported module
    (``os.environ._data`` too)."""
    tree = ast.parse(path.read_text())
    bad = [
        f"{_where(path)}:{line}: from {target} import {name}"
        for target, names, line in _imports(module, path)
        for name in names
        if name.startswith("_") and not name.startswith("__") and target != module
    ]
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {
                (a.asname or a.name).split(".")[0]
                for a in node.names
                if foreign or a.name.startswith("ftlab")
            }
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            for a in node.names:
                if f"{base}.{a.name}" in PY_MODULES or (
                    foreign and (base in ("os", "sys") or a.name == "environ")
                ):
                    aliases.add(a.asname or a.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in aliases:
                bad.append(f"{_where(path)}:{node.lineno}: {ast.unparse(node)}")
    return bad


def test_no_private_cross_imports():
    bad = []
    for module, path in PY_MODULES.items():
        bad += _private_uses(path, module)
    # tests may poke the standard library's insides
    for path in sorted((ROOT / "tests").rglob("*.py")):
        bad += _private_uses(path, "tests." + path.stem, foreign=False)
    assert bad == []


def test_the_private_checker_sees_both_forms(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import os\nfrom ftlab.triton import q4_0 as tq\nfrom ftlab.ops.q4_0 import _hidden\n"
        "x = tq._table(1)\ny = os.environ._data\nz = self._fine\n"
    )
    bad = _private_uses(src, "m")
    assert sorted(b.split(": ", 1)[1] for b in bad) == [
        "from ftlab.ops.q4_0 import _hidden",
        "os.environ._data",
        "tq._table",
    ]


@pytest.mark.parametrize(
    "path", SOURCES + sorted((ROOT / "tests").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_files_are_short(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES}: split it)"
    )


FORMATTED = ("ftlab", "tests", "benchmarks")


def test_no_formatter_escapes():
    """Code is written the way the formatter writes it; the planner's tables are the one
    fenced block (``# fmt: off`` ... ``# fmt: on``), never a line's ``# fmt: skip``."""
    bad = [
        f"{p.relative_to(ROOT)}:{i}"
        for d in FORMATTED
        for p in sorted((ROOT / d).rglob("*.py"))
        if p != Path(__file__).resolve()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "fmt: skip" in line
    ]
    assert not bad, f"'# fmt: skip' in {bad}"


def test_the_code_is_formatted():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed in this environment")
    out = subprocess.run(
        [ruff, "format", "--check", *FORMATTED], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, f"ruff format --check:\n{out.stdout}{out.stderr}"


def test_cited_documents_exist():
    """Every design document a source, test, notebook or the README names (``docs/<name>.md``,
    or an upper-case document name such as OPS, README or NOTES) is in the repository."""
    cited = {}
    texts = [
        *SOURCES,
        *sorted((ROOT / "tests").rglob("*.py")),
        *sorted((ROOT / "notebooks").glob("*.ipynb")),
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
    ]
    for path in texts:
        for m in re.finditer(r"docs/([\w-]+\.md)|\b([A-Z][A-Z_]+\.md)\b", path.read_text()):
            cited.setdefault(m.group(1) or m.group(2), str(path.relative_to(ROOT)))
    known = {p.name for p in (ROOT / "docs").glob("*.md")} | {p.name for p in ROOT.glob("*.md")}
    known |= {p.name for p in (ROOT / "benchmarks").rglob("*.md")}
    missing = {name: where for name, where in cited.items() if name not in known}
    assert missing == {}


@pytest.mark.parametrize("op", backends.ops())
def test_everything_about_an_op_is_found_by_its_name(op):
    """The reviewer's test: reference, Triton, HIP, case functions, property tests, docs."""
    d = catalog.describe(op)
    fam = d["family"]
    impls = d["implementations"]
    assert f"ftlab/reference/{fam}.py" in impls["reference"]["files"]
    assert f"ftlab/triton/{fam}.py" in impls["triton"]["files"]
    assert f"ftlab/hip/{fam}.py" in impls["hip"]["files"]
    assert any(
        f.startswith(f"ftlab/hip/csrc/{fam}") and f.endswith(".hip") for f in impls["hip"]["files"]
    )
    assert d["case functions"] == [f"ftlab/testing/{fam}.py"]
    assert f"tests/property/test_{fam}.py" in d["tests"]
    assert (ROOT / "ftlab" / "ops" / f"{fam}.py").is_file()
    ops_md = (ROOT / "docs" / "OPS.md").read_text()
    assert re.search(rf"^#+ .*`{op}`", ops_md, re.M), f"docs/OPS.md has no heading naming `{op}`"
    for f in (f for impl in impls.values() for f in impl["files"]):
        assert (ROOT / f).is_file(), f
    assert op in catalog.format_op(op)


FAMILIES = sorted({backends.spec(op).family for op in backends.ops()})


def _owner(name: str) -> str | None:
    stem = name.removeprefix("test_")
    found = [f for f in FAMILIES if stem.split(".")[0] == f or stem.startswith(f + "_")]
    return max(found, key=len) if found else None


def test_every_native_source_and_property_test_has_an_owner():
    """Each source of hip/csrc and cpu/csrc and each property test belongs to an op family (its
    name starts with the family's) or is on catalog.SHARED, which says what it is."""
    loose = []
    for folder in (PACKAGE / "hip" / "csrc", PACKAGE / "cpu" / "csrc"):
        for p in sorted(folder.iterdir()):
            rel = str(p.relative_to(PACKAGE))
            if p.is_file() and _owner(p.name) is None and rel not in catalog.SHARED:
                loose.append(rel)
    loose += [
        p.name
        for p in sorted((ROOT / "tests" / "property").glob("test_*.py"))
        if _owner(p.name) is None
    ]
    assert loose == []
    assert all((PACKAGE / rel).is_file() for rel in catalog.SHARED), (
        "catalog.SHARED names a file that is gone"
    )


def test_the_architecture_lists_every_family():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    listed = re.findall(r"^\| `(\w+)` \| `", text, re.M)
    assert sorted(listed) == FAMILIES
    for family in FAMILIES:
        row = re.search(rf"^\| `{family}` \| (.*) \|$", text, re.M).group(1)
        ops = sorted(re.findall(r"`(\w+)`", row))
        assert ops == sorted(op for op in backends.ops() if backends.spec(op).family == family), (
            family
        )


#: where arch facts may be read: the platform, the planner (its tables) and the native sources
ARCH_HOMES = (
    "ftlab/platform.py",
    "ftlab/backends/",
    "ftlab/compile_check.py",
    "ftlab/support_matrix.py",
)
ARCH_CHECK = re.compile(
    r"""torch\.version\.hip|get_device_capability|\.startswith\(\(?["'](?:gfx|sm_)|["'](?:gfx\d[0-9a-f]*|sm_\d+)["']"""
)


def test_no_arch_check_outside_the_platform_and_the_planner():
    """An arch string, a HIP-or-CUDA test or a compute-capability read appears only in
    ftlab/platform.py (the facts), ftlab/backends/ (the planner's tables) and the compile check
    (which enumerates targets); everything else asks ``Platform`` a named fact."""
    bad = []
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(ROOT))
        if rel.startswith(ARCH_HOMES):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if ARCH_CHECK.search(code) and '"""' not in code:
                bad.append(f"{rel}:{n}: {line.strip()}")
    assert bad == []


def test_the_models_keep_no_module_flags():
    """No module-level bool in ftlab/models (a choice of the forward pass is a DecodePlan field),
    and no ``globals()`` anywhere in ftlab."""
    bad = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        rel = str(path.relative_to(ROOT))
        bad += [
            f"{rel}:{node.lineno}: globals()"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "globals"
        ]
        if rel.startswith("ftlab/models/"):
            for node in tree.body:
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(
                    node.value, ast.Constant
                ):
                    if isinstance(node.value.value, bool):
                        bad.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert bad == []


def _getattr_private(path: Path) -> list[str]:
    """``getattr(x, "_name")`` (hasattr, setattr) on anything but ``self`` / ``cls``: a reach into
    another object's private name, as ``x._name`` is."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "getattr",
            "hasattr",
            "setattr",
        ):
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                name, root = node.args[1].value, node.args[0]
                while isinstance(root, ast.Attribute):
                    root = root.value
                own = isinstance(root, ast.Name) and root.id in ("self", "cls")
                if (
                    isinstance(name, str)
                    and name.startswith("_")
                    and not name.startswith("__")
                    and not own
                ):
                    bad.append(f"{_where(path)}:{node.lineno}: {ast.unparse(node)}")
    return bad


def test_no_private_name_through_getattr():
    assert [b for path in sorted(PACKAGE.rglob("*.py")) for b in _getattr_private(path)] == []


def test_the_getattr_checker_sees_the_environ_trick(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        'import os\nd = getattr(os.environ, "_data", None)\nok = hasattr(self, "_cache")\n'
    )
    assert [b.split(": ", 1)[1] for b in _getattr_private(src)] == [
        "getattr(os.environ, '_data', None)"
    ]


def _marked_gpu(node: ast.AST) -> bool:
    """Whether a decorator list or ``pytestmark`` value names ``pytest.mark.gpu``."""
    return any(isinstance(n, ast.Attribute) and n.attr == "gpu" for n in ast.walk(node))


def test_every_gpu_test_carries_the_gpu_marker():
    """A test named for the GPU (``..._gpu``, ``..._on_the_gpu``) is selected by ``pytest -m
    gpu`` -- what the GPU machine runs -- only if it carries the marker (itself, its class, or its
    module's ``pytestmark``); a skipif on CUDA alone keeps it out of that run."""
    missing = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        module = any(
            isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
            and _marked_gpu(n.value)
            for n in tree.body
        )
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(map(_marked_gpu, node.decorator_list)):
                continue
            if (
                isinstance(node, ast.FunctionDef)
                and node.name.startswith("test_")
                and node.name.endswith("gpu")
                and "without_" not in node.name
                and not module
                and not any(map(_marked_gpu, node.decorator_list))
            ):
                missing.append(f"{path.relative_to(ROOT)}::{node.name}")
    assert not missing, missing

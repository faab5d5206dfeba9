"""The wheel holds what ftlab needs at run time: every module, the C++ / HIP sources that the
kernels are built from on first use (HIP JIT, CPU expert kernels), and the license.

Built offline: pip without build isolation or an index, with the setuptools installed here.
"""

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ftlab

ROOT = Path(__file__).resolve().parents[2]


def runtime_files() -> set[str]:
    """Every ``ftlab/**/*.py`` and every file under a ``csrc`` folder of the source tree."""
    files = set()
    for path in (ROOT / "ftlab").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            if path.suffix == ".py" or "csrc" in path.parts:
                files.add(path.relative_to(ROOT).as_posix())
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    for tool in ("pip", "setuptools"):  # found, not imported: setuptools must not load in here
        if importlib.util.find_spec(tool) is None:
            pytest.skip(f"{tool} is not installed: no offline wheel build")
    # a copy of the tree: pip builds a local directory in place, which would leave build/ and
    # ftlab.egg-info/ in the checkout
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "ftlab", src / "ftlab", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "-q",
        "-w",
        str(out),
        str(src),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (path,) = out.glob("ftlab-*.whl")
    with zipfile.ZipFile(path) as whl:
        yield whl


def test_wheel_holds_every_module_and_kernel_source(wheel):
    expected = runtime_files()
    assert any(f.endswith(".cc") for f in expected) and any(f.endswith(".hip") for f in expected)
    missing = sorted(expected - set(wheel.namelist()))
    assert not missing, (
        f"not in the wheel (pyproject.toml [tool.setuptools.package-data]): {missing}"
    )


def test_wheel_carries_the_license_and_metadata(wheel):
    info = f"ftlab-{ftlab.__version__}.dist-info"
    assert wheel.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    metadata = wheel.read(f"{info}/METADATA").decode()
    assert f"Version: {ftlab.__version__}\n" in metadata
    assert "License-Expression: Apache-2.0\n" in metadata
    assert "ftlab = ftlab.cli:main" in wheel.read(f"{info}/entry_points.txt").decode()

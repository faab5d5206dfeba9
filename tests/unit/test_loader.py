"""The HIP JIT loader: explicit toolchain, a build cache keyed by every input, no rebuild
when warm. Built here with nvcc for sm_90 (no GPU needed to build and load the module)."""

import os
import subprocess
import sys

import pytest

from ftlab import platform as ftplatform
from ftlab.hip import loader

SM90 = ftplatform.platform_from_arch("sm_90")


def _has_nvcc():
    try:
        loader.find_toolchain("cuda")
        return True
    except loader.HipToolchainError:
        return False


def test_rocm_without_hipcc_is_explained(monkeypatch, tmp_path):
    monkeypatch.setenv("ROCM_HOME", str(tmp_path))
    with pytest.raises(loader.HipToolchainError, match="hipcc not found"):
        loader.find_toolchain("rocm")
    assert "hipcc not found" in loader.unavailable_reason(ftplatform.platform_from_arch("gfx1201"))


def test_cpu_is_not_a_hip_target():
    assert "no GPU" in loader.unavailable_reason(ftplatform.platform_from_arch("cpu"))


def test_build_dir_changes_with_sources(monkeypatch):
    if not _has_nvcc():
        pytest.skip("nvcc not installed")
    first = loader.build_dir_for("index_store", SM90)
    monkeypatch.setattr(loader, "source_digest", lambda: "edited")
    assert loader.build_dir_for("index_store", SM90) != first
    assert loader.build_dir_for("index_store", ftplatform.platform_from_arch("sm_80")) != first


@pytest.mark.skipif(not _has_nvcc(), reason="nvcc not installed")
def test_build_once_then_load_warm(tmp_path):
    code = (
        "import time; from ftlab.hip import loader; from ftlab import platform as p; "
        "t = time.perf_counter(); m = loader.load('index_store', p.platform_from_arch('sm_90')); "
        "print(loader.build_dir_for('index_store', p.platform_from_arch('sm_90'))); "
        "print(m.index_rows is not None, m.store_rows is not None)"
    )
    env = dict(os.environ, FTLAB_CACHE_DIR=str(tmp_path))
    cold = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert cold.returncode == 0, cold.stderr[-3000:]
    funcs = cold.stdout.split("\n")[1]
    assert funcs == "True True"
    so = next(p for p in (tmp_path / "jit").iterdir()).joinpath("index_store.so")
    stamp = so.stat().st_mtime_ns
    objects = {p.name: p.stat().st_mtime_ns for p in so.parent.iterdir()}
    warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert so.stat().st_mtime_ns == stamp, "a warm load rebuilt the module"
    assert {p.name: p.stat().st_mtime_ns for p in so.parent.iterdir()} == objects

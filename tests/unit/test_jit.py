"""The JIT (ftlab.jit): explicit toolchains, a build cache keyed by every input, no rebuild
when warm. GPU modules are built here with nvcc for sm_90 (no GPU needed to build and load
them); CPU modules with the host's C++ compiler."""

import os
import subprocess
import sys

import pytest

from ftlab import jit
from ftlab import platform as ftplatform

SM90 = ftplatform.platform_from_arch("sm_90")


def _has_nvcc():
    try:
        jit.find_gpu_toolchain("cuda")
        return True
    except jit.ToolchainError:
        return False


def test_rocm_without_hipcc_is_explained(monkeypatch, tmp_path):
    monkeypatch.setenv("ROCM_HOME", str(tmp_path))
    with pytest.raises(jit.ToolchainError, match="hipcc not found"):
        jit.find_gpu_toolchain("rocm")
    assert "hipcc not found" in jit.gpu_unavailable_reason(ftplatform.platform_from_arch("gfx1201"))


def test_cpu_is_not_a_hip_target():
    assert "no GPU" in jit.gpu_unavailable_reason(ftplatform.platform_from_arch("cpu"))


def test_build_dir_changes_with_sources(monkeypatch):
    if not _has_nvcc():
        pytest.skip("nvcc not installed")
    first = jit.gpu_build_dir("index_store", SM90)
    monkeypatch.setattr(jit, "source_digest", lambda *folders: "edited")
    assert jit.gpu_build_dir("index_store", SM90) != first
    assert jit.gpu_build_dir("index_store", ftplatform.platform_from_arch("sm_80")) != first


def test_sources_of_both_folders_are_in_the_key(tmp_path, monkeypatch):
    """A GPU module may include the CPU job header (the handshake does): both folders count."""
    hip, cpu = tmp_path / "hip", tmp_path / "cpu"
    hip.mkdir(), cpu.mkdir()
    (hip / "k.hip").write_text("a")
    (cpu / "j.h").write_text("b")
    first = jit.source_digest((hip, cpu))
    (cpu / "j.h").write_text("c")
    second = jit.source_digest((hip, cpu))
    assert second != first
    (cpu / "notes.txt").write_text("not a source")
    assert jit.source_digest((hip, cpu)) == second


@pytest.mark.skipif(not _has_nvcc(), reason="nvcc not installed")
def test_build_once_then_load_warm(tmp_path):
    code = (
        "import time; from ftlab import jit; from ftlab import platform as p; "
        "t = time.perf_counter(); m = jit.load_gpu('index_store', p.platform_from_arch('sm_90')); "
        "print(jit.gpu_build_dir('index_store', p.platform_from_arch('sm_90'))); "
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


@pytest.mark.parametrize(
    "isa, march", [("native", "-march=native"), ("avx2", "-march=x86-64-v3"), ("portable", None)]
)
def test_cpu_isa_picks_the_march(monkeypatch, isa, march):
    monkeypatch.setenv(jit.ISA_ENV, isa)
    flags = jit.cpu_flags()
    assert [f for f in flags if f.startswith("-march=")] == ([march] if march else [])
    assert "-O3" in flags and "-fopenmp" in flags


def test_cpu_isa_unknown_is_named(monkeypatch):
    monkeypatch.setenv(jit.ISA_ENV, "avx512")
    with pytest.raises(ValueError, match="FTLAB_CPU_ISA must be one of .*got 'avx512'"):
        jit.cpu_flags()

"""Builds the host harnesses of the HIP kernels' CPU tests: device sources and a harness copied side
by side into a fresh directory (so the host port.h beside them is the one they include), the
harness compiled by the host C++ compiler into a shared library. Skips the test where there is no
compiler, or it lacks C++20 barriers or _Float16."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "ftlab/hip/csrc"
#: the host stand-in for csrc/port.h (and the thread pool the harnesses run blocks on)
HOST_PORT = ROOT / "tests/unit/host/port.h"


def build_harness(
    build: Path, sources: Iterable[Path], main: str, defines: Iterable[str] = ()
) -> ctypes.CDLL:
    """Copy ``sources`` into ``build`` and compile ``build / main`` (one of them) as a shared
    library (``defines``: ``NAME=VALUE`` macros on the command line); the library loaded."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    for src in sources:
        shutil.copy(src, build / src.name)
    lib = build / (Path(main).stem + ".so")
    # g++ binds inline variables and function statics once per process (GNU unique symbols) across
    # every library loaded: two harnesses' stand-ins of one name would share (and clash)
    unique = ["-fno-gnu-unique"] if Path(cxx).name.startswith("g++") else []
    macros = [f"-D{d}" for d in defines]
    res = subprocess.run(
        [
            cxx,
            "-std=c++20",
            "-O1",
            "-shared",
            "-fPIC",
            "-pthread",
            *unique,
            *macros,
            "-x",
            "c++",
            str(build / main),
            "-o",
            str(lib),
        ],
        capture_output=True,
        text=True,
    )
    if res.returncode:
        if "_Float16" in res.stderr or "barrier" in res.stderr:
            pytest.skip(f"{cxx} lacks C++20 barriers or _Float16")
        raise AssertionError(res.stderr[-3000:])
    return ctypes.CDLL(str(lib))

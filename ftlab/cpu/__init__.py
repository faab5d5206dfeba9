"""Native CPU kernels (C++, OpenMP), built on first use through apache-tvm-ffi's JIT: the routed
experts of the hybrid executor's CPU-routed slots (``ftlab.cpu.moe``).

The build uses ``-O3 -march=native -fopenmp``: it is specialized to the host CPU (AVX2 /
AVX-512 on x86 where present; without ``-march=native`` where the compiler refuses it, scalar
and baseline-SIMD code), so the build directory's name carries a digest of the source,
the compiler, the flags, the tvm-ffi version and the host's CPU flags; a warm import loads the
cached library without a compiler.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
# cpu_job.h: the plain-C job the hybrid handshakes' worker threads hand to the CPU kernel
JOB_HEADER_DIR = Path(__file__).resolve().parents[1] / "hip" / "csrc"
CACHE_ROOT = Path(os.environ.get("FTLAB_CACHE_DIR", Path.home() / ".cache" / "ftlab")) / "jit"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++17"]
# FTLAB_CPU_ISA=portable builds without -march=native: the baseline ISA, so the scalar code
# paths run (the tests compare them with the native build)
ISA_ENV = "FTLAB_CPU_ISA"
_loaded: dict[str, object] = {}
_lock = threading.Lock()


class CpuToolchainError(RuntimeError):
    """No C++ compiler (``$CXX`` or ``c++``) or no apache-tvm-ffi here."""


def _host_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


@functools.cache
def unavailable_reason() -> str | None:
    """Why the CPU kernels cannot be built here (None when they can): no tvm-ffi, no C++
    compiler, or one without OpenMP."""
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        return "apache-tvm-ffi is not installed"
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx}) on PATH"
    probe = subprocess.run([cxx, "-fopenmp", "-x", "c++", "-", "-o", os.devnull], input=b"int main(){return 0;}",
                           capture_output=True, timeout=120)  # fmt: skip
    if probe.returncode != 0:
        return f"{cxx} cannot build with -fopenmp: {probe.stderr.decode(errors='replace').strip()[-200:]}"
    return None


def load(name: str):
    """Build (once) and load the tvm-ffi module of ``csrc/<name>.cc``."""
    reason = unavailable_reason()
    if reason:
        raise CpuToolchainError(f"cannot build CPU module {name!r}: {reason}")
    with _lock:
        if name in _loaded:
            return _loaded[name]
        import tvm_ffi
        import tvm_ffi.cpp

        src = CSRC / f"{name}.cc"
        flags = FLAGS if os.environ.get(ISA_ENV, "native") != "portable" else [f for f in FLAGS if f != "-march=native"]
        h = hashlib.sha256()
        for part in (src.read_bytes(), (JOB_HEADER_DIR / "cpu_job.h").read_bytes(), shutil.which(os.environ.get("CXX", "c++")).encode(), " ".join(flags).encode(),
                     tvm_ffi.__version__.encode(), _host_flags().encode()):  # fmt: skip
            h.update(part)
            h.update(b"\0")
        build_dir = CACHE_ROOT / f"cpu-{name}-{platform.machine()}-{h.hexdigest()[:16]}"
        so = build_dir / f"{name}.so"
        if not so.exists():
            build_dir.mkdir(parents=True, exist_ok=True)
            try:
                tvm_ffi.cpp.build(name, cpp_files=[str(src)], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                                  extra_include_paths=[str(JOB_HEADER_DIR)], build_directory=str(build_dir))  # fmt: skip
            except RuntimeError:  # a compiler without -march=native for this host: portable code
                portable = [f for f in flags if f != "-march=native"]
                tvm_ffi.cpp.build(name, cpp_files=[str(src)], extra_cflags=portable, extra_ldflags=["-fopenmp"],
                                  extra_include_paths=[str(JOB_HEADER_DIR)], build_directory=str(build_dir))  # fmt: skip
        module = tvm_ffi.load_module(str(so))
        _loaded[name] = module
        return module

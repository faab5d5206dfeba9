"""The one JIT of ftlab's native code, through apache-tvm-ffi: HIP kernels for GPUs and C++
kernels for the CPU, built on first use and cached.

- GPU modules (:func:`load_gpu`, :func:`module_for`): ``ftlab/hip/csrc/<name>_launch.hip``
  (tvm-ffi glue including the device code and ``port.h``), built by nvcc for NVIDIA or hipcc
  for ROCm from the same source. Toolchains are located explicitly: ``CUDA_HOME`` (else
  ``/usr/local/cuda``, else the install ``nvcc`` on PATH belongs to) and ``ROCM_HOME`` (else
  ``/opt/rocm``); the arch list is set in ``TVM_FFI_CUDA_ARCH_LIST`` / ``TVM_FFI_ROCM_ARCH_LIST``
  from the device (never guessed by the build system). Launches go to torch's current stream.
- CPU modules (:func:`load_cpu`): ``ftlab/cpu/csrc/<name>.cc``, built with ``$CXX`` (else ``c++``)
  and ``-O3 -march=native -fopenmp`` -- specialized to the host CPU, so the host's CPU flags are
  part of the cache key. ``FTLAB_CPU_ISA=portable`` builds without ``-march=native`` (the
  baseline ISA, so the scalar code paths run), ``FTLAB_CPU_ISA=avx2`` for x86-64-v3 (AVX2, FMA,
  F16C: the AVX2 paths on a host that has AVX-512 too); the tests compare the builds.

Everything that changes a binary -- every source and header it may include, the compiler, the
arch list or host flags, the compiler flags, the tvm-ffi version -- goes into its build
directory's name under ``$FTLAB_CACHE_DIR/jit`` (default ``~/.cache/ftlab/jit``), so a warm
import loads the cached library without running a compiler and an edited kernel is rebuilt.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform as pyplatform
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ftlab import platform as ftplatform

ROOT = Path(__file__).resolve().parent
HIP_CSRC = ROOT / "hip" / "csrc"
CPU_CSRC = ROOT / "cpu" / "csrc"
CPU_FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17")
ISA_ENV = "FTLAB_CPU_ISA"

_loaded: dict[tuple, object] = {}
_device_modules: dict[tuple[str, int], object] = {}
_lock = threading.Lock()
# .recorder: the launch recorder in effect on this thread (recording())
_recording = threading.local()


class ToolchainError(RuntimeError):
    """This machine cannot build a module: no compiler, no tvm-ffi, no GPU, an unknown arch."""


def cache_root() -> Path:
    """Where built modules live: ``$FTLAB_CACHE_DIR/jit`` (default ``~/.cache/ftlab/jit``)."""
    return Path(os.environ.get("FTLAB_CACHE_DIR", Path.home() / ".cache" / "ftlab")) / "jit"


# ------------------------------------------------------------------ toolchains


@dataclass(frozen=True)
class Toolchain:
    backend: str  # tvm-ffi's build backend: "cuda" (nvcc) or "hip" (hipcc)
    home: Path
    compiler: Path


def find_gpu_toolchain(kind: str) -> Toolchain:
    """nvcc (``kind="cuda"``) or hipcc (``kind="rocm"``); ToolchainError if absent."""
    if kind == "cuda":
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        if not home and Path("/usr/local/cuda/bin/nvcc").exists():
            home = "/usr/local/cuda"
        if not home:
            nvcc = shutil.which("nvcc")
            home = str(Path(nvcc).resolve().parent.parent) if nvcc else "/usr/local/cuda"
        compiler = Path(home) / "bin" / "nvcc"
        if not compiler.exists():
            raise ToolchainError(f"nvcc not found at {compiler}; set CUDA_HOME")
        return Toolchain("cuda", Path(home), compiler)
    if kind == "rocm":
        home = os.environ.get("ROCM_HOME") or os.environ.get("ROCM_PATH") or "/opt/rocm"
        compiler = Path(home) / "bin" / "hipcc"
        if not compiler.exists():
            raise ToolchainError(f"hipcc not found at {compiler}; set ROCM_HOME")
        return Toolchain("hip", Path(home), compiler)
    raise ToolchainError(f"the HIP JIT builds for CUDA or ROCm devices, not {kind!r}")


def _tvm_ffi_missing() -> str | None:
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        return "apache-tvm-ffi is not installed"
    return None


def gpu_unavailable_reason(plat: ftplatform.Platform) -> str | None:
    """Why HIP modules cannot be built and run on ``plat`` (None when they can)."""
    if not plat.is_gpu:
        return "no GPU: HIP kernels run on CUDA or ROCm devices"
    if plat.is_rocm and plat.info is None:
        known = ", ".join(a for a, i in ftplatform.ARCHS.items() if i.vendor == "amd")
        return f"arch {plat.arch} is not built (known: {known})"
    if plat.kind == "cuda" and (plat.sm or 0) < 70:
        return f"{plat.arch} is older than sm_70"
    missing = _tvm_ffi_missing()
    if missing:
        return missing
    try:
        find_gpu_toolchain(plat.kind)
    except ToolchainError as e:
        return str(e)
    return None


def _cxx() -> str:
    return os.environ.get("CXX", "c++")


@functools.cache
def cpu_unavailable_reason() -> str | None:
    """Why CPU modules cannot be built here (None when they can): no tvm-ffi, no C++ compiler,
    or one without OpenMP. Probed once a process."""
    missing = _tvm_ffi_missing()
    if missing:
        return missing
    cxx = _cxx()
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx}) on PATH"
    probe = subprocess.run(
        [cxx, "-fopenmp", "-x", "c++", "-", "-o", os.devnull],
        input=b"int main(){return 0;}",
        capture_output=True,
        timeout=120,
    )
    if probe.returncode != 0:
        why = probe.stderr.decode(errors="replace").strip()[-200:]
        return f"{cxx} cannot build with -fopenmp: {why}"
    return None


# ------------------------------------------------------------------ cache keys


def source_digest(folders: Iterable[Path] = (HIP_CSRC, CPU_CSRC)) -> str:
    """Hash of every source and header in ``folders`` (what a module may include)."""
    h = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.iterdir()):
            if path.suffix in (".h", ".hip", ".cc"):
                h.update(f"{folder.name}/{path.name}".encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def _key(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _arch_list(plat: ftplatform.Platform) -> tuple[str, str]:
    """(environment variable, value) that tells tvm-ffi which arch to build for."""
    if plat.kind == "cuda":
        sm = plat.sm or 0
        return "TVM_FFI_CUDA_ARCH_LIST", f"{sm // 10}.{sm % 10}"
    return "TVM_FFI_ROCM_ARCH_LIST", str(plat.arch)


def gpu_build_dir(name: str, plat: ftplatform.Platform) -> Path:
    """The cache directory of GPU module ``name`` for ``plat``."""
    import tvm_ffi

    tc = find_gpu_toolchain(plat.kind)
    _, archs = _arch_list(plat)
    digest = _key(source_digest(), tc.backend, str(tc.compiler), archs, tvm_ffi.__version__)
    return cache_root() / f"{name}-{tc.backend}-{archs.replace('.', '')}-{digest}"


def _host_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return pyplatform.processor()


#: FTLAB_CPU_ISA values: the -march each builds for (None: the compiler's baseline)
CPU_ISAS = {"native": "-march=native", "avx2": "-march=x86-64-v3", "portable": None}


def cpu_flags() -> list[str]:
    """The CPU modules' compiler flags for ``FTLAB_CPU_ISA`` (:data:`CPU_ISAS`; default native)."""
    isa = os.environ.get(ISA_ENV, "native")
    if isa not in CPU_ISAS:
        raise ValueError(f"{ISA_ENV} must be one of {sorted(CPU_ISAS)}, got {isa!r}")
    march = CPU_ISAS[isa]
    return [
        march if f == "-march=native" else f
        for f in CPU_FLAGS
        if march is not None or f != "-march=native"
    ]


def cpu_build_dir(name: str) -> Path:
    """The cache directory of CPU module ``name`` with the current flags on this host."""
    import tvm_ffi

    digest = _key(
        source_digest((CPU_CSRC,)),
        shutil.which(_cxx()) or _cxx(),
        " ".join(cpu_flags()),
        tvm_ffi.__version__,
        _host_flags(),
    )
    return cache_root() / f"cpu-{name}-{pyplatform.machine()}-{digest}"


# ------------------------------------------------------------------ build and load


def _build(name: str, build_dir: Path, **kwargs) -> None:
    import tvm_ffi.cpp

    build_dir.mkdir(parents=True, exist_ok=True)
    tvm_ffi.cpp.build(name, build_directory=str(build_dir), **kwargs)


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock between processes on ``path`` (``fcntl.flock``; none where the platform
    has no fcntl), so that one process builds a module while others wait, then load it whole."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a")
    except OSError:  # a read-only cache: nothing is built there, so nothing to wait for
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load_cached(key: tuple, so: Path, build: Callable[[], None]):
    with _lock:
        if key not in _loaded:
            import tvm_ffi

            # not tvm-ffi's "lock" in the same directory: its build takes that one itself
            with _file_lock(so.parent / "load.lock"):
                if not so.exists():
                    build()
                _loaded[key] = tvm_ffi.load_module(str(so))
        return _loaded[key]


def _cpu_key(name: str, flags: list[str]) -> tuple:
    return ("cpu", name, tuple(flags))


def load_gpu(name: str, plat: ftplatform.Platform | None = None):
    """Build (once) and load the tvm-ffi module of ``hip/csrc/<name>_launch.hip`` for ``plat``
    (default: the current device). Its functions take torch tensors directly and launch on
    torch's current stream. Raises ToolchainError when this machine cannot build it."""
    plat = plat or ftplatform.current()
    reason = gpu_unavailable_reason(plat)
    if reason:
        raise ToolchainError(f"cannot build HIP module {name!r}: {reason}")
    glue = HIP_CSRC / f"{name}_launch.hip"
    if not glue.exists():
        raise FileNotFoundError(f"no HIP launcher for module {name!r}: {glue}")
    build_dir = gpu_build_dir(name, plat)

    def build() -> None:
        tc = find_gpu_toolchain(plat.kind)
        build_dir.mkdir(parents=True, exist_ok=True)
        unit = build_dir / f"{name}.cu"  # tvm-ffi picks the GPU compiler by the .cu suffix
        unit.write_text(f'#include "{glue.name}"\n')
        var, archs = _arch_list(plat)
        env = {var: archs, "CUDA_HOME" if tc.backend == "cuda" else "ROCM_HOME": str(tc.home)}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            _build(
                name,
                build_dir,
                cuda_files=[str(unit)],
                extra_include_paths=[str(HIP_CSRC), str(CPU_CSRC)],
                backend=tc.backend,
            )
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    return _load_cached(("gpu", name, plat.kind, str(plat.arch)), build_dir / f"{name}.so", build)


def load_cpu(name: str):
    """Build (once) and load the tvm-ffi module of ``cpu/csrc/<name>.cc``. Raises
    ToolchainError when this machine cannot build it."""
    recorder = recording_now()
    if recorder is not None:  # a CPU kernel's work is not a launch a recording can repeat
        recorder.refuse(f"CPU module {name!r} called")
    flags = cpu_flags()
    loaded = _loaded.get(_cpu_key(name, flags))
    if loaded is not None:  # the per-call path (the cpu backend's every call): no hashing
        return loaded
    reason = cpu_unavailable_reason()
    if reason:
        raise ToolchainError(f"cannot build CPU module {name!r}: {reason}")
    build_dir = cpu_build_dir(name)
    src = CPU_CSRC / f"{name}.cc"

    def build() -> None:
        common = dict(
            cpp_files=[str(src)], extra_ldflags=["-fopenmp"], extra_include_paths=[str(CPU_CSRC)]
        )
        try:
            _build(name, build_dir, extra_cflags=flags, **common)
        except RuntimeError:  # a compiler without this -march for this host: portable code
            _build(
                name,
                build_dir,
                extra_cflags=[f for f in flags if not f.startswith("-march=")],
                **common,
            )

    return _load_cached(_cpu_key(name, flags), build_dir / f"{name}.so", build)


@contextlib.contextmanager
def recording(recorder) -> Iterator[None]:
    """Within, on this thread: the GPU modules :func:`module_for` hands out are
    ``recorder.view(module)`` (whose functions run and are recorded: :func:`ftlab.launches.record`),
    and :func:`load_cpu` calls ``recorder.refuse(reason)`` (a CPU kernel's work is not a launch).
    Other threads are not recorded. Does not nest."""
    if recording_now() is not None:
        raise RuntimeError("already recording: recordings do not nest")
    _recording.recorder = recorder
    try:
        yield
    finally:
        _recording.recorder = None


def recording_now():
    """The recorder of :func:`recording` in effect on this thread, or None."""
    return getattr(_recording, "recorder", None)


def module_for(name: str, device: torch.device):
    """:func:`load_gpu` for a tensor's device, memoized per device: the per-call path of the ops
    (within :func:`recording`, the recorder's view of the module)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    module = _device_modules.get((name, index))
    if module is None:
        module = _device_modules[(name, index)] = load_gpu(name, ftplatform.current(device))
    recorder = recording_now()
    return module if recorder is None else recorder.view(module)


_one_device: list[bool] = []  # [whether the process sees one GPU], once known


def on_device(device: torch.device, launch: Callable[[], object]) -> None:
    """Run ``launch`` with ``device`` current; switching devices costs microseconds on every
    decode-step call, so only when it is not current already (with one GPU it always is)."""
    if not _one_device:
        _one_device.append(torch.cuda.device_count() == 1)
    if device.index is None or _one_device[0] or device.index == torch.cuda.current_device():
        launch()
    else:
        with torch.cuda.device(device):
            launch()

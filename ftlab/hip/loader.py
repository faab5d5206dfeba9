"""JIT build and load of ftlab's HIP kernels through apache-tvm-ffi.

One module per operator: ``csrc/<op>_launch.hip`` (tvm-ffi glue, includes the device code
``csrc/<op>.hip`` and ``csrc/port.h``). The same source builds with nvcc for NVIDIA and
with hipcc for ROCm. Everything that changes the binary -- every file in ``csrc/``, the
compiler backend, the arch list, the flags, the tvm-ffi version -- goes into the build
directory's name, so a warm import loads the cached ``.so`` without running a compiler,
and an edited kernel is rebuilt.

Toolchains are located explicitly: ``CUDA_HOME`` (else ``/usr/local/cuda``, else the
install that ``nvcc`` on PATH belongs to) and ``ROCM_HOME`` (else ``/opt/rocm``); the arch list is set in
``TVM_FFI_CUDA_ARCH_LIST`` / ``TVM_FFI_ROCM_ARCH_LIST`` for the build from the device (or
from ``arch=``), never guessed by the build system.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ftlab import platform as ftplatform

CSRC = Path(__file__).resolve().parent / "csrc"
CACHE_ROOT = Path(os.environ.get("FTLAB_CACHE_DIR", Path.home() / ".cache" / "ftlab")) / "jit"

_EXTRA_CUDA_CFLAGS: dict[str, list[str]] = {"cuda": [], "hip": []}
_loaded: dict[tuple[str, str, str], object] = {}
_lock = threading.Lock()


class HipToolchainError(RuntimeError):
    """The HIP/CUDA JIT cannot build here (no compiler, no tvm-ffi, unknown arch)."""


@dataclass(frozen=True)
class Toolchain:
    backend: str  # "cuda" (nvcc) or "hip" (hipcc)
    home: Path
    compiler: Path


def find_toolchain(kind: str) -> Toolchain:
    """Locate nvcc (``kind="cuda"``) or hipcc (``kind="rocm"``); raise HipToolchainError if absent."""
    if kind == "cuda":
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        if not home and Path("/usr/local/cuda/bin/nvcc").exists():
            home = "/usr/local/cuda"
        if not home:
            nvcc = shutil.which("nvcc")
            home = str(Path(nvcc).resolve().parent.parent) if nvcc else "/usr/local/cuda"
        compiler = Path(home) / "bin" / "nvcc"
        if not compiler.exists():
            raise HipToolchainError(f"nvcc not found at {compiler}; set CUDA_HOME")
        return Toolchain("cuda", Path(home), compiler)
    if kind == "rocm":
        home = os.environ.get("ROCM_HOME") or os.environ.get("ROCM_PATH") or "/opt/rocm"
        compiler = Path(home) / "bin" / "hipcc"
        if not compiler.exists():
            raise HipToolchainError(f"hipcc not found at {compiler}; set ROCM_HOME")
        return Toolchain("hip", Path(home), compiler)
    raise HipToolchainError(f"the HIP JIT builds for CUDA or ROCm devices, not {kind!r}")


def unavailable_reason(plat: ftplatform.Platform) -> str | None:
    """Why the HIP backend cannot run on ``plat`` (None when it can)."""
    if not plat.is_gpu:
        return "no GPU: HIP kernels run on CUDA or ROCm devices"
    if plat.is_rocm and plat.info is None:
        return f"arch {plat.arch} is not built (known: {', '.join(_known_gfx())})"
    if plat.kind == "cuda" and (plat.sm or 0) < 70:
        return f"{plat.arch} is older than sm_70"
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        return "apache-tvm-ffi is not installed"
    try:
        find_toolchain(plat.kind)
    except HipToolchainError as e:
        return str(e)
    return None


def _known_gfx() -> list[str]:
    return [a for a, i in ftplatform.ARCHS.items() if i.vendor == "amd"]


def _arch_list(plat: ftplatform.Platform) -> tuple[str, str]:
    """(environment variable, value) that tells tvm-ffi which arch to build for."""
    if plat.kind == "cuda":
        sm = plat.sm or 0
        return "TVM_FFI_CUDA_ARCH_LIST", f"{sm // 10}.{sm % 10}"
    return "TVM_FFI_ROCM_ARCH_LIST", str(plat.arch)


def source_digest() -> str:
    """Hash of every file the HIP modules are built from."""
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".h", ".hip"):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def build_dir_for(name: str, plat: ftplatform.Platform) -> Path:
    import tvm_ffi

    tc = find_toolchain(plat.kind)
    var, archs = _arch_list(plat)
    h = hashlib.sha256()
    for part in (
        source_digest(),
        tc.backend,
        str(tc.compiler),
        archs,
        tvm_ffi.__version__,
        " ".join(_EXTRA_CUDA_CFLAGS[tc.backend]),
    ):
        h.update(part.encode())
        h.update(b"\0")
    return CACHE_ROOT / f"{name}-{tc.backend}-{archs.replace('.', '')}-{h.hexdigest()[:16]}"


def load(name: str, plat: ftplatform.Platform | None = None):
    """Build (once) and load the tvm-ffi module of ``csrc/<name>_launch.hip``.

    Returns a ``tvm_ffi.Module`` whose functions take torch tensors directly and launch on
    torch's current stream. Raises HipToolchainError when this machine cannot build it.
    """
    plat = plat or ftplatform.current()
    reason = unavailable_reason(plat)
    if reason:
        raise HipToolchainError(f"cannot build HIP module {name!r}: {reason}")
    key = (name, plat.kind, str(plat.arch))
    with _lock:
        if key in _loaded:
            return _loaded[key]
        import tvm_ffi
        import tvm_ffi.cpp

        build_dir = build_dir_for(name, plat)
        so = build_dir / f"{name}.so"
        if not so.exists():
            _build(name, plat, build_dir)
        module = tvm_ffi.load_module(str(so))
        _loaded[key] = module
        return module


def _build(name: str, plat: ftplatform.Platform, build_dir: Path) -> None:
    import tvm_ffi.cpp

    tc = find_toolchain(plat.kind)
    glue = CSRC / f"{name}_launch.hip"
    if not glue.exists():
        raise FileNotFoundError(f"no HIP launcher for module {name!r}: {glue}")
    build_dir.mkdir(parents=True, exist_ok=True)
    # tvm-ffi picks the GPU compiler by the .cu suffix; the unit just includes the glue.
    unit = build_dir / f"{name}.cu"
    unit.write_text(f'#include "{glue.name}"\n')
    var, archs = _arch_list(plat)
    env_updates = {var: archs, "CUDA_HOME" if tc.backend == "cuda" else "ROCM_HOME": str(tc.home)}
    saved = {k: os.environ.get(k) for k in env_updates}
    os.environ.update(env_updates)
    try:
        tvm_ffi.cpp.build(
            name,
            cuda_files=[str(unit)],
            extra_cuda_cflags=_EXTRA_CUDA_CFLAGS[tc.backend],
            extra_include_paths=[str(CSRC)],
            build_directory=str(build_dir),
            backend=tc.backend,
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_device_modules: dict[tuple[str, int], object] = {}


def module_for(name: str, device: torch.device):
    """:func:`load` for a tensor's device, memoized per device: the per-call path of the ops."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    module = _device_modules.get((name, index))
    if module is None:
        module = _device_modules[(name, index)] = load(name, ftplatform.current(device))
    return module


def on_device(device: torch.device, launch: Callable[[], object]) -> None:
    """Run ``launch`` with ``device`` current; switching devices costs microseconds on every
    decode-step call, so only when it is not current already."""
    if device.index is None or device.index == torch.cuda.current_device():
        launch()
    else:
        with torch.cuda.device(device):
            launch()

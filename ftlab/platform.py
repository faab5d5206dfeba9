"""What ftlab runs on: CPU, CUDA (sm_xx) or ROCm (gfxNNNN), its family, wave size and UMA.

Everything arch-dependent in ftlab reads one table, ``ARCHS``. A ROCm device reports
``gcnArchName`` such as ``"gfx1100:sramecc-:xnack-"``; :func:`parse_gfx` keeps the
``gfx1100`` part. ``FTLAB_ARCH`` fakes the platform for routing tests and compile
planning: ``FTLAB_ARCH=gfx1201`` (ROCm), ``FTLAB_ARCH=sm_90`` (CUDA), ``FTLAB_ARCH=cpu``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cache, lru_cache

import torch


@dataclass(frozen=True)
class ArchInfo:
    """Static facts of one GPU architecture."""

    arch: str  # "gfx1100", "sm_90"
    vendor: str  # "amd" | "nvidia"
    family: str  # "RDNA3", "RDNA3.5", "RDNA4", "CDNA2", "CDNA3", "Hopper", ...
    wave_size: int  # threads per wave/warp
    lds_bytes: int  # shared memory (LDS) a workgroup may use
    uma: bool = False  # CPU and GPU share one memory (APUs such as Strix Halo)
    example: str = ""  # a product, for humans


ARCHS: dict[str, ArchInfo] = {
    a.arch: a
    for a in [
        ArchInfo("gfx1100", "amd", "RDNA3", 32, 65536, example="Radeon PRO W7900 / RX 7900 XTX"),
        ArchInfo("gfx1101", "amd", "RDNA3", 32, 65536, example="Radeon RX 7800 XT"),
        ArchInfo("gfx1102", "amd", "RDNA3", 32, 65536, example="Radeon RX 7600"),
        ArchInfo("gfx1150", "amd", "RDNA3.5", 32, 65536, uma=True, example="Strix Point"),
        ArchInfo("gfx1151", "amd", "RDNA3.5", 32, 65536, uma=True, example="Strix Halo"),
        ArchInfo("gfx1200", "amd", "RDNA4", 32, 65536, example="Radeon RX 9060"),
        ArchInfo("gfx1201", "amd", "RDNA4", 32, 65536, example="Radeon RX 9070 / AI PRO R9700"),
        ArchInfo("gfx90a", "amd", "CDNA2", 64, 65536, example="Instinct MI210/MI250"),
        ArchInfo("gfx942", "amd", "CDNA3", 64, 65536, example="Instinct MI300X/MI325X"),
        ArchInfo("sm_80", "nvidia", "Ampere", 32, 166912, example="A100"),
        ArchInfo("sm_86", "nvidia", "Ampere", 32, 101376, example="RTX 3090 / A6000"),
        ArchInfo("sm_89", "nvidia", "Ada", 32, 101376, example="RTX 4090 / L40S"),
        ArchInfo("sm_90", "nvidia", "Hopper", 32, 232448, example="H100 / H200"),
    ]
}

#: The gfx targets every HIP and Triton kernel is compile-checked for.
GFX_CHECK_TARGETS: tuple[str, ...] = ("gfx1100", "gfx1151", "gfx1201", "gfx942")
#: The NVIDIA target compile-checked beside them.
SM_CHECK_TARGETS: tuple[str, ...] = ("sm_90",)


@dataclass(frozen=True)
class Platform:
    """The device ftlab computes on.

    ``kind`` is ``"cpu"``, ``"cuda"`` (NVIDIA) or ``"rocm"`` (AMD through HIP).
    ``info`` is ``None`` on the CPU and for GPUs missing from :data:`ARCHS`.
    """

    kind: str
    name: str
    arch: str | None = None
    info: ArchInfo | None = None
    faked: bool = False

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("cuda", "rocm")

    @property
    def is_rocm(self) -> bool:
        return self.kind == "rocm"

    @property
    def family(self) -> str | None:
        return self.info.family if self.info else None

    @property
    def wave_size(self) -> int | None:
        if self.info:
            return self.info.wave_size
        if self.kind == "cuda":
            return 32
        if self.kind == "rocm" and self.arch:
            return 64 if self.arch.startswith("gfx9") else 32
        return None

    @property
    def uma(self) -> bool:
        return bool(self.info and self.info.uma)

    @property
    def sm(self) -> int | None:
        if self.kind == "cuda" and self.arch:
            return int(self.arch.removeprefix("sm_"))
        return None

    @property
    def vendor(self) -> str | None:
        """``"nvidia"``, ``"amd"``, or None on the CPU."""
        return {"cuda": "nvidia", "rocm": "amd"}.get(self.kind)

    @property
    def rdna(self) -> bool:
        """An RDNA GPU (gfx11, gfx12: wave32, 256 VGPRs a lane), where wide per-row tiles spill."""
        return self.kind == "rocm" and bool(self.arch) and self.arch.startswith(("gfx11", "gfx12"))

    @property
    def async_copies(self) -> bool:
        """Whether copies into shared memory (LDS) run asynchronously: cp.async, NVIDIA sm_80+.
        Elsewhere ``port_copy16_async`` is a plain copy through registers."""
        return (self.sm or 0) >= 80

    @property
    def tf32(self) -> bool:
        """Whether an fp32 ``tl.dot`` may take Triton's tf32x3 (NVIDIA's matrix units)."""
        return self.kind == "cuda"

    def describe(self) -> str:
        if not self.is_gpu:
            return f"cpu ({self.name})"
        parts = [self.kind, self.arch or "unknown arch", self.family or "unknown family"]
        parts.append(f"wave{self.wave_size}")
        if self.uma:
            parts.append("UMA")
        text = f"{self.name}: " + ", ".join(parts)
        return text + (" [faked by FTLAB_ARCH]" if self.faked else "")


_GFX_RE = re.compile(r"^(gfx[0-9a-f]+)", re.IGNORECASE)


def parse_gfx(gcn_arch_name: str) -> str:
    """``"gfx1100:sramecc-:xnack-"`` -> ``"gfx1100"``; raises ValueError on anything else."""
    m = _GFX_RE.match(gcn_arch_name.strip())
    if not m:
        raise ValueError(f"gcnArchName must start with 'gfx<id>', got {gcn_arch_name!r}")
    return m.group(1).lower()


def platform_from_arch(arch: str, *, name: str | None = None, faked: bool = False) -> Platform:
    """Build a Platform from an arch string: ``gfx1201``, ``gfx942:sramecc+:xnack-``,
    ``sm_90``, ``sm90`` or ``cpu``."""
    text = arch.strip().lower()
    if text == "cpu":
        return Platform("cpu", name or "cpu", faked=faked)
    if text.startswith("gfx"):
        gfx = parse_gfx(text)
        info = ARCHS.get(gfx)
        label = name or (info.example if info and info.example else gfx)
        return Platform("rocm", label, gfx, info, faked=faked)
    m = re.fullmatch(r"sm_?(\d+)a?", text)
    if m:
        sm = f"sm_{m.group(1)}"
        info = ARCHS.get(sm)
        label = name or (info.example if info and info.example else sm)
        return Platform("cuda", label, sm, info, faked=faked)
    raise ValueError(f"FTLAB_ARCH must be 'cpu', 'gfx<id>' or 'sm_<nn>', got {arch!r}")


@lru_cache(maxsize=1)
def _cpu() -> Platform:
    import platform as pyplatform

    return Platform("cpu", pyplatform.processor() or pyplatform.machine() or "cpu")


@cache
def _detected_gpu(device_index: int) -> Platform:
    props = torch.cuda.get_device_properties(device_index)
    if getattr(torch.version, "hip", None):
        return platform_from_arch(props.gcnArchName, name=props.name)
    return platform_from_arch(f"sm_{props.major}{props.minor}", name=props.name)


def current(device: torch.device | str | int | None = None) -> Platform:
    """The platform of ``device`` (default: the current GPU if any, else the CPU).

    ``FTLAB_ARCH`` overrides detection for GPU devices; a CPU device is always the CPU.
    """
    index = None
    if device is not None:
        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if dev.type == "cpu":
            return _cpu()
        index = dev.index
    faked = os.environ.get("FTLAB_ARCH")
    if faked:
        return platform_from_arch(faked, faked=True)
    if not torch.cuda.is_available():
        return _cpu()
    return _detected_gpu(torch.cuda.current_device() if index is None else index)


def torch_build() -> str | None:
    """What the installed torch was built for: ``"ROCm/HIP <version>"``, ``"CUDA <version>"``,
    or None for a CPU build."""
    if getattr(torch.version, "hip", None):
        return f"ROCm/HIP {torch.version.hip}"
    return f"CUDA {torch.version.cuda}" if torch.version.cuda else None


def capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream is capturing a CUDA/HIP graph (that device's stream,
    not the current device's); False on the CPU."""
    if device.type != "cuda":
        return False
    if device.index is None or device.index == torch.cuda.current_device():
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


@cache
def multiprocessors(device: torch.device) -> int:
    """Multiprocessors (SMs / CUs) of GPU ``device`` (cached: launch plans ask every call)."""
    return torch.cuda.get_device_properties(device).multi_processor_count

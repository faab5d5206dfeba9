"""The routing table: one :class:`OpSpec` per op, its implementations, and what each can serve.

Each :class:`OpSpec` names the op, its family (the module name it has in ``ftlab/reference``,
``ftlab/triton``, ``ftlab/hip``, ``ftlab/ops``, ``ftlab/testing``, ``ftlab/bench`` and
``tests/property/test_<family>.py``; :mod:`ftlab.catalog` lists them), the quantized-weight paths
it takes, and its implementations per backend, each with a typed :class:`Capability`: the
platforms and dtypes it serves, the paths it implements and its prefill path. Which
implementation runs a call, on which path and in which kernel variant, is the planner's choice
(:mod:`ftlab.backends.planner`); this module answers whether an implementation *can* serve.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from ftlab import platform as ftplatform

BUILTIN_BACKENDS = ("reference", "triton", "hip", "cpu")
AUTO_ORDER_GPU = ("hip", "triton", "reference")
AUTO_ORDER_CPU = ("reference",)
ALL_PLATFORMS = frozenset({"cpu", "cuda", "rocm"})
#: The decode/prefill boundary: ops on up to this many rows (tokens) take their decode path
#: (matvecs, per-(token, slot) expert kernels, the hybrid handshake); longer passes prefill.
DECODE_MAX_TOKENS = 8
#: How quantized weights are multiplied: "int8" (Q8_1 activations, exact int8 block dots) or
#: "dequant" (weights dequantized, float matmul). docs/OPS.md section 2.
Q4_0_PATHS = ("int8", "dequant")

#: The float dtypes of activations and dense weights, in the order messages name them.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: What the copies (index / store) move: the float dtypes and fp8 e4m3.
COPY_DTYPES = (*FLOAT_DTYPES, torch.float8_e4m3fn, torch.float8_e4m3fnuz)

Availability = Callable[[ftplatform.Platform, str], "str | None"]


class BackendUnavailable(RuntimeError):
    """An explicitly requested backend, path or variant cannot serve this call; the message says
    why."""


@dataclass(frozen=True)
class Capability:
    """What one implementation of an op can serve.

    ``platforms``: platform kinds whose tensors it takes (``"cpu"``, ``"cuda"``, ``"rocm"``);
    ``dtypes``: None for any dtype the op accepts; ``paths``: the quantized-weight paths it
    implements (empty for ops without paths) and ``prefill_path`` the one ``path="auto"`` takes
    above :data:`DECODE_MAX_TOKENS` rows; ``auto``: whether ``backend="auto"`` may pick it;
    ``capturable``: whether it may run inside a CUDA/HIP graph capture (the reference reads
    tensors on the host, so it may not); ``available(platform, device_type)``: why it cannot run
    here (a missing compiler, say), or None."""

    platforms: frozenset[str] = ALL_PLATFORMS
    dtypes: frozenset[torch.dtype] | None = None
    nvidia_only: bool = False
    paths: tuple[str, ...] = ()
    prefill_path: str | None = None
    auto: bool = True
    available: Availability | None = None
    capturable: bool = True

    def path_for(self, rows: int, path: str) -> str:
        """The path a call on ``rows`` rows takes when asked for ``path`` (``"auto"`` or one):
        for ``"auto"``, int8 up to :data:`DECODE_MAX_TOKENS` rows where implemented, else the
        prefill path."""
        if path != "auto":
            return path
        if rows <= DECODE_MAX_TOKENS and "int8" in self.paths:
            return "int8"
        return self.prefill_path or self.paths[0]


@dataclass
class Impl:
    """One implementation of one op. ``target`` is the function itself or ``"module:function"``
    (imported on first use, so ``import ftlab`` never imports Triton or builds native code)."""

    op: str
    backend: str
    target: Callable | str
    caps: Capability
    loaded: Callable | None = field(default=None, repr=False)

    @property
    def fn(self) -> Callable:
        if self.loaded is None:
            if callable(self.target):
                self.loaded = self.target
            else:
                module, _, name = self.target.partition(":")
                self.loaded = getattr(importlib.import_module(module), name)
        return self.loaded

    def cannot_serve(
        self,
        plat: ftplatform.Platform,
        device_type: str,
        dtype: torch.dtype | None,
        path: str | None = None,
        probe: bool = True,
    ) -> str | None:
        """Why this implementation cannot serve a call (None when it can); ``probe=False``
        assumes its toolchain is installed (planning for another machine)."""
        caps = self.caps
        if caps.nvidia_only and plat.is_rocm:
            return "it is NVIDIA-only and is never used on ROCm"
        kind = "cpu" if device_type == "cpu" or not plat.is_gpu else plat.kind
        if kind not in caps.platforms:
            where = "CPU tensors" if kind == "cpu" else f"{kind} devices"
            return f"it does not run on {where} (runs on: {', '.join(sorted(caps.platforms))})"
        if caps.dtypes is not None and dtype is not None and dtype not in caps.dtypes:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in caps.dtypes))
            return f"dtype {dtype} is unsupported (supported: {names})"
        if path is not None and path != "auto" and caps.paths and path not in caps.paths:
            both = " and ".join(caps.paths)
            return f"it implements the {both} path(s) for quantized weights, not {path!r}"
        if caps.available is not None and probe:
            return caps.available(plat, device_type)
        return None


@dataclass
class OpSpec:
    """One op: its name, family (module name in every backend folder), a one-line summary, the
    quantized-weight paths it takes (empty: none), the names of the dims ``ftlab ops NAME
    --explain --shape`` reads (``shape``) and its implementations by backend name."""

    name: str
    family: str
    summary: str = ""
    paths: tuple[str, ...] = ()
    shape: tuple[str, ...] = ()
    impls: dict[str, Impl] = field(default_factory=dict)


#: op name -> spec: the routing table.
SPECS: dict[str, OpSpec] = {}
# resolve() results, keyed by the call's device, dtype, path and routing environment
RESOLVED: dict[tuple, Impl] = {}
#: the environment variables routing reads (part of every cache key)
ENV_KEYS = ("FTLAB_BACKEND", "FTLAB_ARCH", "TRITON_INTERPRET")


def routing_env() -> tuple[str | None, ...]:
    """The values of :data:`ENV_KEYS` now."""
    get = os.environ.get
    return (get("FTLAB_BACKEND"), get("FTLAB_ARCH"), get("TRITON_INTERPRET"))


def forget() -> None:
    """Drop every cached resolution and plan (the table changed)."""
    RESOLVED.clear()
    for hook in FORGET_HOOKS:
        hook()


#: what else caches resolutions (the planner), cleared by :func:`forget`
FORGET_HOOKS: list[Callable[[], None]] = []


def spec(op: str) -> OpSpec:
    """The spec of ``op``; KeyError naming the known ops otherwise."""
    found = SPECS.get(op)
    if found is None:
        raise KeyError(f"op must be one of {sorted(SPECS)}, got {op!r}")
    return found


def define_op(
    name: str,
    family: str,
    summary: str = "",
    paths: tuple[str, ...] = (),
    shape: tuple[str, ...] = (),
) -> OpSpec:
    """Add an op to the table (its implementations come through :func:`register`)."""
    if name in SPECS:
        raise ValueError(f"op {name!r} is already defined")
    SPECS[name] = OpSpec(name, family, summary, tuple(paths), tuple(shape))
    return SPECS[name]


def register(
    op: str,
    backend: str,
    fn: Callable | str,
    *,
    platforms: Iterable[str] = ALL_PLATFORMS,
    dtypes: Iterable[torch.dtype] | None = None,
    nvidia_only: bool = False,
    available: Availability | None = None,
    paths: Iterable[str] | None = None,
    prefill_path: str | None = None,
    auto: bool = True,
    capturable: bool = True,
    replace: bool = False,
) -> Impl:
    """Add an implementation of ``op`` under the name ``backend``.

    ``fn`` has the op's backend signature (see ``ftlab/reference/<family>.py``). A name other
    than the built-in ones is experimental: ``auto`` never picks it, but ``backend="<name>"``
    calls it and :mod:`ftlab.testing` checks it against the reference::

        ftlab.backends.register("index", "my_gather", my_gather, platforms=["cuda"])
        ftlab.ops.index(w, i, backend="my_gather")

    ``paths`` (ops with quantized-weight paths): those it implements, default all of the op's;
    ``prefill_path``: what ``path="auto"`` takes for prefill, default the first of ``paths``;
    ``capturable``: False for code that reads tensors on the host (no graph capture then).
    Registering a built-in backend name for an unknown op defines the op (family = its name).
    """
    if backend == "auto":
        raise ValueError("backend name 'auto' is reserved")
    if op not in SPECS:
        if backend not in BUILTIN_BACKENDS:
            raise KeyError(f"op must be one of {sorted(SPECS)}, got {op!r}")
        define_op(op, op)
    entry = SPECS[op]
    if backend in entry.impls and not replace:
        raise ValueError(f"{op!r} already has a backend {backend!r}; pass replace=True")
    impl_paths = tuple(entry.paths if paths is None else paths)
    unknown = set(impl_paths) - set(entry.paths)
    if unknown:
        raise ValueError(f"paths must be among {entry.paths} for {op}, got {sorted(unknown)}")
    if entry.paths and not impl_paths:
        raise ValueError(f"paths must name at least one of {entry.paths} for {op}, got none")
    if prefill_path is not None and prefill_path not in impl_paths:
        raise ValueError(f"prefill_path must be one of {impl_paths}, got {prefill_path!r}")
    caps = Capability(
        frozenset(platforms),
        frozenset(dtypes) if dtypes is not None else None,
        nvidia_only,
        impl_paths,
        prefill_path or (impl_paths[0] if impl_paths else None),
        auto and backend in BUILTIN_BACKENDS,
        available,
        capturable,
    )
    entry.impls[backend] = impl = Impl(op, backend, fn, caps)
    forget()
    return impl


def unregister(op: str, backend: str) -> None:
    """Remove an experimental backend (built-in ones stay)."""
    if backend in BUILTIN_BACKENDS:
        raise ValueError(f"built-in backend {backend!r} cannot be removed")
    if op in SPECS:
        SPECS[op].impls.pop(backend, None)
    forget()


def ops() -> list[str]:
    return sorted(SPECS)


def backends_of(op: str) -> list[str]:
    return list(spec(op).impls)


def resolve(
    op: str,
    backend: str,
    device: torch.device,
    dtype: torch.dtype | None = None,
    plat: ftplatform.Platform | None = None,
    *,
    path: str | None = None,
) -> Impl:
    """The implementation that can serve ``op`` for tensors on ``device`` of ``dtype`` (with
    ``path``: one that implements that path): ``backend`` itself when named (else
    :class:`BackendUnavailable` saying why), or the first of the auto order that can. The
    planner (:func:`ftlab.backends.plan`) starts from this and applies the measured rules."""
    key = None
    if plat is None:
        key = (op, backend, device.type, device.index, dtype, path, *routing_env())
        hit = RESOLVED.get(key)
        if hit is not None:
            return hit
    impl = resolve_uncached(
        spec(op), backend, device.type, dtype, plat or ftplatform.current(device), path
    )
    if key is not None:
        RESOLVED[key] = impl
    return impl


def resolve_path(
    op: str,
    backend: str,
    device: torch.device,
    dtype: torch.dtype | None,
    rows: int,
    path: str = "auto",
) -> tuple[Impl, str]:
    """(implementation, path) of :func:`resolve` and its capability's path for ``rows`` rows:
    ``path="auto"`` takes int8 up to :data:`DECODE_MAX_TOKENS` rows, else the implementation's
    prefill path; an explicit path must be implemented. What the auto order gives, before the
    planner's measured rules (:func:`ftlab.backends.plan`)."""
    paths = spec(op).paths
    if path != "auto" and path not in paths:
        raise ValueError(f"path must be 'auto' or one of {paths}, got {path!r}")
    impl = resolve(op, backend, device, dtype, path=None if path == "auto" else path)
    return impl, impl.caps.path_for(rows, path)


def auto_order(device_type: str, plat: ftplatform.Platform) -> tuple[str, ...]:
    """The backends ``auto`` tries in order for tensors of ``device_type`` on ``plat``."""
    return AUTO_ORDER_GPU if device_type != "cpu" and plat.is_gpu else AUTO_ORDER_CPU


def resolve_uncached(
    entry: OpSpec,
    backend: str,
    device_type: str,
    dtype: torch.dtype | None,
    plat: ftplatform.Platform,
    path: str | None,
    probe: bool = True,
) -> Impl:
    """:func:`resolve` without its cache (``FTLAB_BACKEND`` replaces ``auto``; ``probe``: as
    :meth:`Impl.cannot_serve`'s)."""
    op = entry.name
    if backend == "auto":
        backend = os.environ.get("FTLAB_BACKEND") or "auto"
    if backend != "auto":
        impl = entry.impls.get(backend)
        if impl is None:
            raise ValueError(
                f"backend must be 'auto' or one of {list(entry.impls)} for {op}, got {backend!r}"
            )
        reason = impl.cannot_serve(plat, device_type, dtype, path, probe)
        if reason:
            raise BackendUnavailable(f"{op}: backend {backend!r} cannot serve this call: {reason}")
        return impl
    reasons = []
    for name in auto_order(device_type, plat):
        impl = entry.impls.get(name)
        if impl is None or not impl.caps.auto:
            continue
        reason = impl.cannot_serve(plat, device_type, dtype, path, probe)
        if reason is None:
            return impl
        reasons.append(f"{name}: {reason}")
    raise BackendUnavailable(f"{op}: no backend can serve this call ({'; '.join(reasons)})")


def availability(
    op: str, device: torch.device, dtype: torch.dtype | None = None, path: str | None = None
) -> dict[str, str | None]:
    """``{backend: None if it can serve, else why not}`` for every backend of ``op``."""
    plat = ftplatform.current(device)
    impls = spec(op).impls.items()
    return {name: impl.cannot_serve(plat, device.type, dtype, path) for name, impl in impls}


def available_backends(
    op: str, device: torch.device, dtype: torch.dtype | None = None, path: str | None = None
) -> list[str]:
    """Names of the backends that can serve ``op`` on ``device`` now (with ``path``: that
    implement it)."""
    return [name for name, why in availability(op, device, dtype, path).items() if why is None]


# ------------------------------------------------------------------ availability rules


def triton_unavailable(plat: ftplatform.Platform, device_type: str) -> str | None:
    """Triton runs on CUDA/ROCm GPUs, and on CPU tensors only under TRITON_INTERPRET=1."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if device_type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return (
                "CPU tensors need Triton's interpreter (set TRITON_INTERPRET=1 before importing "
                "triton; it is slow, for tests: backend='auto' uses the reference on the CPU)"
            )
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 is set: Triton kernels run on the CPU only in this process"
    return None


def hip_unavailable(plat: ftplatform.Platform, device_type: str) -> str | None:
    if device_type == "cpu":
        return "HIP kernels need a GPU tensor"
    return gpu_build_reason(plat)


@functools.cache
def gpu_build_reason(plat: ftplatform.Platform) -> str | None:
    """Why no GPU module can be built for ``plat`` (looks for compilers on disk: once per
    platform and process)."""
    from ftlab import jit

    return jit.gpu_unavailable_reason(plat)


def cpu_unavailable(plat: ftplatform.Platform, device_type: str) -> str | None:
    from ftlab import jit

    return jit.cpu_unavailable_reason()

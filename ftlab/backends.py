"""Backend registry and routing: one table says who can serve which call.

Every op has entries for ``reference``, ``triton`` and ``hip``; researchers add their own
with :func:`register`. Routing rules (ARCHITECTURE.md, "Routing"):

- an explicit backend that cannot serve the call raises :class:`BackendUnavailable`
  naming why (no GPU, arch not built, dtype unsupported) -- never a silent fallback;
- ``auto`` on a GPU tensor: ``hip`` if it can serve, else ``triton``, else ``reference``;
  on a CPU tensor: ``reference`` (Triton runs on the CPU only in interpreter mode, and
  only when asked for by name);
- on ROCm an entry marked ``nvidia_only`` is never selected, whatever the flags;
- ``FTLAB_BACKEND=<name>`` replaces ``auto`` with that backend (then it is explicit: it
  raises if it cannot serve); ``FTLAB_ARCH`` fakes the platform (see :mod:`ftlab.platform`).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from ftlab import platform as ftplatform

BUILTIN_BACKENDS = ("reference", "triton", "hip")
AUTO_ORDER_GPU = ("hip", "triton", "reference")
#: The decode/prefill boundary: ops on up to this many rows (tokens) take their decode path
#: (matvecs, per-(token, slot) expert kernels, the hybrid handshake); longer passes prefill.
DECODE_MAX_TOKENS = 8

FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
COPY_DTYPES = frozenset(
    {torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz}
)


class BackendUnavailable(RuntimeError):
    """An explicitly requested backend cannot serve this call; the message says why."""


@dataclass
class Impl:
    """One implementation of one op.

    ``target`` is the function itself or ``"module:function"`` (imported on first use, so
    ``import ftlab`` never imports Triton or builds HIP code). ``platforms`` lists platform
    kinds (``"cpu"``, ``"cuda"``, ``"rocm"``) whose tensors it accepts.
    """

    op: str
    backend: str
    target: Callable | str
    platforms: frozenset[str]
    dtypes: frozenset[torch.dtype] | None = None  # None: any dtype the op accepts
    nvidia_only: bool = False
    available: Callable[[ftplatform.Platform, str], str | None] | None = None
    experimental: bool = False
    info: dict = field(default_factory=dict)  # op-specific capabilities, e.g. {"paths": (...)}
    auto: bool = True  # may "auto" pick it (False: by name only, e.g. not yet run on a GPU)
    _fn: Callable | None = field(default=None, repr=False)

    @property
    def fn(self) -> Callable:
        if self._fn is None:
            if callable(self.target):
                self._fn = self.target
            else:
                module, _, name = self.target.partition(":")
                self._fn = getattr(importlib.import_module(module), name)
        return self._fn

    def cannot_serve(
        self, plat: ftplatform.Platform, device_type: str, dtype: torch.dtype | None
    ) -> str | None:
        """Why this implementation cannot serve a call (None when it can)."""
        if self.nvidia_only and plat.is_rocm:
            return "it is NVIDIA-only and is never used on ROCm"
        kind = "cpu" if device_type == "cpu" else plat.kind
        if device_type != "cpu" and not plat.is_gpu:
            kind = "cpu"
        if kind not in self.platforms:
            where = "CPU tensors" if kind == "cpu" else f"{kind} devices"
            return f"it does not run on {where} (runs on: {', '.join(sorted(self.platforms))})"
        if self.dtypes is not None and dtype is not None and dtype not in self.dtypes:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
            return f"dtype {dtype} is unsupported (supported: {names})"
        if self.available is not None:
            return self.available(plat, device_type)
        return None


_TABLE: dict[str, dict[str, Impl]] = {}
# resolve() results, keyed by the call's device, dtype and routing environment. Ops are
# called on every decode step, and availability is probed once per process anyway.
_RESOLVED: dict[tuple, Impl] = {}


def register(
    op: str,
    backend: str,
    fn: Callable | str,
    *,
    platforms: Iterable[str] = ("cpu", "cuda", "rocm"),
    dtypes: Iterable[torch.dtype] | None = None,
    nvidia_only: bool = False,
    available: Callable[[ftplatform.Platform, str], str | None] | None = None,
    replace: bool = False,
    info: dict | None = None,
    auto: bool = True,
) -> Impl:
    """Add an implementation of ``op`` under the name ``backend``.

    ``fn`` has the op's backend signature (see ``ftlab/reference/<op>.py``). A name other
    than the built-in three is experimental: ``auto`` never picks it, but
    ``backend="<name>"`` calls it and :mod:`ftlab.testing` checks it against the reference::

        ftlab.backends.register("index", "my_gather", my_gather, platforms=["cuda"])
        ftlab.ops.index(w, i, backend="my_gather")
    """
    if op not in _TABLE and backend not in BUILTIN_BACKENDS:
        raise KeyError(f"op must be one of {sorted(_TABLE)}, got {op!r}")
    if backend == "auto":
        raise ValueError("backend name 'auto' is reserved")
    entries = _TABLE.setdefault(op, {})
    if backend in entries and not replace:
        raise ValueError(f"{op!r} already has a backend {backend!r}; pass replace=True")
    impl = Impl(
        op,
        backend,
        fn,
        frozenset(platforms),
        frozenset(dtypes) if dtypes is not None else None,
        nvidia_only,
        available,
        experimental=backend not in BUILTIN_BACKENDS,
        info=dict(info or {}),
        auto=auto and backend in BUILTIN_BACKENDS,
    )
    entries[backend] = impl
    _RESOLVED.clear()
    return impl


def unregister(op: str, backend: str) -> None:
    """Remove an experimental backend (built-in ones stay)."""
    if backend in BUILTIN_BACKENDS:
        raise ValueError(f"built-in backend {backend!r} cannot be removed")
    _TABLE.get(op, {}).pop(backend, None)
    _RESOLVED.clear()


def ops() -> list[str]:
    return sorted(_TABLE)


def backends_of(op: str) -> list[str]:
    if op not in _TABLE:
        raise KeyError(f"op must be one of {sorted(_TABLE)}, got {op!r}")
    return list(_TABLE[op])


_ENV_KEYS = ("FTLAB_BACKEND", "FTLAB_ARCH", "TRITON_INTERPRET")
# os.environ's own mapping (bytes keys on POSIX): three lookups there cost ~0.2 us against
# ~4 us through os.environ.get, which encodes each key; this runs on every op call.
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_BYTES = tuple(k.encode() for k in _ENV_KEYS)


def _routing_env() -> tuple:
    """The environment variables that change routing, as they are now."""
    if isinstance(_ENV_DATA, dict) and os.name == "posix":
        return tuple(_ENV_DATA.get(k) for k in _ENV_BYTES)
    return tuple(os.environ.get(k) for k in _ENV_KEYS)


def resolve(
    op: str,
    backend: str,
    device: torch.device,
    dtype: torch.dtype | None = None,
    plat: ftplatform.Platform | None = None,
) -> Impl:
    """The implementation that serves ``op`` for tensors on ``device`` of ``dtype``."""
    key = None
    if plat is None:
        env = _routing_env()
        key = (op, backend, device.type, device.index, dtype, env)
        hit = _RESOLVED.get(key)
        if hit is not None:
            return hit
    impl = _resolve(op, backend, device, dtype, plat or ftplatform.current(device))
    if key is not None:
        _RESOLVED[key] = impl
    return impl


def _resolve(
    op: str,
    backend: str,
    device: torch.device,
    dtype: torch.dtype | None,
    plat: ftplatform.Platform,
) -> Impl:
    if op not in _TABLE:
        raise KeyError(f"op must be one of {sorted(_TABLE)}, got {op!r}")
    entries = _TABLE[op]
    if backend == "auto":
        backend = os.environ.get("FTLAB_BACKEND", "auto") or "auto"
    if backend != "auto":
        impl = entries.get(backend)
        if impl is None:
            raise ValueError(
                f"backend must be 'auto' or one of {list(entries)} for {op}, got {backend!r}"
            )
        reason = impl.cannot_serve(plat, device.type, dtype)
        if reason:
            raise BackendUnavailable(f"{op}: backend {backend!r} cannot serve this call: {reason}")
        return impl
    order = AUTO_ORDER_GPU if device.type != "cpu" and plat.is_gpu else ("reference",)
    reasons = []
    for name in order:
        impl = entries.get(name)
        if impl is None or not impl.auto:
            continue
        reason = impl.cannot_serve(plat, device.type, dtype)
        if reason is None:
            return impl
        reasons.append(f"{name}: {reason}")
    raise BackendUnavailable(f"{op}: no backend can serve this call ({'; '.join(reasons)})")


def availability(
    op: str, device: torch.device, dtype: torch.dtype | None = None
) -> dict[str, str | None]:
    """``{backend: None if it can serve, else why not}`` for every backend of ``op``."""
    plat = ftplatform.current(device)
    return {name: impl.cannot_serve(plat, device.type, dtype) for name, impl in _TABLE[op].items()}


def available_backends(
    op: str, device: torch.device, dtype: torch.dtype | None = None
) -> list[str]:
    """Names of the backends that can serve ``op`` on ``device`` now."""
    return [name for name, why in availability(op, device, dtype).items() if why is None]


# ------------------------------------------------------------------ availability rules


def triton_unavailable(plat: ftplatform.Platform, device_type: str) -> str | None:
    """Triton runs on CUDA/ROCm GPUs, and on CPU tensors only under TRITON_INTERPRET=1."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if device_type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return "CPU tensors need Triton's interpreter (set TRITON_INTERPRET=1 before import)"
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 is set: Triton kernels run on the CPU only in this process"
    return None


def hip_unavailable(plat: ftplatform.Platform, device_type: str) -> str | None:
    if device_type == "cpu":
        return "HIP kernels need a GPU tensor"
    return _hip_reason(plat)


@functools.cache
def _hip_reason(plat: ftplatform.Platform) -> str | None:
    # looks for compilers on disk: once per platform and process, not on every call
    from ftlab.hip.loader import unavailable_reason

    return unavailable_reason(plat)


def _register_builtin(
    op: str, module: str, dtypes: frozenset[torch.dtype], info: dict | None = None
) -> None:
    info = info or {}
    register(
        op, "reference", f"ftlab.reference.{module}:{op}", dtypes=dtypes, info=info.get("reference")
    )
    register(
        op, "triton", f"ftlab.triton.{module}:{op}", dtypes=dtypes, available=triton_unavailable,
        info=info.get("triton"),
    )  # fmt: skip
    register(
        op,
        "hip",
        f"ftlab.hip.{module}:{op}",
        platforms=("cuda", "rocm"),
        dtypes=dtypes,
        available=hip_unavailable,
        info=info.get("hip"),
    )


_register_builtin("index", "index_store", COPY_DTYPES)
_register_builtin("store", "index_store", COPY_DTYPES)
_register_builtin("quantize_q4_0", "q4_0", FLOAT_DTYPES)
_register_builtin("dequantize_q4_0", "q4_0", FLOAT_DTYPES)
_register_builtin("quantize_q8_1", "q4_0", FLOAT_DTYPES)
# Routed MoE. moe_experts paths (Q4_0 banks; see ops.moe_experts): "int8" and "dequant";
# "prefill" is what path="auto" takes for more than 8 tokens.
for _op in ("route_topk", "moe_align", "moe_experts"):
    _register_builtin(
        _op,
        "moe",
        FLOAT_DTYPES,
        info={
            "reference": {"paths": ("int8", "dequant"), "prefill": "dequant"},
            "triton": {"paths": ("int8", "dequant"), "prefill": "dequant"},
            "hip": {"paths": ("int8",), "prefill": "int8"},
        }
        if _op == "moe_experts"
        else None,
    )
_register_builtin("qk_norm_rope", "norm_rope", FLOAT_DTYPES)
# q4_0_matmul paths: "int8" (Q8_1 activations, int8 dot) and "dequant" (dequantized
# weights, float matmul). "prefill" is what path="auto" takes for more than 8 rows.
_register_builtin(
    "q4_0_matmul",
    "q4_0",
    FLOAT_DTYPES,
    info={
        "reference": {"paths": ("int8", "dequant"), "prefill": "dequant"},
        "triton": {"paths": ("int8", "dequant"), "prefill": "dequant"},
        "hip": {"paths": ("int8",), "prefill": "int8"},
    },
)

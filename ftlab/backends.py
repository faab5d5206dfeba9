"""The routing table: one spec per op, and the one resolver that picks an implementation.

Each :class:`OpSpec` names the op, its family (the module name it has in ``ftlab/reference``,
``ftlab/triton``, ``ftlab/hip``, ``ftlab/ops``, ``ftlab/testing``, ``ftlab/bench`` and
``tests/property/test_<family>.py``; :mod:`ftlab.catalog` lists them), the Q4_0 paths it takes,
and its implementations per backend, each with a typed :class:`Capability`: the platforms and
dtypes it serves, the paths it implements and its prefill path. The built-in backends are
``reference`` (the specification, plain PyTorch), ``triton``, ``hip`` and ``cpu`` (native CPU
kernels: ``moe_experts`` only, picked by name); researchers add their own with :func:`register`.

Routing rules (docs/ARCHITECTURE.md, "Routing"):

- an explicit backend that cannot serve the call raises :class:`BackendUnavailable` naming why
  (no GPU, arch not built, dtype unsupported, path not implemented) -- never a silent fallback;
- ``auto`` on a GPU tensor: ``hip`` if it can serve, else ``triton``, else ``reference``; on a
  CPU tensor: ``reference`` (Triton runs on the CPU only in its slow interpreter, for tests, and
  the native ``cpu`` kernels only when asked for by name). With an explicit Q4_0 path, ``auto``
  takes the first of these that implements it;
- ``path="auto"``: ``"int8"`` (the int8-dot decode kernels) up to :data:`DECODE_MAX_TOKENS` rows,
  else the implementation's prefill path;
- on ROCm an implementation marked ``nvidia_only`` is never selected, whatever the flags;
- ``FTLAB_BACKEND=<name>`` replaces ``auto`` with that backend (then it is explicit: it raises if
  it cannot serve); ``FTLAB_ARCH`` fakes the platform (see :mod:`ftlab.platform`).
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
#: How Q4_0 weights are multiplied: "int8" (Q8_1 activations, exact int8 block dots) or
#: "dequant" (weights dequantized, float matmul). docs/OPS.md section 2.
Q4_0_PATHS = ("int8", "dequant")

#: The float dtypes of activations and dense weights, in the order messages name them.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: What the copies (index / store) move: the float dtypes and fp8 e4m3.
COPY_DTYPES = (*FLOAT_DTYPES, torch.float8_e4m3fn, torch.float8_e4m3fnuz)

Availability = Callable[[ftplatform.Platform, str], "str | None"]


class BackendUnavailable(RuntimeError):
    """An explicitly requested backend cannot serve this call; the message says why."""


@dataclass(frozen=True)
class Capability:
    """What one implementation of an op can serve.

    ``platforms``: platform kinds whose tensors it takes (``"cpu"``, ``"cuda"``, ``"rocm"``);
    ``dtypes``: None for any dtype the op accepts; ``paths``: the Q4_0 paths it implements (empty
    for ops without paths) and ``prefill_path`` the one ``path="auto"`` takes above
    :data:`DECODE_MAX_TOKENS` rows; ``auto``: whether ``backend="auto"`` may pick it;
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

    def cannot_serve(self, plat: ftplatform.Platform, device_type: str, dtype: torch.dtype | None,
                     path: str | None = None) -> str | None:  # fmt: skip
        """Why this implementation cannot serve a call (None when it can)."""
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
            return f"it implements the {' and '.join(caps.paths)} path(s) for Q4_0 weights, not {path!r}"
        if caps.available is not None:
            return caps.available(plat, device_type)
        return None


@dataclass
class OpSpec:
    """One op: its name, family (module name in every backend folder), a one-line summary, the
    Q4_0 paths it takes (empty: none) and its implementations by backend name."""

    name: str
    family: str
    summary: str = ""
    paths: tuple[str, ...] = ()
    impls: dict[str, Impl] = field(default_factory=dict)


#: op name -> spec: the routing table.
SPECS: dict[str, OpSpec] = {}
# resolve() results, keyed by the call's device, dtype, path and routing environment: ops are
# called on every decode step, and availability is probed once per process anyway.
_RESOLVED: dict[tuple, Impl] = {}


def spec(op: str) -> OpSpec:
    """The spec of ``op``; KeyError naming the known ops otherwise."""
    found = SPECS.get(op)
    if found is None:
        raise KeyError(f"op must be one of {sorted(SPECS)}, got {op!r}")
    return found


def define_op(name: str, family: str, summary: str = "", paths: tuple[str, ...] = ()) -> OpSpec:
    """Add an op to the table (its implementations come through :func:`register`)."""
    if name in SPECS:
        raise ValueError(f"op {name!r} is already defined")
    SPECS[name] = OpSpec(name, family, summary, tuple(paths))
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

    ``paths`` (ops with Q4_0 paths): those it implements, default all of the op's;
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
    _RESOLVED.clear()
    return impl


def unregister(op: str, backend: str) -> None:
    """Remove an experimental backend (built-in ones stay)."""
    if backend in BUILTIN_BACKENDS:
        raise ValueError(f"built-in backend {backend!r} cannot be removed")
    if op in SPECS:
        SPECS[op].impls.pop(backend, None)
    _RESOLVED.clear()


def ops() -> list[str]:
    return sorted(SPECS)


def backends_of(op: str) -> list[str]:
    return list(spec(op).impls)


_ENV_KEYS = ("FTLAB_BACKEND", "FTLAB_ARCH", "TRITON_INTERPRET")
# os.environ's own dict as keyed (what os.environ.get reads): ~2.4 us less a lookup, 3 a resolve
_ENV_DATA, _ENV_RAW = getattr(os.environ, "_data", None), tuple(map(getattr(os.environ, "encodekey", str), _ENV_KEYS))
_FAST_ENV = isinstance(_ENV_DATA, dict)


def resolve(op: str, backend: str, device: torch.device, dtype: torch.dtype | None = None,
            plat: ftplatform.Platform | None = None, *, path: str | None = None) -> Impl:  # fmt: skip
    """The implementation that serves ``op`` for tensors on ``device`` of ``dtype``; with
    ``path``, one that implements that Q4_0 path."""
    key = None
    if plat is None:
        env = map(_ENV_DATA.get, _ENV_RAW) if _FAST_ENV else map(os.environ.get, _ENV_KEYS)
        key = (op, backend, device.type, device.index, dtype, path, *env)
        hit = _RESOLVED.get(key)
        if hit is not None:
            return hit
    impl = _resolve(spec(op), backend, device, dtype, plat or ftplatform.current(device), path)
    if key is not None:
        _RESOLVED[key] = impl
    return impl


def resolve_path(op: str, backend: str, device: torch.device, dtype: torch.dtype | None, rows: int,
                 path: str = "auto") -> tuple[Impl, str]:  # fmt: skip
    """(implementation, path) for a call of ``op`` on Q4_0 weights with ``rows`` rows of
    activations (tokens): ``path="auto"`` takes int8 up to :data:`DECODE_MAX_TOKENS` rows, else
    the implementation's prefill path; an explicit path must be implemented by the backend
    (``auto``: the first in auto order that implements it)."""
    paths = spec(op).paths
    if path != "auto" and path not in paths:
        raise ValueError(f"path must be 'auto' or one of {paths}, got {path!r}")
    impl = resolve(op, backend, device, dtype, path=None if path == "auto" else path)
    return impl, impl.caps.path_for(rows, path)  # in impl.caps.paths: resolve checked an explicit one


def _resolve(entry: OpSpec, backend: str, device: torch.device, dtype: torch.dtype | None,
             plat: ftplatform.Platform, path: str | None) -> Impl:  # fmt: skip
    op = entry.name
    if backend == "auto":
        backend = os.environ.get("FTLAB_BACKEND") or "auto"
    if backend != "auto":
        impl = entry.impls.get(backend)
        if impl is None:
            raise ValueError(f"backend must be 'auto' or one of {list(entry.impls)} for {op}, got {backend!r}")
        reason = impl.cannot_serve(plat, device.type, dtype, path)
        if reason:
            raise BackendUnavailable(f"{op}: backend {backend!r} cannot serve this call: {reason}")
        return impl
    order = AUTO_ORDER_GPU if device.type != "cpu" and plat.is_gpu else AUTO_ORDER_CPU
    reasons = []
    for name in order:
        impl = entry.impls.get(name)
        if impl is None or not impl.caps.auto:
            continue
        reason = impl.cannot_serve(plat, device.type, dtype, path)
        if reason is None:
            return impl
        reasons.append(f"{name}: {reason}")
    raise BackendUnavailable(f"{op}: no backend can serve this call ({'; '.join(reasons)})")


def availability(op: str, device: torch.device, dtype: torch.dtype | None = None,
                 path: str | None = None) -> dict[str, str | None]:  # fmt: skip
    """``{backend: None if it can serve, else why not}`` for every backend of ``op``."""
    plat = ftplatform.current(device)
    return {name: impl.cannot_serve(plat, device.type, dtype, path) for name, impl in spec(op).impls.items()}


def available_backends(op: str, device: torch.device, dtype: torch.dtype | None = None,
                       path: str | None = None) -> list[str]:  # fmt: skip
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
            return ("CPU tensors need Triton's interpreter (set TRITON_INTERPRET=1 before importing triton; it is "
                    "slow, for tests: backend='auto' uses the reference on the CPU)")  # fmt: skip
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 is set: Triton kernels run on the CPU only in this process"
    return None


def hip_unavailable(plat: ftplatform.Platform, device_type: str) -> str | None:
    if device_type == "cpu":
        return "HIP kernels need a GPU tensor"
    return _gpu_build_reason(plat)


@functools.cache
def _gpu_build_reason(plat: ftplatform.Platform) -> str | None:
    # looks for compilers on disk: once per platform and process, not on every call
    from ftlab import jit

    return jit.gpu_unavailable_reason(plat)


def cpu_unavailable(plat: ftplatform.Platform, device_type: str) -> str | None:
    from ftlab import jit

    return jit.cpu_unavailable_reason()


# ------------------------------------------------------------------ the built-in ops

#: backends whose int8 prefill ``backend="auto"`` passes over for Triton's dequant GEMM on Q8_0 /
#: K-quant weights (``quant_matmul``, ``moe_experts`` with no Q4_0 bank), on the platform kinds
#: where that was measured, where Triton serves the call: on the H200 HIP's dp4a tiles took 1312
#: us at M = 512 on a 14336 x 4096 Q4_K weight and 8.5 ms for a Qwen3-30B-A3B layer's experts at
#: T = 512, Triton's GEMMs (64-weight steps) 386 us and 1.4 ms (benchmarks/NOTES.md). ROCm keeps
#: hip: unmeasured there, and RDNA's Triton takes the slower weight-at-a-time tiles.
KQUANT_PREFILL_OVER = {"hip": ("cuda",)}
#: the GPU archs where the rule of :data:`KQUANT_PREFILL_OVER` also takes Q4_0 weights
#: (``q4_0_matmul``, ``moe_experts`` on Q4_0 banks): where Triton has timed 64-weight-step tiles
#: for Q4_0 (``ftlab.triton.quant_matmul.GEMM_CONFIGS["q4_0"]``, ``ftlab.triton.moe_kquant.
#: KQ_GEMM_CONFIGS["q4_0_pairs"]``) that beat HIP's int8 prefill in the same run (benchmarks/NOTES.md)
Q4_0_PREFILL_ARCHS = ("sm_90",)


def kquant_prefill(op: str, impl: Impl, backend: str, requested: str, device: torch.device,
                   dtype: torch.dtype, rows: int, plat: ftplatform.Platform | None = None,
                   q4_0: bool = False) -> tuple[Impl, str] | None:  # fmt: skip
    """Triton's (implementation, path) for a prefill call of ``op`` on Q8_0 / K-quant weights
    that ``backend="auto"`` resolved to ``impl`` (see :data:`KQUANT_PREFILL_OVER`), or None to
    keep ``impl``: only for backend and path "auto", above :data:`DECODE_MAX_TOKENS` rows, on
    ``plat`` (default: ``device``'s) of a kind listed for ``impl``'s backend; with ``q4_0`` (the
    weights are Q4_0: a Q4_0 matmul, two Q4_0 expert banks) and 16-bit ``dtype``, only on :data:`Q4_0_PREFILL_ARCHS`."""
    if backend != "auto" or requested != "auto" or rows <= DECODE_MAX_TOKENS:
        return None
    kinds = KQUANT_PREFILL_OVER.get(impl.backend, ())
    plat = plat or ftplatform.current(device)
    if plat.kind not in kinds:
        return None
    if q4_0 and (dtype == torch.float32 or plat.arch not in Q4_0_PREFILL_ARCHS):
        return None
    try:
        return resolve_path(op, "triton", device, dtype, rows, "dequant")
    except BackendUnavailable:
        return None


_INT8_ONLY = {"paths": ("int8",), "prefill_path": "int8"}
_BOTH_PATHS = {"paths": Q4_0_PATHS, "prefill_path": "dequant"}


def _builtin(op: str, family: str, summary: str, dtypes: frozenset[torch.dtype], *,
             paths: tuple[str, ...] = (), cpu: bool = False) -> None:  # fmt: skip
    """reference + triton + hip (+ the native cpu kernels, by name only) of ``op`` from
    ``ftlab/<backend>/<family>.py``. Q4_0 paths: reference and triton both, hip and cpu int8 only
    (their prefill kernels too). The reference reads tensors on the host: not graph-capturable."""
    define_op(op, family, summary, paths)
    both = _BOTH_PATHS if paths else {}
    int8 = _INT8_ONLY if paths else {}
    register(op, "reference", f"ftlab.reference.{family}:{op}", dtypes=dtypes, capturable=False, **both)
    register(op, "triton", f"ftlab.triton.{family}:{op}", dtypes=dtypes, available=triton_unavailable, **both)
    register(op, "hip", f"ftlab.hip.{family}:{op}", platforms=("cuda", "rocm"), dtypes=dtypes,
             available=hip_unavailable, **int8)  # fmt: skip
    if cpu:
        register(op, "cpu", f"ftlab.cpu.{family}:{op}", platforms=("cpu",), dtypes=dtypes,
                 available=cpu_unavailable, auto=False, capturable=False, **int8)  # fmt: skip


_builtin("index", "index_store", "gather rows (embedding lookup, KV-cache read)", COPY_DTYPES)
_builtin("store", "index_store", "scatter rows into a KV cache in place", COPY_DTYPES)
_builtin("quantize_q4_0", "q4_0", "float weights to GGUF Q4_0 blocks", FLOAT_DTYPES)
_builtin("dequantize_q4_0", "q4_0", "GGUF Q4_0 blocks to float", FLOAT_DTYPES)
_builtin("quantize_q8_1", "q4_0", "activations to Q8_1 blocks (the int8 dot's other side)", FLOAT_DTYPES)
_builtin("q4_0_matmul", "q4_0", "x @ W.T, Q4_0 weights: int8-dot matvec, prefill GEMM", FLOAT_DTYPES, paths=Q4_0_PATHS)
_builtin("add_rmsnorm_q4_0_matmul", "q4_0", "add_rmsnorm, then q4_0_matmul of y (decode: one launch)", FLOAT_DTYPES,
         paths=Q4_0_PATHS)  # fmt: skip
_builtin("route_topk", "moe", "router: softmax, top-k, renormalize", FLOAT_DTYPES)
_builtin("router_topk", "moe", "router linear layer then route_topk (decode: one launch)", FLOAT_DTYPES)
_builtin("add_rmsnorm_router_topk", "moe", "add_rmsnorm, then router_topk of y (decode: one launch)", FLOAT_DTYPES)
_builtin("moe_align", "moe", "group (token, slot) pairs by expert for the grouped GEMM", FLOAT_DTYPES)
_builtin("moe_experts", "moe", "routed SwiGLU experts, dense or Q4_0 banks", FLOAT_DTYPES, paths=Q4_0_PATHS,
         cpu=True)  # fmt: skip
_builtin("qk_norm_rope", "qk_norm_rope", "per-head RMSNorm of q and k, then RoPE", FLOAT_DTYPES)
_builtin("dequantize", "quants", "GGUF Q8_0 / Q4_K / Q5_K / Q6_K blocks to float (Q4_0: dequantize_q4_0)",
         FLOAT_DTYPES)  # fmt: skip
_builtin("causal_conv1d", "conv1d", "causal depthwise conv1d with a carried state (gated deltanet prefill)",
         FLOAT_DTYPES)  # fmt: skip
_builtin("causal_conv1d_update", "conv1d", "one decode token of causal_conv1d, state updated in place", FLOAT_DTYPES)
_builtin("gated_rmsnorm", "gated_norm", "per-head RMSNorm times SiLU of a gate (gated deltanet output)", FLOAT_DTYPES)
_builtin("output_gate", "gated_norm", "attention output times sigmoid of a gate", FLOAT_DTYPES)
_builtin("add_rmsnorm", "norm", "residual add fused with the next RMSNorm (decode hot path)", FLOAT_DTYPES)
_builtin("decode_attention", "attention", "one query token a sequence over its cached keys and values (split-K)",
         FLOAT_DTYPES)  # fmt: skip
_builtin("quantize", "quants", "float weights to GGUF Q8_0 blocks (Q4_0: quantize_q4_0)", FLOAT_DTYPES)
_builtin("gated_delta_rule", "deltanet", "Gated DeltaNet linear attention over a sequence (prefill)", FLOAT_DTYPES)
_builtin("gated_delta_step", "deltanet", "Gated DeltaNet, one decode token, the state in place", FLOAT_DTYPES)
_builtin("quant_matmul", "quant_matmul", "x @ W.T for Q8_0 / Q4_K / Q5_K / Q6_K weights (Q4_0: q4_0_matmul)",
         FLOAT_DTYPES, paths=Q4_0_PATHS)  # fmt: skip

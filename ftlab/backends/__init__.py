"""Routing: which implementation, path and kernel variant runs each call, decided in one place.

- :mod:`~ftlab.backends.registry`: the ops, their implementations per backend and what each can
  serve (``spec``, ``register``, ``resolve``, ``available_backends``);
- :mod:`~ftlab.backends.rules`: the measured choices as tables (``PREFER``, ``KERNELS``,
  ``DEFAULTS``), each row with its reason and the results that measured it;
- :mod:`~ftlab.backends.planner`: :func:`plan` reads them and returns a :class:`Plan` (backend,
  path, variant, reason); ``ftlab ops NAME --explain`` prints one.

Routing rules (docs/ARCHITECTURE.md, "Routing"): an explicit backend, path or variant that cannot
serve the call raises :class:`BackendUnavailable` naming why -- never a silent fallback; ``auto``
on a GPU tensor tries hip, triton, reference, except where a ``PREFER`` row says otherwise; on a
CPU tensor the reference (Triton runs CPU tensors only in its interpreter, the native ``cpu``
kernels only when named); ``path="auto"``: int8 up to :data:`DECODE_MAX_TOKENS` rows, else the
implementation's prefill path; ``FTLAB_BACKEND=<name>`` replaces ``auto`` (then it is explicit);
``FTLAB_ARCH`` fakes the platform (:mod:`ftlab.platform`).
"""

from ftlab.backends import builtin as builtin
from ftlab.backends.calls import Call
from ftlab.backends.planner import Plan, checked_plan, option_for, plan, variant_for, why_not
from ftlab.backends.registry import (
    ALL_PLATFORMS,
    AUTO_ORDER_CPU,
    AUTO_ORDER_GPU,
    BUILTIN_BACKENDS,
    COPY_DTYPES,
    DECODE_MAX_TOKENS,
    FLOAT_DTYPES,
    Q4_0_PATHS,
    SPECS,
    BackendUnavailable,
    Capability,
    Impl,
    OpSpec,
    availability,
    available_backends,
    backends_of,
    cpu_unavailable,
    define_op,
    hip_unavailable,
    ops,
    register,
    resolve,
    resolve_path,
    spec,
    triton_unavailable,
    unregister,
)

__all__ = [
    "ALL_PLATFORMS",
    "AUTO_ORDER_CPU",
    "AUTO_ORDER_GPU",
    "BUILTIN_BACKENDS",
    "COPY_DTYPES",
    "DECODE_MAX_TOKENS",
    "FLOAT_DTYPES",
    "Q4_0_PATHS",
    "SPECS",
    "BackendUnavailable",
    "Call",
    "Capability",
    "Impl",
    "OpSpec",
    "Plan",
    "availability",
    "available_backends",
    "backends_of",
    "builtin",
    "checked_plan",
    "cpu_unavailable",
    "define_op",
    "hip_unavailable",
    "option_for",
    "ops",
    "plan",
    "register",
    "resolve",
    "resolve_path",
    "spec",
    "triton_unavailable",
    "unregister",
    "variant_for",
    "why_not",
]

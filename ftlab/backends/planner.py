"""The planner: for one call of one op, the backend, path and kernel variant that run it, and why.

:func:`plan` is the only place in ftlab that picks. It starts from what can serve
(:func:`ftlab.backends.registry.resolve`: an explicit backend, or the first of the auto order),
applies the measured departures of :data:`~ftlab.backends.rules.PREFER` to ``backend="auto"``,
resolves ``path="auto"`` by the rows, and asks the backend's variant table
(:data:`~ftlab.backends.rules.DEFAULTS`) for its kernel. Every step adds a clause to the plan's
``reason``; ``ftlab ops NAME --explain`` prints it. A variant named by the caller is checked, never
swapped: one that cannot serve is :class:`~ftlab.backends.registry.BackendUnavailable` naming
why. Plans are cached per (op, request, call, routing environment).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ftlab import platform as ftplatform
from ftlab.backends import calls, rules
from ftlab.backends.calls import Call
from ftlab.backends.registry import (
    DECODE_MAX_TOKENS,
    FORGET_HOOKS,
    BackendUnavailable,
    Impl,
    auto_order,
    resolve_uncached,
    routing_env,
    spec,
)


@dataclass(frozen=True)
class Plan:
    """How one call runs: ``backend`` (its implementation ``impl``), ``path`` (quantized weights:
    ``"int8"`` or ``"dequant"``; None for other ops), ``variant`` (the backend's kernel; None
    where the backend has one way for the call) and ``reason``, one clause a decision."""

    op: str
    backend: str
    path: str | None
    variant: str | None
    reasons: tuple[str, ...]
    impl: Impl = field(repr=False, compare=False)
    options: tuple[tuple[str, str], ...] = ()
    call: Call | None = field(default=None, repr=False, compare=False)

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    def run(self, *args, **kwargs):
        """Call the implementation (with ``variant=`` where the plan names one, the variant's
        options and the plan's ``call``: the backends with variant tables take them)."""
        if self.variant is not None:
            kwargs["variant"] = self.variant
            kwargs["call"] = self.call
        kwargs.update(self.options)
        return self.impl.fn(*args, **kwargs)

    def describe(self) -> str:
        """The plan in a few lines, for people."""
        head = f"{self.op}: backend {self.backend}"
        if self.path is not None:
            head += f", path {self.path}"
        if self.variant is not None:
            head += f", variant {self.variant}"
        head += "".join(f", {name} {value}" for name, value in self.options)
        return "\n".join([head, *(f"  - {clause}" for clause in self.reasons)])


PLANS: dict[tuple, Plan] = {}
FORGET_HOOKS.append(PLANS.clear)


def sizes_of(op: str, call: Call) -> dict[str, int]:
    """``call.dims`` by the names of ``op``'s shape."""
    names = spec(op).shape
    if len(call.dims) != len(names):
        raise ValueError(
            f"{op}'s call must give {len(names)} dims ({', '.join(names)}), got {call.dims}"
        )
    return dict(zip(names, call.dims, strict=True))


def plan(
    op: str,
    call: Call,
    *,
    backend: str = "auto",
    path: str | None = None,
    variant: str | None = None,
    platform: ftplatform.Platform | None = None,
) -> Plan:
    """The plan of a call of ``op`` described by ``call``: ``backend`` ("auto" or a name),
    ``path`` ("auto", "int8", "dequant"; None for ops without paths), ``variant`` (a kernel of
    the chosen backend, None: its default). ``platform``: plan for another platform than the
    call's device (``--explain --arch``; not cached). Raises :class:`BackendUnavailable` (an
    explicit backend, path or variant that cannot serve) or ValueError (a bad name)."""
    key, probe = None, platform is None
    if platform is None:
        key = (op, backend, path, variant, call, *routing_env())
        hit = PLANS.get(key)
        if hit is not None:
            return hit
        device = torch.device(call.device, call.index)
        platform = ftplatform.current(device)
    made = make_plan(op, call, backend, path, variant, platform, probe)
    if key is not None:
        PLANS[key] = made
    return made


def make_plan(
    op: str,
    call: Call,
    backend: str,
    path: str | None,
    variant: str | None,
    plat: ftplatform.Platform,
    probe: bool = True,
) -> Plan:
    entry = spec(op)
    sizes = sizes_of(op, call)
    where = calls.regime(call.dims[0] if call.dims else 1)
    if path is not None and path != "auto" and path not in entry.paths:
        raise ValueError(f"path must be 'auto' or one of {entry.paths}, got {path!r}")
    dense = op == "moe_experts" and not call.qtypes  # dense banks: no path
    asked = None if path in (None, "auto") or dense else path
    impl = resolve_uncached(entry, backend, call.device, call.dtype, plat, asked, probe)
    reason = [explain_backend(op, backend, impl, call, plat)]
    if not probe:
        reason.append(f"planned for {plat.describe()}, its toolchain assumed installed")
    if backend == "auto" and variant is None:
        preferred = prefer(op, call, sizes, where, path, plat, probe)
        if preferred is not None:
            impl, path, why = preferred
            reason[0] = f"{impl.backend}: {why}"
    chosen = None
    if entry.paths and path is not None:
        if not call.qtypes and op != "moe_experts":
            raise ValueError(f"{op} takes quantized weights: the call names no quant type")
        chosen = impl.caps.path_for(call.dims[0], path)
        if not call.qtypes:
            reason.append(f"path {path!r} unused: dense banks")
            chosen = None
        elif path == "auto":
            rows = call.dims[0]
            if chosen == "int8" and rows <= DECODE_MAX_TOKENS:
                why = f"{rows} row(s), at most DECODE_MAX_TOKENS = {DECODE_MAX_TOKENS}: decode"
            else:
                why = f"{rows} rows: {impl.backend}'s prefill path"
            reason.append(f"path {chosen}: {why}")
    found, why = pick_variant(op, impl.backend, call, sizes, where, plat, variant, chosen)
    options = ()
    if found is not None:
        reason.append(f"variant {found}: {why}")
        picked = pick_option(op, impl.backend, found, call, sizes, where, plat, None)
        if picked is not None:
            name, value, why = picked
            options = ((name, value),)
            reason.append(f"{name} {value}: {why}")
    reason += precision_note(op, impl.backend, found, call)
    return Plan(op, impl.backend, chosen, found, tuple(reason), impl, options, call)


def explain_backend(op: str, backend: str, impl: Impl, call: Call, plat) -> str:
    if backend != "auto":
        return f"{impl.backend}: asked for by name"
    if os.environ.get("FTLAB_BACKEND"):
        return f"{impl.backend}: FTLAB_BACKEND={impl.backend}"
    order = auto_order(call.device, plat)
    return f"{impl.backend}: the first of the auto order ({', '.join(order)}) that serves"


def prefer(op, call, sizes, where, path, plat, probe=True) -> tuple[Impl, str, str] | None:
    """The first :data:`~ftlab.backends.rules.PREFER` row for this call whose backend serves it:
    (its implementation, the path asked of it, why), or None."""
    entry = spec(op)
    for row in rules.PREFER:
        if op not in row.ops or row.when.miss(call, plat, where) is not None:
            continue
        if row.path is not None and path not in ("auto", None, row.path):
            continue
        impl = entry.impls.get(row.backend)
        want = row.path if row.path is not None else (None if path in (None, "auto") else path)
        if impl is None or impl.cannot_serve(plat, call.device, call.dtype, want, probe):
            continue
        if row.variants is not None:
            try:
                found, _ = pick_variant(op, row.backend, call, sizes, where, plat, None, want)
            except BackendUnavailable:
                continue
            if found not in row.variants:
                continue
        return impl, (row.path or path), row.why
    return None


def kernel_miss(op, backend, name, call, sizes, where, plat, path=None) -> str | None:
    """Why ``backend``'s kernel ``name`` of ``op`` cannot serve ``call`` on ``path`` (None: it
    can)."""
    kernels = {k.name: k for k in rules.KERNELS.get((op, backend), ())}
    kernel = kernels.get(name)
    if kernel is None:
        raise ValueError(
            f"variant must be one of {sorted(kernels) or 'none'} for {op} on "
            f"{backend}, got {name!r}"
        )
    why = kernel.when.miss(call, plat, where, path)
    if why is None and kernel.limit is not None:
        why = kernel.limit(call, sizes, plat)
    return why


def pick_variant(op, backend, call, sizes, where, plat, asked, path) -> tuple[str | None, str]:
    """(the variant ``backend`` runs for ``op`` on ``path``, why): ``asked`` where it serves
    (else BackendUnavailable), else the first default that holds and serves."""
    if (op, backend) not in rules.KERNELS:
        if asked is not None:
            raise ValueError(
                f"variant must be None for {op} on {backend} (it has one kernel "
                f"path), got {asked!r}"
            )
        return None, ""
    if asked is not None:
        why = kernel_miss(op, backend, asked, call, sizes, where, plat, path)
        if why is not None:
            raise BackendUnavailable(
                f"{op}: {backend}'s variant {asked!r} cannot serve this call: {why}"
            )
        return asked, "asked for by name"
    passed = []
    kernels = {k.name: k for k in rules.KERNELS[(op, backend)]}
    for row in rules.DEFAULTS[(op, backend)]:
        kernel = kernels[row.variant]
        if row.when.miss(call, plat, where, path) or kernel.when.miss(call, plat, where, path):
            continue
        why = kernel.limit(call, sizes, plat) if kernel.limit is not None else None
        if why is None:
            note = f" (passed over: {', '.join(passed)})" if passed else ""
            return row.variant, row.why + note
        passed.append(f"{row.variant}: {why}")
    raise BackendUnavailable(f"{op}: no kernel of {backend} serves this call ({'; '.join(passed)})")


def checked_plan(plan: Plan | None, op: str) -> Plan | None:
    """``plan`` where it is one of ``op``'s (TypeError / ValueError naming the argument
    otherwise); None stays None."""
    if plan is None:
        return None
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a ftlab.backends.Plan or None, got {type(plan).__name__}")
    if plan.op != op:
        raise ValueError(f"plan must be a plan of {op}, got one of {plan.op}")
    return plan


def pick_option(
    op, backend, variant, call, sizes, where, plat, asked
) -> tuple[str, str, str] | None:
    """(option name, value, why) of ``backend``'s ``variant`` for the call: ``asked`` where its
    limit passes (else BackendUnavailable), else the first default row that holds and passes; None
    for a variant without options."""
    spec_ = rules.OPTIONS.get((op, backend, variant))
    if spec_ is None:
        if asked is not None:
            raise ValueError(
                f"{op}: {backend}'s variant {variant!r} takes no option, got {asked!r}"
            )
        return None
    name, rows = spec_
    values = sorted({k[3] for k in rules.OPTION_LIMITS if k[:3] == (op, backend, variant)})
    if asked is not None:
        if asked not in values:
            raise ValueError(
                f"{name} must be one of {values} for {backend}'s {variant}, got {asked!r}"
            )
        why = rules.OPTION_LIMITS[(op, backend, variant, asked)](call, sizes, plat)
        if why is not None:
            raise BackendUnavailable(
                f"{op}: {backend}'s {variant} with {name} {asked!r} cannot serve this call: {why}"
            )
        return name, asked, "asked for by name"
    passed = []
    for row in rows:
        if row.when.miss(call, plat, where) is not None:
            continue
        why = rules.OPTION_LIMITS[(op, backend, variant, row.value)](call, sizes, plat)
        if why is None:
            note = f" (passed over: {', '.join(passed)})" if passed else ""
            return name, row.value, row.why + note
        passed.append(f"{row.value}: {why}")
    raise BackendUnavailable(
        f"{op}: no {name} of {backend}'s {variant} serves this call ({'; '.join(passed)})"
    )


def option_for(
    op: str, backend: str, variant: str, call: Call, name: str, asked: str | None = None
) -> str:
    """The value of ``backend``'s ``variant``'s option ``name`` for ``call``: ``asked`` where it
    serves (else BackendUnavailable), None: the default. What a backend entry asks; cached."""
    key = (op, backend, variant, call, name, asked, os.environ.get("FTLAB_ARCH"))
    if key not in VARIANTS:
        plat = ftplatform.current(torch.device(call.device, call.index))
        where = calls.regime(call.dims[0] if call.dims else 1)
        got = pick_option(op, backend, variant, call, sizes_of(op, call), where, plat, asked)
        if got is None or got[0] != name:
            raise ValueError(f"{op}: {backend}'s variant {variant!r} has no option {name!r}")
        VARIANTS[key] = got[1]
    return VARIANTS[key]


def precision_note(op: str, backend: str, variant: str | None, call: Call) -> list[str]:
    """Where ``precision="bf16"`` is asked of a kernel that keeps fp32 operands: say so."""
    if call.precision != "bf16":
        return []
    takes = rules.BF16_OPERANDS.get((op, backend), ())
    if variant in takes and call.dtype == torch.bfloat16:
        return ["precision bf16: bf16 operands, fp32 sums"]
    return [
        f"precision bf16 does not apply here ({backend} {variant or ''} on {call.dtype}); "
        "the fp32 result, within both bounds"
    ]


VARIANTS: dict[tuple, str | None] = {}
FORGET_HOOKS.append(VARIANTS.clear)


def variant_for(
    op: str, backend: str, call: Call, variant: str | None = None, path: str | None = None
) -> str | None:
    """The kernel a backend entry runs for ``call`` (on ``path``): ``variant`` where it serves
    (else BackendUnavailable naming why), None: the backend's default for the call. What a
    backend entry asks when called directly (benchmarks, tests) or from a plan; cached."""
    key = (op, backend, call, variant, path, os.environ.get("FTLAB_ARCH"))
    if key in VARIANTS:
        return VARIANTS[key]
    plat = ftplatform.current(torch.device(call.device, call.index))
    where = calls.regime(call.dims[0] if call.dims else 1)
    found, _ = pick_variant(op, backend, call, sizes_of(op, call), where, plat, variant, path)
    VARIANTS[key] = found
    return found


def why_not(
    op: str,
    backend: str,
    variant: str,
    call: Call,
    path: str | None = None,
    staging: str | None = None,
) -> str | None:
    """Why ``backend``'s kernel ``variant`` of ``op`` (with the option value ``staging``, for the
    variants that take one) cannot serve ``call`` (on ``path``) on its device's platform, or None
    where it can (ValueError for a variant or value the backend lacks)."""
    plat = ftplatform.current(torch.device(call.device, call.index))
    where = calls.regime(call.dims[0] if call.dims else 1)
    sizes = sizes_of(op, call)
    why = kernel_miss(op, backend, variant, call, sizes, where, plat, path)
    if why is None and staging is not None:
        try:
            pick_option(op, backend, variant, call, sizes, where, plat, staging)
        except BackendUnavailable as e:
            why = str(e).rsplit("this call: ", 1)[-1]
    return why

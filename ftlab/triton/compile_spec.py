"""Compile-check specs of Triton kernels (``ftlab compile-check``), derived from the kernels'
own signatures.

Each Triton module lists the configurations it launches in ``compile_specs(target)`` through
:func:`spec`, which reads the kernel's parameters in order and types them: a constexpr
parameter takes its value from ``constexprs`` (every one without a default must be given), a
pointer parameter (named ``*_ptr``) its element type from ``types``, any other parameter is an
``i32`` unless ``types`` says otherwise (``i64``, ``fp32``). A name in ``types`` or
``constexprs`` that the kernel does not have is an error, so a spec cannot drift from the
kernel it checks.

``multiple_of_16`` names runtime parameters that every launch of the configuration gives as
multiples of 16 (a pointer: 16-byte aligned; an integer: divisible by 16), for Triton's launcher
specializes on them (``tt.divisibility``) and the code it compiles can differ a lot (the dequant
GEMMs: vector activation loads, half the registers). The launching wrapper must make it true
(e.g. copy a misaligned activation), not hope for it. The launcher specializes other parameters
too where their values allow (other pointers, sizes); the check leaves those generic, so a row
can only be as good as or worse than the variant that runs, never better.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TritonSpec:
    """One configuration of a Triton kernel as ftlab launches it."""

    label: str
    kernel: object
    signature: dict[str, str]
    constexprs: dict[str, object]
    num_warps: int = 4
    options: dict = field(default_factory=dict)  # further triton.compile options
    # ASTSource attrs: {(parameter index,): [["tt.divisibility", 16]]}
    attrs: dict = field(default_factory=dict)


def _parameters(kernel) -> list[inspect.Parameter]:
    fn = getattr(kernel, "fn", kernel)  # a JITFunction, or the interpreter's wrapper
    return list(inspect.signature(fn).parameters.values())


def _is_constexpr(p: inspect.Parameter) -> bool:
    return p.annotation is not inspect.Parameter.empty and "constexpr" in str(p.annotation)


def spec(
    kernel,
    label: str,
    *,
    types: dict[str, str] | None = None,
    constexprs: dict[str, object] | None = None,
    num_warps: int = 4,
    options: dict | None = None,
    multiple_of_16: tuple[str, ...] = (),
) -> TritonSpec:
    """A :class:`TritonSpec` of ``kernel`` named ``label`` (see the module docstring)."""
    types, constexprs = dict(types or {}), dict(constexprs or {})
    name = getattr(kernel, "__name__", None) or getattr(
        getattr(kernel, "fn", None), "__name__", "kernel"
    )
    params = _parameters(kernel)
    known = {p.name for p in params}
    extra = sorted((set(types) | set(constexprs)) - known)
    if extra:
        raise ValueError(f"{name} has no parameter(s) {extra} (it has {[p.name for p in params]})")
    signature: dict[str, str] = {}
    for p in params:
        if _is_constexpr(p):
            if p.name in types:
                raise ValueError(
                    f"{name}: {p.name} is a constexpr; give its value in constexprs, not a type"
                )
            if p.name not in constexprs:
                if p.default is inspect.Parameter.empty:
                    raise ValueError(f"{name}: constexpr {p.name} needs a value in constexprs")
                constexprs[p.name] = p.default
            signature[p.name] = "constexpr"
        elif p.name in constexprs:
            raise ValueError(f"{name}: {p.name} is a runtime parameter, not a constexpr")
        elif p.name.endswith("_ptr"):
            if p.name not in types or not types[p.name].startswith("*"):
                raise ValueError(
                    f"{name}: pointer {p.name} needs a '*type' in types, got {types.get(p.name)!r}"
                )
            signature[p.name] = types[p.name]
        else:
            signature[p.name] = types.get(p.name, "i32")
    names = [p.name for p in params]
    attrs = {}
    for m in multiple_of_16:
        if m not in known or signature[m] == "constexpr":
            raise ValueError(
                f"{name}: multiple_of_16 names {m!r}, which is not a runtime parameter"
            )
        attrs[(names.index(m),)] = [["tt.divisibility", 16]]
    return TritonSpec(label, kernel, signature, constexprs, num_warps, dict(options or {}), attrs)

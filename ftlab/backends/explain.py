"""``ftlab ops NAME --explain``: the plan of a call described on the command line, and why.

    ftlab ops quant_matmul --explain --shape 1,2048,151936 --dtype q4_k --arch gfx1201

``--shape`` gives the op's dims in the order of its spec (``quant_matmul``: M, K, N); ``--dtype``
the activations' float dtype and, for ops on quantized weights, the weights' quant type (one, or
gate/up and down for ``moe_experts``), comma-separated in any order; ``--arch`` plans for that GPU
(its toolchain assumed installed), else the device here.
"""

from __future__ import annotations

import torch

from ftlab import platform as ftplatform
from ftlab.backends.calls import Call
from ftlab.backends.planner import Plan, plan
from ftlab.backends.registry import spec

FLOATS = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}
QUANTS = ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def parse_shape(op: str, text: str | None) -> tuple[int, ...]:
    names = spec(op).shape
    want = ",".join(names)
    if not text:
        raise ValueError(f"--shape must give {want} for {op}, got nothing")
    try:
        dims = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(
            f"--shape must be {len(names)} integers {want} for {op}, got {text!r}"
        ) from None
    if len(dims) != len(names) or any(d < 0 for d in dims):
        raise ValueError(
            f"--shape must be {len(names)} integers >= 0 ({want}) for {op}, got {text!r}"
        )
    return dims


def parse_dtypes(op: str, text: str) -> tuple[torch.dtype, tuple[str, ...]]:
    """(activations' dtype, weights' quant types) of ``--dtype``."""
    dtype, quants = torch.bfloat16, []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        if word.lower() in FLOATS:
            dtype = FLOATS[word.lower()]
        elif word.upper() in QUANTS:
            quants.append(word.upper())
        else:
            raise ValueError(
                f"--dtype must name float dtypes ({', '.join(FLOATS)}) or quant types "
                f"({', '.join(q.lower() for q in QUANTS)}), got {word!r}"
            )
    if spec(op).paths:
        most = 2 if op == "moe_experts" else 1
        if op == "q4_0_matmul" or op == "add_rmsnorm_q4_0_matmul":
            quants = quants or ["Q4_0"]
        if not quants and op != "moe_experts":
            raise ValueError(
                f"--dtype must name the weights' quant type for {op} (e.g. q4_k), got {text!r}"
            )
        if len(quants) > most:
            raise ValueError(f"--dtype names {len(quants)} quant types; {op} takes at most {most}")
        if op == "moe_experts" and len(quants) == 1:
            quants *= 2
    elif quants:
        raise ValueError(f"--dtype names a quant type, but {op} takes no quantized weights")
    return dtype, tuple(quants)


def explain(
    op: str,
    shape: str | None,
    dtype: str = "bf16",
    arch: str | None = None,
    device: str | None = None,
    backend: str = "auto",
    path: str = "auto",
    variant: str | None = None,
    chunk: int = 64,
    precision: str = "fp32",
    align: int = 16,
) -> Plan:
    """The plan of the call the arguments describe (see the module docstring)."""
    dims = parse_shape(op, shape)
    dt, quants = parse_dtypes(op, dtype)
    if align not in (1, 2, 4, 8, 16):
        raise ValueError(f"--align must be 1, 2, 4, 8 or 16, got {align}")
    platform = ftplatform.platform_from_arch(arch) if arch else None
    kind = device or (
        "cuda" if (platform and platform.is_gpu) or torch.cuda.is_available() else "cpu"
    )
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--device must be 'cpu' or 'cuda', got {device!r}")
    if kind == "cuda" and platform is None and not torch.cuda.is_available():
        raise ValueError("--device cuda needs a GPU here, or --arch naming the GPU to plan for")
    call = Call(
        kind,
        0 if kind == "cuda" else None,
        dt,
        dims,
        quants[0] if quants else None,
        quants[1] if len(quants) > 1 else None,
        align,
        chunk=chunk,
        precision=precision,
    )
    return plan(
        op,
        call,
        backend=backend,
        path=path if spec(op).paths else None,
        variant=variant,
        platform=platform,
    )

"""gated_norm in Triton (reference: ftlab/reference/gated_norm.py).

``gated_rmsnorm``: one program per (token, head) row: the mean square in fp32 (``row_rms_factor``:
a row whose squares overflow fp32 too), then each element normalized, scaled by the weight and by
SiLU of its gate, rounded once. ``output_gate``: one program per (row, block of features), ``attn
* sigmoid(gate)`` in fp32, rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.triton.norm import row_rms_factor


@triton.jit
def gated_rmsnorm_kernel(
    x_ptr,
    x_row,
    z_ptr,
    z_row,
    w_ptr,
    y_ptr,
    eps,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    mask = d < D
    x = tl.load(x_ptr + n.to(tl.int64) * x_row + h * D + d, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + n.to(tl.int64) * z_row + h * D + d, mask=mask, other=0.0).to(tl.float32)
    r = row_rms_factor(x, D, eps)
    y = x * r * tl.load(w_ptr + d, mask=mask, other=0.0) * (z / (1.0 + tl.exp(-z)))
    tl.store(y_ptr + (n.to(tl.int64) * H + h) * D + d, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def output_gate_kernel(a_ptr, a_row, g_ptr, g_row, y_ptr, F, BLOCK: tl.constexpr):
    n = tl.program_id(0)
    f = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = f < F
    a = tl.load(a_ptr + n.to(tl.int64) * a_row + f, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + n.to(tl.int64) * g_row + f, mask=mask, other=0.0).to(tl.float32)
    tl.store(
        y_ptr + n.to(tl.int64) * F + f,
        (a / (1.0 + tl.exp(-g))).to(y_ptr.dtype.element_ty),
        mask=mask,
    )


def gated_rmsnorm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.gated_rmsnorm` (ops checked the layouts)."""
    n, h, d = x.shape
    y = torch.empty((n, h, d), dtype=x.dtype, device=x.device)
    if n and h:
        gated_rmsnorm_kernel[(n, h)](
            x,
            x.stride(0),
            z,
            z.stride(0),
            weight,
            y,
            float(eps),
            H=h,
            D=d,
            BLOCK_D=triton.next_power_of_2(d),
            num_warps=1 if d <= 256 else 4,
        )
    return y


def output_gate(attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.output_gate` (ops checked the layouts)."""
    n, f = attn.shape
    y = torch.empty((n, f), dtype=attn.dtype, device=attn.device)
    if n and f:
        block = min(triton.next_power_of_2(f), 1024)
        output_gate_kernel[(n, triton.cdiv(f, block))](
            attn, attn.stride(0), gate, gate.stride(0), y, f, BLOCK=block, num_warps=4
        )
    return y


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check): Qwen3-Next's
    gated norm (32 value heads of 128, the gate in x's dtype) and its attention output gate
    (16 heads of 256), in each float dtype."""
    from ftlab.triton.compile_spec import spec

    specs = []
    for dt in ("fp32", "fp16", "bf16"):
        specs.append(
            spec(
                gated_rmsnorm_kernel,
                f"gated_rmsnorm_kernel[{dt}, D 128, 32 heads]",
                types={
                    "x_ptr": f"*{dt}",
                    "x_row": "i64",
                    "z_ptr": f"*{dt}",
                    "z_row": "i64",
                    "w_ptr": "*fp32",
                    "y_ptr": f"*{dt}",
                    "eps": "fp32",
                },
                constexprs={"H": 32, "D": 128, "BLOCK_D": 128},
                num_warps=1,
            )
        )
        specs.append(
            spec(
                output_gate_kernel,
                f"output_gate_kernel[{dt}, F 4096]",
                types={
                    "a_ptr": f"*{dt}",
                    "a_row": "i64",
                    "g_ptr": f"*{dt}",
                    "g_row": "i64",
                    "y_ptr": f"*{dt}",
                },
                constexprs={"BLOCK": 1024},
                num_warps=4,
            )
        )
    return specs

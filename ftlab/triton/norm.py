"""norm in Triton (reference: ftlab/reference/norm.py).

``add_rmsnorm``: one program per row. ``s = x + residual`` in fp32, rounded once to x's dtype
(stored), the mean of the rounded s's squares in fp32, then ``y = s * r * weight`` rounded once.
A row of up to :data:`MAX_BLOCK_H` elements stays in registers; a longer one is walked in blocks
twice, the second pass recomputing s (the same rounding, bit for bit) rather than reading back
stores of other threads. A row whose squares overflow fp32 takes its factor from the squares of
``s * 2^-80`` (:func:`row_rms_factor`; ftlab.reference.norm). The rounding to bf16 is done on the
bits (nearest even), so the result is the same on GPUs and in the CPU interpreter, whose own bf16
casts truncate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: the widest row one block of registers holds; longer rows take two passes over blocks
MAX_BLOCK_H = 8192
#: ftlab.reference.norm.NORM_SCALE: a row whose squares overflow fp32 sums those of x times it
NORM_SCALE = tl.constexpr(2.0**-80)


@triton.jit
def scaled_rms_factor(ss, n, eps):
    """``1 / sqrt(mean(x^2) + eps)`` of a row of ``n`` elements whose squares overflowed fp32 (a
    finite |x| >= ~2^64 / sqrt(n)), from ``ss``, the sum of the squares of ``x * NORM_SCALE``
    (exact: a power of two), scaled back (``ftlab.reference.norm.rms_factor``)."""
    return (1.0 / tl.sqrt(ss / n + eps * NORM_SCALE * NORM_SCALE)) * NORM_SCALE


@triton.jit
def row_rms_factor(x, n, eps):
    """``1 / sqrt(mean(x^2) + eps)`` of a row ``x`` held in registers (fp32, masked elements 0):
    the plain formula, or :func:`scaled_rms_factor` where the squares' sum overflows."""
    ss = tl.sum(x * x, axis=0)
    r = 1.0 / tl.sqrt(ss / n + eps)
    if ss == float("inf"):
        xs = x * NORM_SCALE
        r = scaled_rms_factor(tl.sum(xs * xs, axis=0), n, eps)
    return r


@triton.jit
def round_to(v, DT: tl.constexpr):
    """fp32 ``v`` rounded to nearest even in ``DT``: (the ``DT`` value, that value in fp32)."""
    if DT == tl.bfloat16:
        u = v.to(tl.uint32, bitcast=True)
        b = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        b = tl.where((u & 0x7FFFFFFF) > 0x7F800000, (u >> 16) | 0x40, b)  # NaN stays a (quiet) NaN
        return b.to(tl.uint16).to(tl.bfloat16, bitcast=True), (b << 16).to(tl.float32, bitcast=True)
    else:
        q = v.to(DT)
        return q, q.to(tl.float32)


@triton.jit
def sum_of(x_ptr, r_ptr, s_ptr, h, mask, HAS_RESIDUAL: tl.constexpr, STORE: tl.constexpr):
    """The rounded s at offsets ``h`` of a row (x, residual and s pointers at the row), in fp32;
    stored through ``s_ptr`` when ``STORE``."""
    s = tl.load(x_ptr + h, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + h, mask=mask, other=0.0).to(tl.float32)
        q, s = round_to(s + r, s_ptr.dtype.element_ty)
        if STORE:
            tl.store(s_ptr + h, q, mask=mask)
    return s


@triton.jit
def add_rmsnorm_kernel(
    x_ptr,
    x_row,
    r_ptr,
    r_row,
    w_ptr,
    s_ptr,
    y_ptr,
    eps,
    H: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    xr = x_ptr + n * x_row
    rr = r_ptr + n * r_row
    sr = s_ptr + n * H
    yr = y_ptr + n * H
    if BLOCK_H >= H:  # the row in registers
        h = tl.arange(0, BLOCK_H)
        mask = h < H
        s = sum_of(xr, rr, sr, h, mask, HAS_RESIDUAL, True)
        r = row_rms_factor(s, H, eps)
        w = tl.load(w_ptr + h, mask=mask, other=0.0).to(tl.float32)
        q, _ = round_to(s * r * w, y_ptr.dtype.element_ty)
        tl.store(yr + h, q, mask=mask)
    else:
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for off in range(0, H, BLOCK_H):
            h = off + tl.arange(0, BLOCK_H)
            s = sum_of(xr, rr, sr, h, h < H, HAS_RESIDUAL, True)
            acc += s * s
        ss = tl.sum(acc, axis=0)
        r = 1.0 / tl.sqrt(ss / H + eps)
        if ss == float("inf"):  # the squares overflowed: summed again, scaled (scaled_rms_factor)
            acc = tl.zeros([BLOCK_H], dtype=tl.float32)
            for off in range(0, H, BLOCK_H):
                h = off + tl.arange(0, BLOCK_H)
                s = sum_of(xr, rr, sr, h, h < H, HAS_RESIDUAL, False) * NORM_SCALE
                acc += s * s
            r = scaled_rms_factor(tl.sum(acc, axis=0), H, eps)
        for off in range(0, H, BLOCK_H):
            h = off + tl.arange(0, BLOCK_H)
            mask = h < H
            s = sum_of(xr, rr, sr, h, mask, HAS_RESIDUAL, False)
            w = tl.load(w_ptr + h, mask=mask, other=0.0).to(tl.float32)
            q, _ = round_to(s * r * w, y_ptr.dtype.element_ty)
            tl.store(yr + h, q, mask=mask)


def launch_config(h: int) -> tuple[int, int]:
    """(BLOCK_H, num_warps) of a row of ``h`` elements."""
    block = min(triton.next_power_of_2(h), MAX_BLOCK_H)
    return block, 1 if block <= 256 else 4 if block <= 2048 else 8


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.add_rmsnorm` (ops checked the layouts)."""
    n, h = x.shape
    y = torch.empty((n, h), dtype=x.dtype, device=x.device)
    s = x if residual is None else torch.empty((n, h), dtype=x.dtype, device=x.device)
    if n:
        block, warps = launch_config(h)
        r = x if residual is None else residual  # unread without a residual
        add_rmsnorm_kernel[(n,)](
            x,
            x.stride(0),
            r,
            r.stride(0),
            weight,
            s if residual is not None else y,
            y,
            float(eps),
            H=h,
            BLOCK_H=block,
            HAS_RESIDUAL=residual is not None,
            num_warps=warps,
        )
    return y, s


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check): rows of
    H = 2048 and 4096 (Qwen3-30B-A3B's and Qwen3-235B's hidden sizes) with a residual and the
    weight in x's dtype, in each float dtype; and, in bf16, an fp32 weight and a call without a
    residual."""
    from ftlab.triton.compile_spec import spec

    def one(dt: str, wdt: str, h: int, residual: bool):
        block, warps = launch_config(h)
        label = (
            f"add_rmsnorm_kernel[{dt}, weight {wdt}, H {h}{'' if residual else ', no residual'}]"
        )
        return spec(
            add_rmsnorm_kernel,
            label,
            types={
                "x_ptr": f"*{dt}",
                "x_row": "i64",
                "r_ptr": f"*{dt}",
                "r_row": "i64",
                "w_ptr": f"*{wdt}",
                "s_ptr": f"*{dt}",
                "y_ptr": f"*{dt}",
                "eps": "fp32",
            },
            constexprs={"H": h, "BLOCK_H": block, "HAS_RESIDUAL": residual},
            num_warps=warps,
        )

    specs = [one(dt, dt, h, True) for dt in ("fp32", "fp16", "bf16") for h in (2048, 4096)]
    return [*specs, one("bf16", "fp32", 4096, True), one("bf16", "bf16", 2048, False)]

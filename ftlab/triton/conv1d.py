"""conv1d in Triton (reference: ftlab/reference/conv1d.py).

``causal_conv1d``: one program per (block of tokens, sequence, block of channels); each output
reads its W inputs straight from x, or from the carried state for the first W-1 tokens, sums
them into the bias in fp32 (taps in order), applies SiLU and rounds once. The programs of the
first token block also write their channels' new state. ``causal_conv1d_update``: one program
per (sequence, block of channels) reads the state (none of it for a row flagged in ``reset``:
zeros) and the token, writes the output and shifts the state in place (each program owns its
channels: no races, no host work).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def causal_conv1d_kernel(
    x_ptr,
    x_sb,
    x_st,
    w_ptr,
    b_ptr,
    s_ptr,
    len_ptr,
    y_ptr,
    ns_ptr,
    T,
    C,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_STATE: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    tb = tl.program_id(0)
    b = tl.program_id(1)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    end = T
    if HAS_LENGTHS:
        end = tl.minimum(tl.maximum(tl.load(len_ptr + b).to(tl.int32), 0), T)
    x_row = x_ptr + b.to(tl.int64) * x_sb
    s_row = s_ptr + b.to(tl.int64) * C * (W - 1)
    if HAS_BIAS:
        acc = tl.load(b_ptr + c, mask=cmask, other=0.0)[None, :] + tl.zeros(
            (BLOCK_T, BLOCK_C), tl.float32
        )
    else:
        acc = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
    live = (t < T)[:, None] & cmask[None, :]
    for j in tl.static_range(W):
        s = t + (j - (W - 1))  # input token; negative: a state entry
        v = tl.load(
            x_row + s[:, None].to(tl.int64) * x_st + c[None, :],
            mask=(s >= 0)[:, None] & live,
            other=0.0,
        ).to(tl.float32)
        if HAS_STATE:
            from_state = (s < 0)[:, None] & live
            v += tl.load(
                s_row + c[None, :] * (W - 1) + (s + W - 1)[:, None], mask=from_state, other=0.0
            ).to(tl.float32)
        acc = acc + tl.load(w_ptr + c * W + j, mask=cmask, other=0.0)[None, :] * v
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    acc = tl.where((t < end)[:, None], acc, 0.0)
    y_row = y_ptr + (b.to(tl.int64) * T + t[:, None]) * C + c[None, :]
    tl.store(y_row, acc.to(y_ptr.dtype.element_ty), mask=live)
    if tb == 0:
        for i in tl.static_range(W - 1):
            # index into xin: the state's W-1 entries, then x's
            src = end + i + tl.zeros((BLOCK_C,), tl.int32)
            if HAS_STATE:
                old = tl.load(s_row + c * (W - 1) + src, mask=cmask & (src < W - 1), other=0.0)
            else:
                old = tl.zeros((BLOCK_C,), ns_ptr.dtype.element_ty)
            new = tl.load(
                x_row + (src - (W - 1)).to(tl.int64) * x_st + c,
                mask=cmask & (src >= W - 1),
                other=0.0,
            )
            val = tl.where(
                src < W - 1, old.to(ns_ptr.dtype.element_ty), new.to(ns_ptr.dtype.element_ty)
            )
            tl.store(ns_ptr + b.to(tl.int64) * C * (W - 1) + c * (W - 1) + i, val, mask=cmask)


@triton.jit
def causal_conv1d_update_kernel(
    x_ptr,
    x_sb,
    w_ptr,
    b_ptr,
    s_ptr,
    s_sb,
    s_sc,
    r_ptr,
    r_sb,
    y_ptr,
    C,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RESET: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    if HAS_BIAS:
        acc = tl.load(b_ptr + c, mask=cmask, other=0.0)
    else:
        acc = tl.zeros((BLOCK_C,), tl.float32)
    s_row = s_ptr + b.to(tl.int64) * s_sb + c.to(tl.int64) * s_sc
    # where the old state is read; a reset row reads none of it: zeros (masked loads' other)
    old = cmask
    if HAS_RESET:
        old = tl.where(tl.load(r_ptr + b.to(tl.int64) * r_sb) != 0, False, cmask)
    x = tl.load(x_ptr + b.to(tl.int64) * x_sb + c, mask=cmask, other=0.0)
    prev = tl.load(s_row, mask=old, other=0.0)
    for j in tl.static_range(W - 1):
        acc = acc + tl.load(w_ptr + c * W + j, mask=cmask, other=0.0) * prev.to(tl.float32)
        if j < W - 2:
            nxt = tl.load(s_row + j + 1, mask=old, other=0.0)
        else:
            nxt = x
        tl.store(s_row + j, nxt, mask=cmask)
        prev = nxt
    acc = acc + tl.load(w_ptr + c * W + W - 1, mask=cmask, other=0.0) * x.to(tl.float32)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(y_ptr + b.to(tl.int64) * C + c, acc.to(y_ptr.dtype.element_ty), mask=cmask)


def _block_c(c: int, most: int = 128) -> int:
    return min(triton.next_power_of_2(max(c, 1)), most)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor | None,
    lengths: torch.Tensor | None,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.causal_conv1d` (ops checked the layouts)."""
    b, t, c = x.shape
    w = weight.shape[1]
    y = torch.empty((b, t, c), dtype=x.dtype, device=x.device)
    new_state = torch.empty((b, c, w - 1), dtype=x.dtype, device=x.device)
    if b and c:
        block_t = min(triton.next_power_of_2(max(t, 1)), 8)
        block_c = _block_c(c, 64)
        grid = (max(triton.cdiv(t, block_t), 1), b, triton.cdiv(c, block_c))
        causal_conv1d_kernel[grid](
            x,
            x.stride(0),
            x.stride(1),
            weight,
            weight if bias is None else bias,
            x if state is None else state,
            weight if lengths is None else lengths,
            y,
            new_state,
            t,
            c,
            W=w,
            HAS_BIAS=bias is not None,
            HAS_STATE=state is not None,
            HAS_LENGTHS=lengths is not None,
            SILU=silu,
            BLOCK_T=block_t,
            BLOCK_C=block_c,
            num_warps=4,
        )
    return y, new_state


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor,
    silu: bool,
    reset: torch.Tensor | None = None,
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.causal_conv1d_update` (state updated in place; ``reset``
    bool ``[B]`` or None, read as bytes)."""
    b, c = x.shape
    w = weight.shape[1]
    y = torch.empty((b, c), dtype=x.dtype, device=x.device)
    if b and c:
        block_c = _block_c(c)
        flags = reset.view(torch.uint8) if reset is not None else None
        causal_conv1d_update_kernel[(b, triton.cdiv(c, block_c))](
            x,
            x.stride(0),
            weight,
            weight if bias is None else bias,
            state,
            state.stride(0),
            state.stride(1),
            y if flags is None else flags,
            0 if flags is None else flags.stride(0),
            y,
            c,
            W=w,
            HAS_BIAS=bias is not None,
            HAS_RESET=flags is not None,
            SILU=silu,
            BLOCK_C=block_c,
            num_warps=4,
        )
    return y


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check): width 4 with
    bias, state, lengths and SiLU (the gated deltanet's conv), in each float dtype; the decode
    step with and without ``reset``."""
    from ftlab.triton.compile_spec import spec

    specs = []
    for dt in ("fp32", "fp16", "bf16"):
        specs.append(
            spec(
                causal_conv1d_kernel,
                f"causal_conv1d_kernel[{dt}, W 4]",
                types={
                    "x_ptr": f"*{dt}",
                    "x_sb": "i64",
                    "x_st": "i64",
                    "w_ptr": "*fp32",
                    "b_ptr": "*fp32",
                    "s_ptr": f"*{dt}",
                    "len_ptr": "*i32",
                    "y_ptr": f"*{dt}",
                    "ns_ptr": f"*{dt}",
                    "T": "i32",
                    "C": "i32",
                },
                constexprs={
                    "W": 4,
                    "HAS_BIAS": True,
                    "HAS_STATE": True,
                    "HAS_LENGTHS": True,
                    "SILU": True,
                    "BLOCK_T": 8,
                    "BLOCK_C": 64,
                },
                num_warps=4,
            )
        )
        for has_reset in (False, True):
            specs.append(
                spec(
                    causal_conv1d_update_kernel,
                    f"causal_conv1d_update_kernel[{dt}, W 4{', reset' if has_reset else ''}]",
                    types={
                        "x_ptr": f"*{dt}",
                        "x_sb": "i64",
                        "w_ptr": "*fp32",
                        "b_ptr": "*fp32",
                        "s_ptr": f"*{dt}",
                        "s_sb": "i64",
                        "s_sc": "i64",
                        "r_ptr": "*u8" if has_reset else f"*{dt}",
                        "r_sb": "i64",
                        "y_ptr": f"*{dt}",
                        "C": "i32",
                    },
                    constexprs={
                        "W": 4,
                        "HAS_BIAS": True,
                        "HAS_RESET": has_reset,
                        "SILU": True,
                        "BLOCK_C": 128,
                    },
                    num_warps=4,
                )
            )
    return specs

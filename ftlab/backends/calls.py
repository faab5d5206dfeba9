"""A :class:`~ftlab.backends.rules.Call` from the tensors of an op's call: what the planner reads
(device, dtype, sizes, weight types and layout), made in a microsecond or two."""

from __future__ import annotations

import torch

from ftlab.backends.rules import Call
from ftlab.quant import QuantWeight


def align(*tensors: torch.Tensor) -> int:
    """The largest of 1, 2, 4, 8, 16 that divides every tensor's address."""
    ptr = 16
    for t in tensors:
        ptr |= t.data_ptr()
    return ptr & -ptr


def on(t: torch.Tensor, dtype: torch.dtype | None, dims: tuple[int, ...], **facts) -> Call:
    """A call on ``t``'s device."""
    return Call(t.device.type, t.device.index, dtype, dims, **facts)


def matmul(x: torch.Tensor, w: QuantWeight) -> Call:
    """``x [M, K] @ w[N, K].T`` of a packed weight."""
    data = w.data
    return on(
        x,
        x.dtype,
        (x.shape[0], x.shape[1], w.shape[0]),
        qtype=w.qtype,
        align=align(data),
        contiguous=data.is_contiguous(),
        rows16=data.shape[-1] % 16 == 0,
        bytes16=data.numel() % 16 == 0,
    )


def experts(x: torch.Tensor, w_gate_up, w_down, top_k: int) -> Call:
    """``moe_experts`` of ``x [T, H]`` over banks ``[E, 2I, H]`` / ``[E, H, I]`` (dense or packed)."""
    quant = isinstance(w_gate_up, QuantWeight)
    datas = (w_gate_up.data, w_down.data) if quant else (w_gate_up, w_down)
    e, _, h = w_gate_up.shape
    return on(
        x,
        x.dtype,
        (x.shape[0], h, w_down.shape[-1], e, top_k),
        qtype=w_gate_up.qtype if quant else None,
        qtype_down=w_down.qtype if quant else None,
        align=align(*datas),
        contiguous=all(d.is_contiguous() for d in datas),
    )


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Call:
    """``decode_attention`` of ``q [B, H, D]`` over ``k, v [B, S, KVH, D]``: ``align`` 16 only
    where q, k and v start 16-byte aligned with k's and v's strides whole 16-byte pieces."""
    b, h, d = q.shape
    rows8 = all(t.stride(0) % 8 == 0 and t.stride(1) % 8 == 0 for t in (k, v))
    return on(q, q.dtype, (b, h, k.shape[2], d, k.shape[1]), align=align(q, k, v) if rows8 else 1)


def delta_rule(q: torch.Tensor, v: torch.Tensor, chunk: int, precision: str) -> Call:
    """``gated_delta_rule`` of ``q [B, T, Hk, Dk]``, ``v [B, T, Hv, Dv]``."""
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2:]
    return on(q, q.dtype, (b, t, hk, hv, dk, dv), chunk=chunk, precision=precision)

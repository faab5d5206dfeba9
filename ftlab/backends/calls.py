"""What the planner reads of a call (:class:`Call`; never the tensors, so that ``ftlab ops NAME
--explain`` plans a call nobody makes), the conditions a table row puts on one (:class:`When`),
the regimes, and a Call made from an op's tensors in a microsecond or two."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ftlab.backends.registry import DECODE_MAX_TOKENS
from ftlab.platform import Platform
from ftlab.quant import QuantWeight

ONE_ROW, SMALL, PREFILL = "one row", "small batch", "prefill"
REGIMES = (ONE_ROW, SMALL, PREFILL)
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
BLOCK_QUANTS = ("Q8_0", *K_QUANTS)
HALF = (torch.float16, torch.bfloat16)


def regime(rows: int) -> str:
    """The regime of a call on ``rows`` rows (tokens) of activations."""
    if rows <= 1:
        return ONE_ROW
    return SMALL if rows <= DECODE_MAX_TOKENS else PREFILL


class Call(NamedTuple):
    """What the planner reads of a call -- never the tensors, so that ``ftlab ops NAME --explain``
    plans a call nobody makes. ``dims``: the op's sizes in the order of its spec's ``shape``
    (``quant_matmul``: M, K, N); ``qtype``: the weight's quant type (``moe_experts``: the gate/up
    bank's, ``qtype_down`` the down bank's), None for dense weights; ``align``: the byte alignment
    (1, 2, 4, 8 or 16) the operands' addresses share, and ``contiguous`` whether the weights'
    bytes are; ``rows16``: each weight row a whole number of 16-byte pieces, ``bytes16``: all of
    them together; ``chunk``, ``precision``: the gated delta rule's."""

    device: str = "cpu"
    index: int | None = None
    dtype: torch.dtype | None = None
    dims: tuple[int, ...] = ()
    qtype: str | None = None
    qtype_down: str | None = None
    align: int = 16
    contiguous: bool = True
    rows16: bool = True
    bytes16: bool = True
    chunk: int = 0
    precision: str = "fp32"

    @property
    def qtypes(self) -> tuple[str, ...]:
        """The weights' quant types (one, or gate/up and down), empty for dense weights."""
        return tuple(q for q in (self.qtype, self.qtype_down) if q is not None)


Sizes = dict[str, int]
Limit = Callable[[Call, Sizes, Platform], "str | None"]


@dataclass(frozen=True)
class When:
    """Conditions of a table row (None: any). ``qtypes`` holds when every weight of the call is
    of one of them (dense weights never match); ``needs`` names :class:`~ftlab.platform.Platform`
    facts that must be true (``"async_copies"``, ``"rdna"``), ``"!fact"`` one that must not;
    ``paths``: the quantized-weight paths (a kernel's)."""

    vendors: tuple[str, ...] | None = None
    families: tuple[str, ...] | None = None
    regimes: tuple[str, ...] | None = None
    dtypes: tuple[torch.dtype, ...] | None = None
    qtypes: tuple[str, ...] | None = None
    needs: tuple[str, ...] = ()
    paths: tuple[str, ...] | None = None

    def miss(self, call: Call, plat: Platform, where: str, path: str | None = None) -> str | None:
        """Why this does not hold for ``call`` on ``plat`` in regime ``where`` on ``path`` (None:
        it holds)."""
        if self.paths is not None and path not in self.paths:
            return f"not on the {path} path (only {'/'.join(self.paths)})"
        if self.vendors is not None and plat.vendor not in self.vendors:
            return f"not on {plat.vendor or 'the CPU'} (only {'/'.join(self.vendors)})"
        if self.families is not None and plat.family not in self.families:
            return f"not on {plat.family or plat.kind} (only {'/'.join(self.families)})"
        if self.regimes is not None and where not in self.regimes:
            return f"not for {where} (only {' / '.join(self.regimes)})"
        if self.dtypes is not None and call.dtype not in self.dtypes:
            names = "/".join(str(d).removeprefix("torch.") for d in self.dtypes)
            return f"not for {str(call.dtype).removeprefix('torch.')} (only {names})"
        if self.qtypes is not None:
            have = call.qtypes
            if not have or any(q not in self.qtypes for q in have):
                return f"not for {'/'.join(have) or 'dense'} weights (only {'/'.join(self.qtypes)})"
        for fact in self.needs:
            want = not fact.startswith("!")
            if getattr(plat, fact.lstrip("!")) != want:
                return f"{'needs' if want else 'not where'} {fact.lstrip('!')}"
        return None


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
    """``moe_experts`` of ``x [T, H]`` over banks ``[E, 2I, H]`` / ``[E, H, I]`` (dense or
    packed)."""
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

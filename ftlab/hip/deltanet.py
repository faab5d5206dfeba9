"""The gated delta rule through the HIP kernels of ``csrc/deltanet.hip`` (JIT-built, cached):
a block per (sequence, value head, 16 or 32 state columns) with its state slice in registers.
Decode is one step written back in place; prefill is the recurrence scanned token by token over
the sequence (not the chunked form; ``chunk_size`` does not change it). Dk up to 128."""

from __future__ import annotations

import torch

from ftlab import jit
from ftlab.reference.deltanet import step_gates

MAX_DK = 128


def _check_dk(dk: int) -> None:
    if dk > MAX_DK:
        raise ValueError(f"the HIP gated delta rule takes head sizes Dk <= {MAX_DK}, got {dk}")


def gated_delta_rule(q, k, v, g, beta, state, scale: float, l2norm_qk: bool, chunk_size: int):
    """Backend entry of :func:`ftlab.ops.gated_delta_rule` (contiguous q, k, v; g and beta fp32)."""
    b, _, _, dk = q.shape
    hv, dv = v.shape[2:]
    _check_dk(dk)
    final = (
        state.clone()
        if state is not None
        else torch.zeros(b, hv, dk, dv, dtype=torch.float32, device=q.device)
    )
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    module = jit.module_for("deltanet", q.device)
    jit.on_device(
        q.device,
        lambda: module.gated_delta_scan(q, k, v, g, beta, final, o, float(scale), l2norm_qk),
    )
    return o, final


def gated_delta_step(q, k, v, g, beta, state, scale: float, l2norm_qk: bool, cols: int = 0, gates=None, reset=None):
    """Backend entry of :func:`ftlab.ops.gated_delta_step` (``state`` contiguous fp32, updated in place).

    A block of 256 threads per (sequence, value head, ``cols`` state columns), 16-byte state
    accesses when Dv % 4 == 0 and the state is 16-byte aligned. ``cols``: 16 or 32, or 0 to pick
    (16 when 32 would give fewer than 256 blocks). ``gates``: the kernel makes g and beta from a
    and b in q's dtype (a or b in fp32 beside a half q: the reference's gates first, then the
    kernel without); ``reset``: rows from a zero state, read as bytes."""
    _check_dk(q.shape[-1])
    if gates is not None and (g.dtype != q.dtype or beta.dtype != q.dtype):
        g, beta = step_gates(g, beta, *gates)
        gates = None
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    a_neg, dt_bias = gates if gates is not None else (state, state)  # placeholders when unused
    flags = reset.contiguous().view(torch.uint8) if reset is not None else state
    module = jit.module_for("deltanet", q.device)
    jit.on_device(
        q.device,
        lambda: module.gated_delta_step(q, k, v, g, beta, state, o, float(scale), l2norm_qk, int(cols), a_neg,
                                        dt_bias, flags, gates is not None, reset is not None),  # fmt: skip
    )
    return o

"""The gated delta rule through the HIP kernels of ``csrc/gated_delta_rule.hip`` and
``csrc/gated_delta_rule_chunk.hip`` (JIT-built, cached): a block per (sequence, value head, 16 or 32
state columns) with its state slice in registers. Decode is one step written back in place. Prefill
takes one of two variants: ``"scan"``, the recurrence scanned token by token over the sequence, any
dtype, ``chunk_size`` not changing it; ``"chunk"``, the chunked form in chunks of 64 on the matrix
cores (bf16 q, k, v and ``chunk_size`` 64). Which one runs by default is the planner's
(``ftlab.backends.rules``: "chunk" where it serves, else "scan"). Dk up to 128. The chunks'
``precision``: ``"fp32"`` (the default: fp32 operands of the products in three bf16 parts, fp32
accuracy) or ``"bf16"`` (each rounded to bf16 once, one product each: fla's precision, its own
derived bound)."""

from __future__ import annotations

import torch

from ftlab import backends, jit
from ftlab.backends import calls
from ftlab.reference.gated_delta_rule import step_gates

MAX_DK = 128


def _check_dk(dk: int) -> None:
    if dk > MAX_DK:
        raise ValueError(f"the HIP gated delta rule takes head sizes Dk <= {MAX_DK}, got {dk}")


#: tokens a chunk of the "chunk" variant
CHUNK = 64
#: the "chunk" variant's precisions, and the bf16 planes each keeps of an fp32 operand
PRECISIONS = {"fp32": 3, "bf16": 1}


def gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    state,
    scale: float,
    l2norm_qk: bool,
    chunk_size: int,
    variant: str | None = None,
    precision: str = "fp32",
    call=None,
):
    """Backend entry of :func:`ftlab.ops.gated_delta_rule` (contiguous q, k, v; g and beta fp32).

    ``variant``: ``"scan"`` (token by token) or ``"chunk"`` (two launches on the matrix cores:
    per chunk and key head the (I + L)^-1 solve and the masked decayed Q K^T, then a block per
    (sequence, value head, 32 state columns) carrying its state slice through the chunks: bf16,
    chunk_size 64, Dk <= 128, grids within their limits; else ``BackendUnavailable``); None: the
    planner's default.

    ``precision`` (the chunks'; the scan is fp32 throughout): ``"fp32"``, the fp32 operands of
    the products (the state, ``A diag(beta)``, the masked decayed ``Q K^T``, the chunk's
    corrected values) split into three bf16 parts, so within the fp32 chunked form's derived
    bound, with ``B * Hv * ceil(T / 64) * 49`` KiB of scratch (for one sequence of 16384 tokens
    and 32 value heads, 392 MiB); ``"bf16"``, each rounded to bf16 once and every product one
    MMA with fp32 sums, the state kept in fp32 -- the precision of fla's ``chunk_gated_delta_rule``
    -- within ``ftlab.testing.gated_delta_tolerance(..., operands="bf16")``, with ``B * Hv * ceil(T
    / 64) * 17`` KiB of scratch."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
    call = call or calls.delta_rule(q, v, chunk_size, precision)  # a plan passes its own
    variant = backends.variant_for("gated_delta_rule", "hip", call, variant)
    b, t, _, dk = q.shape
    hv, dv = v.shape[2:]
    _check_dk(dk)
    final = (
        state.clone()
        if state is not None
        else torch.zeros(b, hv, dk, dv, dtype=torch.float32, device=q.device)
    )
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    module = jit.module_for("gated_delta_rule", q.device)
    if variant == "chunk":
        nt = -(-t // CHUNK)
        planes = PRECISIONS[precision]
        ab = torch.empty(b, hv, nt, planes, CHUNK, CHUNK, dtype=torch.bfloat16, device=q.device)
        attn = torch.empty_like(ab)
        sc = torch.empty(b, hv, nt, 4, CHUNK, dtype=torch.float32, device=q.device)
        jit.on_device(
            q.device,
            lambda: module.gated_delta_chunk(
                q, k, v, g, beta, final, o, ab, attn, sc, float(scale), l2norm_qk, planes
            ),
        )
        return o, final
    jit.on_device(
        q.device,
        lambda: module.gated_delta_scan(q, k, v, g, beta, final, o, float(scale), l2norm_qk),
    )
    return o, final


def gated_delta_step(
    q, k, v, g, beta, state, scale: float, l2norm_qk: bool, cols: int = 0, gates=None, reset=None
):
    """Backend entry of :func:`ftlab.ops.gated_delta_step` (``state`` contiguous fp32, updated in
    place).

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
    module = jit.module_for("gated_delta_rule", q.device)
    jit.on_device(
        q.device,
        lambda: module.gated_delta_step(
            q,
            k,
            v,
            g,
            beta,
            state,
            o,
            float(scale),
            l2norm_qk,
            int(cols),
            a_neg,
            dt_bias,
            flags,
            gates is not None,
            reset is not None,
        ),
    )
    return o

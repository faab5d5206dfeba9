"""attention (docs/OPS.md section 13): one query token a sequence against its cached keys and
values (a decode step's attention), GQA, over the live positions only."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends
from ftlab.backends import calls
from ftlab.quant import Q8_1, QK


def _cache(t: torch.Tensor) -> torch.Tensor:
    """``[B, S, KVH, D]`` with unit element stride and contiguous heads (any position and
    sequence stride: a view of a slot-indexed cache) as given, else a copy."""
    _, _, kvh, d = t.shape
    ok = (d <= 1 or t.stride(3) == 1) and (kvh <= 1 or t.stride(2) == d)
    return t if ok else t.contiguous()


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    *,
    scale: float | None = None,
    backend: str = "auto",
    quantize: bool = False,
    validate: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, Q8_1]:
    """Attention of one query token a sequence over the first ``lengths[b]`` cached positions.

    ``q [B, H, D]`` (fp32 / fp16 / bf16); ``k``, ``v [B, S, KVH, D]`` of q's dtype, ``H`` a
    multiple of ``KVH`` (query head ``h`` reads key / value head ``h // (H // KVH)``); views with
    unit element stride and contiguous heads are taken as they are (the static KV cache's
    ``[max_batch, S, KVH * D]`` buffer viewed per sequence, no copy). ``lengths [B]`` int32 /
    int64 on q's device: sequence b attends positions ``0 .. lengths[b] - 1``; values are
    clamped to ``[0, S]`` on the device (no host synchronization: graph-capturable), and a
    length of 0 gives zeros; the slots past the length are never read (NaN there changes
    nothing). ``scale`` defaults to ``D ** -0.5``.

    ``out[b, h] = sum_p softmax_p(scale * q[b, h] . k[b, p, h']) v[b, p, h']``, in fp32, rounded
    once to q's dtype. Returns a new contiguous ``out [B, H, D]``.

    ``quantize=True`` (``H * D`` a multiple of 32): returns ``(out, out_q8)``, ``out_q8`` the
    :class:`~ftlab.quant.Q8_1` of ``out`` viewed ``[B, H * D]`` -- bit for bit
    ``quantize_q8_1(out.view(B, H * D))``, what a Q4_0 o_proj matvec takes as ``x_q8``. hip's
    one-launch kernel (fp16 / bf16, head dim 128 / 256) writes it in the same launch; the other
    paths and backends quantize ``out`` after (``ops.quantize_q8_1``: the same backend where it has
    one, else "auto").

    ``validate=False`` skips the argument checks (the caller vouches for them, as the models do:
    a :class:`~ftlab.models.DecodePlan`'s ``checks``); the backends still refuse layouts they cannot
    read.
    """
    if validate:
        scale = _checks(q, k, v, lengths, scale, quantize)
    b, h, d = q.shape
    scale = d**-0.5 if scale is None else scale
    args = (q.contiguous(), _cache(k), _cache(v), lengths.contiguous(), float(scale))
    plan = backends.plan("decode_attention", calls.attention(*args[:3]), backend=backend)
    if not quantize:
        return plan.run(*args)
    if plan.backend == "hip":  # its kernels write the Q8_1 themselves (or quantize after)
        return plan.run(*args, quantize=True)
    from ftlab.ops.q4_0 import quantize_q8_1

    out = plan.run(*args)
    avail = backends.available_backends("quantize_q8_1", q.device, q.dtype)
    qb = plan.backend if plan.backend in avail else "auto"
    return out, quantize_q8_1(out.view(b, h * d), backend=qb)


def _checks(
    q: object, k: object, v: object, lengths: object, scale: object, quantize: bool
) -> float | None:
    """decode_attention's argument checks (each error names the argument): the scale given, as a
    float."""
    argcheck.float_tensor("q", q)
    if q.dim() != 3 or q.shape[1] == 0 or q.shape[2] == 0:
        raise ValueError(f"q must be 3-D [B, H, D] with H, D > 0, got shape {tuple(q.shape)}")
    _, h, d = q.shape
    for name, t in (("k", k), ("v", v)):
        argcheck.tensor(name, t)
        argcheck.same_dtype(name, t, "q", q)
        argcheck.same_device(name, t, "q", q)
    argcheck.tensor("lengths", lengths)
    argcheck.dtype_in("lengths", lengths, argcheck.INDEX_DTYPES)
    argcheck.same_device("lengths", lengths, "q", q)
    argcheck.decode_attention_layout(q, k, v, lengths)
    if quantize and (h * d) % QK:
        raise ValueError(
            f"quantize=True needs H * D a multiple of {QK} (Q8_1 blocks of out viewed [B, H * D]), "
            f"got H={h}, D={d}"
        )
    return None if scale is None else argcheck.finite_float("scale", scale)

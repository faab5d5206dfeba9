"""Tolerance and case checks of the decode attention (``ops.decode_attention``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from ftlab import ops
from ftlab.testing.common import assert_within, backends_for, ulp

EPS32 = 2.0**-23
EXP_EPS = 4  # an exp in fp32 apart from its argument's size, in eps32


def decode_attention_tolerance(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """Per-element bound ``[B * H, D]`` on |backend - reference|, derived in f64 from the exact
    scores and weights. One side's fp32 error:

    - a score ``s_i`` (D products summed, q scaled first) within ``E_i = (D + 2) eps32 scale
      sum_d |q_d k_d|``; moving every score by at most ``E = max E_i`` moves each softmax weight
      by at most ``2 E`` relatively;
    - ``exp(s_i - m)`` within ``e_i = (|s_i - m| / 2 + EXP_EPS) eps32`` relatively (an exp2 of
      the argument times log2(e) on GPUs), the normalizer within the weighted mean of those;
    - the two sums over the ``n`` live positions (and the merge of the splits) within ``(n + 8)
      eps32`` relatively, on ``A = sum_i p_i |v_i|``.

    So ``err = (2 E + (n + 8) eps32 + sum_j p_j e_j) A + sum_i p_i e_i |v_i|``; the two sides
    differ by twice it, and each rounds once to q's dtype (1.5 ulps at the upper binade)."""
    b, h, d = q.shape
    s, kvh = k.shape[1], k.shape[2]
    g = h // kvh
    qf = q.double().cpu().view(b, kvh, g, d)
    kf, vf = k.double().cpu(), v.double().cpu()
    scores = torch.einsum("bkgd,bpkd->bkgp", qf, kf) * scale
    e_dot = (d + 2) * EPS32 * scale * torch.einsum("bkgd,bpkd->bkgp", qf.abs(), kf.abs())
    n = lengths.cpu().clamp(0, s)
    live = (torch.arange(s)[None, :] < n[:, None])[:, None, None, :]  # [B, 1, 1, S]
    scores = scores.masked_fill(~live, float("-inf"))
    m = scores.amax(-1, keepdim=True).clamp(min=-1e300)
    p = torch.where(live, torch.softmax(scores, -1), 0.0).nan_to_num(0.0)
    e_exp = torch.where(live, ((scores - m).abs() / 2 + EXP_EPS) * EPS32, 0.0).nan_to_num(0.0)
    big_e = torch.where(live, e_dot, 0.0).amax(-1, keepdim=True)
    va = vf.abs()
    a = torch.einsum("bkgp,bpkd->bkgd", p, va)
    err = (2 * big_e + (n[:, None, None, None] + 8) * EPS32 + (p * e_exp).sum(-1, keepdim=True)) * a
    err = err + torch.einsum("bkgp,bpkd->bkgd", p * e_exp, va)
    exact = torch.einsum("bkgp,bpkd->bkgd", p, vf)
    bound = 2 * err
    if q.dtype != torch.float32:
        bound = bound + 1.5 * ulp((exact.abs() + bound).float(), q.dtype).double()
    return bound.float().reshape(b * h, d)


def _moved(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` with its strides (a view of a wider buffer stays one)."""
    if t.device == device:
        return t
    base = torch.empty(
        t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device=device
    )
    base.copy_(torch.as_strided(t, (base.numel(),), (1,), 0))
    return torch.as_strided(base, t.shape, t.stride(), t.storage_offset())


def check_decode_attention_case(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    scale: float | None = None,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
    quantize: bool = False,
) -> None:
    """Every backend's decode_attention against the reference within
    :func:`decode_attention_tolerance` (k and v keep their strides: views of a wider cache stay
    views); the inputs are left as they were. ``quantize`` (where ``H * D`` is a multiple of 32):
    also ``quantize=True``, whose output must be the same bits and whose Q8_1 must be the
    reference ``quantize_q8_1`` of that output, bit for bit."""
    want = ops.decode_attention(q, k, v, lengths, scale=scale, backend="reference")
    b, h, d = q.shape
    bound = decode_attention_tolerance(q, k, v, lengths, d**-0.5 if scale is None else scale)
    dev = torch.device(device)
    for name in backends_for("decode_attention", dev, q.dtype, backends):
        if name == "reference":
            continue
        args = [_moved(t, dev) for t in (q, k, v, lengths)]
        before = [t.clone() for t in args]
        got = ops.decode_attention(*args, scale=scale, backend=name)
        assert got.shape == q.shape and got.dtype == q.dtype and got.is_contiguous()
        assert all(torch.equal(x, y) for x, y in zip(args, before, strict=True)), (
            f"{name} wrote to an input"
        )
        assert_within(name, "out", got.reshape(b * h, d), want.reshape(b * h, d), bound)
        if quantize and (h * d) % 32 == 0:
            again, q8 = ops.decode_attention(*args, scale=scale, backend=name, quantize=True)
            assert torch.equal(again, got), f"{name}: quantize=True changed the output"
            bad = q8_mismatches(got, q8)
            assert not bad, (
                f"{name}: Q8_1 of the output differs from the reference quantization in {bad}"
            )


def q8_mismatches(out: torch.Tensor, q8) -> dict[str, int]:
    """``{part: values that differ}`` between ``q8`` (q, d, s) and the reference ``quantize_q8_1``
    of ``out [B, H, D]`` viewed ``[B, H * D]`` (every value of a part whose shape differs); empty
    when they are the same bits."""
    ref = ops.quantize_q8_1(out.reshape(out.shape[0], -1), backend="reference")
    bad = {}
    for part in ("q", "d", "s"):
        mine, theirs = getattr(q8, part), getattr(ref, part)
        n = (
            theirs.numel()
            if mine.shape != theirs.shape
            else int((mine.cpu() != theirs.cpu()).sum())
        )
        if n:
            bad[part] = n
    return bad


@contextlib.contextmanager
def decode_attention_held_to_reference() -> Iterator[list[tuple[str, int, int]]]:
    """Within: every ``ops.decode_attention`` call through a backend other than the reference (a
    model's decode step, say) is computed again by the reference on the same inputs, and each call
    appends ``(backend, elements over the bound, elements)`` to the list it yields, the bound
    :func:`decode_attention_tolerance`'s (with ``quantize=True``, the Q8_1 values that differ from
    the reference quantization of the output count too). The calls return what the backend gave,
    unchanged.

    What an eager decode step on hip's attention is held to (``ftlab bench model`` and ``bench
    qwen35moe``): its logits cannot be held to a step through another attention kernel, since a
    last-bit difference in one layer's attention flips a routing choice a few layers on (on random
    weights, ~7% of the largest logit apart after 48 layers: benchmarks/NOTES.md, "Eager
    decode")."""
    real = ops.decode_attention
    calls: list[tuple[str, int, int]] = []

    def held(q, k, v, lengths, *args, **kwargs):
        got = real(q, k, v, lengths, *args, **kwargs)
        backend = kwargs.get("backend", "auto")
        if backend != "reference":
            out = got[0] if isinstance(got, tuple) else got
            scale = kwargs.get("scale")
            want = real(q, k, v, lengths, scale=scale, backend="reference")
            bound = decode_attention_tolerance(
                q, k, v, lengths, q.shape[-1] ** -0.5 if scale is None else scale
            )
            d = q.shape[-1]
            err = (out.float() - want.float()).abs().reshape(-1, d).cpu()
            over = int((~(err <= bound)).sum())
            # quantize=True: the Q8_1 must be the reference's of out, bit for bit
            if isinstance(got, tuple):
                over += sum(q8_mismatches(out, got[1]).values())
            calls.append((backend, over, err.numel()))
        return got

    ops.decode_attention = held
    try:
        yield calls
    finally:
        ops.decode_attention = real

"""Tolerance and case checks of qk_norm_rope (``ops.qk_norm_rope``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftlab import ops
from ftlab.testing.common import assert_within, backends_for, ulp

EPS32 = 2.0**-23


def qk_norm_rope_tolerance(
    x: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """Per-element bound ``[N, H, D]`` on |backend - reference| for the rows ``x [N, H, D]``,
    derived in f64 from the exact result. Both compute in fp32: the mean square (a sum of D
    squares) within ``(D + 4) eps32`` relatively, so r = rsqrt(...) within half that plus
    2 eps32; each product y = x r w and the rotation's two products and sum add 4 eps32 more
    of their magnitudes. Then each rounds once to the output dtype: up to one ulp apart (half
    an ulp each to nearest; Triton's interpreter truncates bf16, one ulp), at the upper
    binade of ``|exact| + bound``. fp32 output: the rounding is part of the fp32 terms. Past
    the first ``rotary_dim`` dims (default all D) the rows pass through: cos 1, sin 0."""
    d = x.shape[-1]
    rot = d if rotary_dim is None else rotary_dim
    n = x.shape[0]
    xf = x.double().cpu()
    wf = weight.double().cpu().reshape(-1)
    cf = torch.cat(
        [cos.double().cpu().reshape(n, 1, rot), torch.ones(n, 1, d - rot, dtype=torch.float64)], -1
    )
    sf = torch.cat(
        [sin.double().cpu().reshape(n, 1, rot), torch.zeros(n, 1, d - rot, dtype=torch.float64)], -1
    )
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = xf * r * wf
    yp = torch.cat([torch.roll(y[..., :rot], rot // 2, dims=-1), y[..., rot:]], -1)
    exact = y * cf + yp * sf
    rel = ((d + 4) / 2 + 2 + 4 + 2) * EPS32 * 2  # both sides
    bound = rel * (y.abs() * cf.abs() + yp.abs() * sf.abs())
    if x.dtype != torch.float32:
        bound = bound + 1.5 * ulp((exact.abs() + bound).float(), x.dtype).double()
    return bound.float()


def check_qk_norm_rope_case(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
    rotary_dim: int | None = None,
) -> None:
    """Every backend's qk_norm_rope against the reference within :func:`qk_norm_rope_tolerance`
    (q and k as given: views of a fused projection stay views)."""
    want_q, want_k = ops.qk_norm_rope(
        q, k, q_weight, k_weight, cos, sin, eps, rotary_dim=rotary_dim, backend="reference"
    )
    bounds = (
        qk_norm_rope_tolerance(
            q, q_weight.to(q.dtype), cos.to(q.dtype), sin.to(q.dtype), eps, rotary_dim
        ),
        qk_norm_rope_tolerance(
            k, k_weight.to(q.dtype), cos.to(q.dtype), sin.to(q.dtype), eps, rotary_dim
        ),
    )
    for name in backends_for("qk_norm_rope", torch.device(device), q.dtype, backends):
        if name == "reference":
            continue
        got_q, got_k = ops.qk_norm_rope(
            q.to(device),
            k.to(device),
            q_weight.to(device),
            k_weight.to(device),
            cos.to(device),
            sin.to(device),
            eps,
            rotary_dim=rotary_dim,
            backend=name,
        )
        for what, got, want, bound in (
            ("q", got_q, want_q, bounds[0]),
            ("k", got_k, want_k, bounds[1]),
        ):
            assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
            assert_within(
                name,
                what,
                got.reshape(-1, got.shape[-1]),
                want.reshape(-1, want.shape[-1]),
                bound.reshape(-1, bound.shape[-1]),
            )


def check_qk_norm_rope_cache_case(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
    rotary_dim: int | None = None,
) -> None:
    """Every backend's qk_norm_rope writing a KV cache (the reference's included): q_out and k_out
    within :func:`qk_norm_rope_tolerance` of the reference's (each backend's own cache-less call
    gives the same bits), then each live slot's cache rows hold that backend's own k_out and v
    bit for bit, and every other row (slots -1 or outside [0, S), rows named by no slot) is as
    before. ``k_cache`` / ``v_cache`` are copied for each backend, never written."""
    want_q, want_k = ops.qk_norm_rope(
        q, k, q_weight, k_weight, cos, sin, eps, rotary_dim=rotary_dim, backend="reference"
    )
    bounds = (
        qk_norm_rope_tolerance(
            q, q_weight.to(q.dtype), cos.to(q.dtype), sin.to(q.dtype), eps, rotary_dim
        ),
        qk_norm_rope_tolerance(
            k, k_weight.to(q.dtype), cos.to(q.dtype), sin.to(q.dtype), eps, rotary_dim
        ),
    )
    n, s = q.shape[0], k_cache.shape[0]
    live = (slots >= 0) & (slots < s)
    written = torch.zeros(s, dtype=torch.bool)
    written[slots[live].long()] = True
    dev = torch.device(device)
    for name in backends_for("qk_norm_rope", dev, q.dtype, backends):
        args = [t.to(device) for t in (q, k, q_weight, k_weight, cos, sin)]
        kc, vc = _rows_copy(k_cache, dev), _rows_copy(v_cache, dev)
        got_q, got_k = ops.qk_norm_rope(
            *args[:6],
            eps,
            rotary_dim=rotary_dim,
            k_cache=kc,
            v_cache=vc,
            slots=slots.to(device),
            v=v.to(device),
            backend=name,
        )
        plain_q, plain_k = ops.qk_norm_rope(*args[:6], eps, rotary_dim=rotary_dim, backend=name)
        bits = torch.int16 if q.element_size() == 2 else torch.int32
        assert torch.equal(got_q.cpu().view(bits), plain_q.cpu().view(bits)), (
            name,
            "q_out with a cache",
        )
        assert torch.equal(got_k.cpu().view(bits), plain_k.cpu().view(bits)), (
            name,
            "k_out with a cache",
        )
        if name != "reference":
            for what, got, want, bound in (
                ("q", got_q, want_q, bounds[0]),
                ("k", got_k, want_k, bounds[1]),
            ):
                assert_within(
                    name,
                    what,
                    got.cpu().reshape(-1, got.shape[-1]),
                    want.reshape(-1, want.shape[-1]),
                    bound.reshape(-1, bound.shape[-1]),
                )
        kc, vc, got_k = kc.cpu(), vc.cpu(), got_k.cpu()
        for i in range(n):
            if bool(live[i]):  # slots are unique in these cases
                slot = int(slots[i])
                assert torch.equal(kc[slot].view(bits), got_k[i].reshape(-1).view(bits)), (
                    name,
                    "k_cache",
                    slot,
                )
                assert torch.equal(vc[slot].view(bits), v[i].reshape(-1).contiguous().view(bits)), (
                    name,
                    "v_cache",
                    slot,
                )
        assert torch.equal(kc[~written].view(bits), k_cache[~written].view(bits)), (
            name,
            "k_cache rows not named",
        )
        assert torch.equal(vc[~written].view(bits), v_cache[~written].view(bits)), (
            name,
            "v_cache rows not named",
        )


def _rows_copy(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of the rows ``t [S, W]`` on ``device`` with t's row stride (a padded base's view)."""
    base = torch.zeros(t.shape[0], max(t.stride(0), t.shape[1]), dtype=t.dtype, device=device)
    out = base[:, : t.shape[1]]
    out.copy_(t)
    return out

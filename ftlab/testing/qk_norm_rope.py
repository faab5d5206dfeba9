"""Tolerance and case checks of qk_norm_rope (``ops.qk_norm_rope``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftlab import ops
from ftlab.testing.common import assert_within, backends_for, ulp

EPS32 = 2.0**-23


def qk_norm_rope_tolerance(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                           rotary_dim: int | None = None) -> torch.Tensor:  # fmt: skip
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
    cf = torch.cat([cos.double().cpu().reshape(n, 1, rot), torch.ones(n, 1, d - rot, dtype=torch.float64)], -1)
    sf = torch.cat([sin.double().cpu().reshape(n, 1, rot), torch.zeros(n, 1, d - rot, dtype=torch.float64)], -1)
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = xf * r * wf
    yp = torch.cat([torch.roll(y[..., :rot], rot // 2, dims=-1), y[..., rot:]], -1)
    exact = y * cf + yp * sf
    rel = ((d + 4) / 2 + 2 + 4 + 2) * EPS32 * 2  # both sides
    bound = rel * (y.abs() * cf.abs() + yp.abs() * sf.abs())
    if x.dtype != torch.float32:
        bound = bound + 1.5 * ulp((exact.abs() + bound).float(), x.dtype).double()
    return bound.float()


def check_qk_norm_rope_case(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                            cos: torch.Tensor, sin: torch.Tensor, eps: float, device: torch.device | str = "cpu",
                            backends: Sequence[str] | None = None, rotary_dim: int | None = None) -> None:  # fmt: skip
    """Every backend's qk_norm_rope against the reference within :func:`qk_norm_rope_tolerance`
    (q and k as given: views of a fused projection stay views)."""
    want_q, want_k = ops.qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, rotary_dim=rotary_dim,
                                      backend="reference")  # fmt: skip
    bounds = (qk_norm_rope_tolerance(q, q_weight.to(q.dtype), cos.to(q.dtype), sin.to(q.dtype), eps, rotary_dim),
              qk_norm_rope_tolerance(k, k_weight.to(q.dtype), cos.to(q.dtype), sin.to(q.dtype), eps, rotary_dim))  # fmt: skip
    for name in backends_for("qk_norm_rope", torch.device(device), q.dtype, backends):
        if name == "reference":
            continue
        got_q, got_k = ops.qk_norm_rope(q.to(device), k.to(device), q_weight.to(device), k_weight.to(device),
                                        cos.to(device), sin.to(device), eps, rotary_dim=rotary_dim,
                                        backend=name)  # fmt: skip
        for what, got, want, bound in (("q", got_q, want_q, bounds[0]), ("k", got_k, want_k, bounds[1])):
            assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
            assert_within(name, what, got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1]),
                          bound.reshape(-1, bound.shape[-1]))  # fmt: skip

"""Tolerance and case checks of the gated RMSNorm and the output gate (``ops.gated_rmsnorm``,
``ops.output_gate``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftlab import ops
from ftlab.testing.common import assert_within, backends_for, ulp

EPS32 = 2.0**-23
# a sigmoid or SiLU in fp32 (exp, add, divide; or torch's sigmoid and a product), in eps32
GATE_EPS = 6


def _gate_eps(g: torch.Tensor) -> torch.Tensor:
    """Relative error of a sigmoid / SiLU of ``g`` in fp32, in eps32: :data:`GATE_EPS`, and
    |g|/2 more where the exponential is exp2 of g * log2(e) (Triton's on GPUs): the rounding of
    that product moves the result by |g| eps32 / 2 relatively."""
    return GATE_EPS + g.abs() / 2


def _rounded(exact: torch.Tensor, err: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``err`` (each side's fp32 error; the two sides differ by twice it) plus the two roundings
    to ``dtype`` (up to one ulp apart: half an ulp each; Triton's interpreter truncates bf16,
    one ulp), at the upper binade of ``|exact| + bound``."""
    bound = 2 * err
    if dtype != torch.float32:
        bound = bound + 1.5 * ulp((exact.abs() + bound).float(), dtype).double()
    return bound.float()


def gated_rmsnorm_tolerance(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Per-element bound ``[N, H, D]`` on |backend - reference|, derived in f64 from the exact
    result: the mean square (a sum of D squares) within ``(D + 4) eps32`` relatively, so the
    reciprocal square root within half that plus 2 eps32; the three products add 3 eps32 and
    the SiLU :func:`_gate_eps`, all relative to |exact| (no cancellation anywhere)."""
    d = x.shape[-1]
    xf, zf = x.double().cpu(), z.double().cpu()
    exact = (
        xf
        * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        * weight.double().cpu()
        * zf
        * torch.sigmoid(zf)
    )
    rel = ((d + 4) / 2 + 2 + 3 + _gate_eps(zf)) * EPS32
    return _rounded(exact, rel * exact.abs(), x.dtype)


def output_gate_tolerance(attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Per-element bound ``[N, F]``: the sigmoid within :func:`_gate_eps` and the product 1 eps32
    more, relative to |exact|, then the rounding to attn's dtype."""
    g = gate.double().cpu()
    exact = attn.double().cpu() * torch.sigmoid(g)
    return _rounded(exact, (_gate_eps(g) + 1) * EPS32 * exact.abs(), attn.dtype)


def _moved(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` with its strides (a view of a wider buffer stays one)."""
    if t.device == device:
        return t
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
    return out.copy_(t)


def check_gated_rmsnorm_case(
    x: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> None:
    """Every backend's gated_rmsnorm against the reference within
    :func:`gated_rmsnorm_tolerance`."""
    want = ops.gated_rmsnorm(x, z, weight, eps, backend="reference")
    n, h, d = x.shape
    bound = gated_rmsnorm_tolerance(x, z, weight, eps).reshape(n * h, d)
    dev = torch.device(device)
    for name in backends_for("gated_rmsnorm", dev, x.dtype, backends):
        if name == "reference":
            continue
        got = ops.gated_rmsnorm(_moved(x, dev), _moved(z, dev), weight.to(dev), eps, backend=name)
        assert got.shape == x.shape and got.dtype == x.dtype and got.is_contiguous()
        assert_within(name, "y", got.reshape(n * h, d), want.reshape(n * h, d), bound)


def check_output_gate_case(
    attn: torch.Tensor,
    gate: torch.Tensor,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> None:
    """Every backend's output_gate against the reference within :func:`output_gate_tolerance`
    (gate with its row stride, as the model's slice of the q projection)."""
    want = ops.output_gate(attn, gate, backend="reference")
    bound = output_gate_tolerance(attn, gate)
    dev = torch.device(device)
    for name in backends_for("output_gate", dev, attn.dtype, backends):
        if name == "reference":
            continue
        got = ops.output_gate(_moved(attn, dev), _moved(gate, dev), backend=name)
        assert got.shape == attn.shape and got.dtype == attn.dtype and got.is_contiguous()
        assert_within(name, "y", got, want, bound)

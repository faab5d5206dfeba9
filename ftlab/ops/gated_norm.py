"""gated_norm (docs/OPS.md section 10): the gated RMSNorm of a gated-deltanet layer's output and
the sigmoid output gate of a gated attention layer (Qwen3-Next, Qwen3.5)."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``[N, H, D]`` with contiguous heads and elements (any token stride) as given, else a copy."""
    d = t.shape[2]
    return t if t.stride(2) == 1 and (t.shape[1] <= 1 or t.stride(1) == d) else t.contiguous()


def gated_rmsnorm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, *, backend: str = "auto"
) -> torch.Tensor:
    """RMSNorm of each head's row, scaled by the weight and gated by SiLU of z.

    ``x [N, H, D]`` (fp32 / fp16 / bf16), ``z [N, H, D]`` (any float dtype), ``weight [D]`` (any
    float dtype); views with contiguous heads and elements and any token stride are taken as they
    are. ``y = x / sqrt(mean(x^2) + eps) * weight * silu(z)`` over each row of D, in fp32,
    rounded once. Returns a new contiguous ``y [N, H, D]`` in x's dtype.
    """
    argcheck.float_tensor("x", x)
    argcheck.float_tensor("z", z)
    if x.dim() != 3 or x.shape[2] == 0:
        raise ValueError(f"x must be 3-D [N, H, D] with D > 0, got shape {tuple(x.shape)}")
    if z.shape != x.shape:
        raise ValueError(f"z must have x's shape {tuple(x.shape)}, got {tuple(z.shape)}")
    eps = argcheck.norm_weight(weight, "D", x.shape[2], eps, x, z=z)
    impl = backends.resolve("gated_rmsnorm", backend, x.device, x.dtype)
    return impl.fn(_rows(x), _rows(z), weight.to(torch.float32).contiguous(), eps)


def output_gate(attn: torch.Tensor, gate: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """``y = attn * sigmoid(gate)`` elementwise, in fp32, rounded once to attn's dtype.

    ``attn [N, F]`` and ``gate [N, F]`` (fp32 / fp16 / bf16, one dtype; views with contiguous
    features and any row stride, e.g. the gate slice of a fused q projection, are taken as they
    are). Returns a new contiguous ``y [N, F]``.
    """
    argcheck.float_tensor("attn", attn)
    argcheck.float_tensor("gate", gate)
    if attn.dim() != 2:
        raise ValueError(f"attn must be 2-D [N, F], got shape {tuple(attn.shape)}")
    if gate.shape != attn.shape:
        raise ValueError(
            f"gate must have attn's shape {tuple(attn.shape)}, got {tuple(gate.shape)}"
        )
    if gate.dtype != attn.dtype:
        raise TypeError(f"gate must have attn's dtype {attn.dtype}, got {gate.dtype}")
    if gate.device != attn.device:
        raise ValueError(f"gate must be on attn's device {attn.device}, got {gate.device}")
    attn, gate = (
        t if t.stride(1) == 1 or t.shape[1] <= 1 else t.contiguous() for t in (attn, gate)
    )
    impl = backends.resolve("output_gate", backend, attn.device, attn.dtype)
    return impl.fn(attn, gate)

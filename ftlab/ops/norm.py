"""norm (docs/OPS.md, ``add_rmsnorm``): the residual add of a transformer layer fused with the
RMSNorm that follows it (the decode hot path: one pass over the row instead of two)."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends


def contiguous_rows(t: torch.Tensor) -> torch.Tensor:
    """``[N, H]`` with contiguous rows (any row stride) as given, else a copy."""
    return t if t.stride(1) == 1 or t.shape[1] <= 1 else t.contiguous()


def add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    backend: str = "auto",
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the RMSNorm after it: ``(y, s)``.

    ``x [N, H]`` (fp32 / fp16 / bf16), ``residual [N, H]`` of x's dtype or None, ``weight [H]``
    (any float dtype), ``eps`` a finite number >= 0; views with contiguous rows and any row
    stride are taken as they are. ``s = x + residual`` in fp32, rounded once to x's dtype (x
    itself when residual is None: no copy); ``y = s / sqrt(mean(s^2) + eps) * weight`` over each
    row of H, in fp32 from the rounded s, rounded once. Returns a new contiguous ``y [N, H]`` and
    ``s`` (a new contiguous ``[N, H]``, or x), both in x's dtype; the inputs are never written.

    ``validate=False`` skips the argument checks above (the caller vouches for them, as the models
    do: a :class:`~ftlab.models.DecodePlan`'s ``checks``); the backends still refuse layouts they
    cannot read.
    """
    eps = checked(x, residual, weight, eps) if validate else float(eps)
    impl = backends.resolve("add_rmsnorm", backend, x.device, x.dtype)
    res = None if residual is None else contiguous_rows(residual)
    y, s = impl.fn(contiguous_rows(x), res, weight.contiguous(), eps)
    return y, x if residual is None else s


def checked(x: object, residual: object, weight: object, eps: object) -> float:
    """add_rmsnorm's argument checks (each error names the argument); eps as a float."""
    argcheck.float_tensor("x", x)
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"x must be 2-D [N, H] with H > 0, got shape {tuple(x.shape)}")
    if residual is not None:
        argcheck.tensor("residual", residual)
        if residual.shape != x.shape:
            raise ValueError(
                f"residual must have x's shape {tuple(x.shape)} (or be None), "
                f"got {tuple(residual.shape)}"
            )
        if residual.dtype != x.dtype:
            raise TypeError(f"residual must have x's dtype {x.dtype}, got {residual.dtype}")
    return argcheck.norm_weight(weight, "H", x.shape[1], eps, x, residual=residual)

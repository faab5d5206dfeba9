"""Matmul on GGUF Q8_0 and the K-quants (docs/OPS.md section 11); Q4_0 through
:func:`~ftlab.ops.q4_0_matmul`, so callers use :func:`quant_matmul` for every packed type."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends
from ftlab.backends import calls
from ftlab.ops.q4_0 import q4_0_matmul
from ftlab.quant import Q4_0Weight, QuantWeight

#: the types whose matmul is this op (Q4_0 goes to q4_0_matmul)
MATMUL_TYPES = ("Q8_0", "Q4_K", "Q5_K", "Q6_K")


def quant_matmul(
    x: torch.Tensor,
    w: QuantWeight,
    *,
    path: str = "auto",
    backend: str = "auto",
    validate: bool = True,
    plan: backends.Plan | None = None,
) -> torch.Tensor:
    """``x [M, K] @ W.T -> [M, N]`` in x's dtype (fp32 / fp16 / bf16) for a packed weight
    ``W [N, K]`` of any :data:`ftlab.quant.QTYPES` type.

    Paths (docs/OPS.md section 11):
      ``"int8"``: x is quantized to Q8_1 (``quantize_q8_1``) and each weight sub-block (32, or 16
      for Q6_K) meets its Q8_1 block through an exact integer dot, scaled as llama.cpp's
      ``vec_dot_*_q8_1`` does; backends agree to the fp32 rounding of the scale products and
      of the sum (``ftlab.testing.quant_matmul_tolerance``).
      ``"dequant"``: ``x @ dequantize(W).T`` with the weights rounded to x's dtype in the tile,
      accumulated in fp32.
      ``"auto"``: int8 up to ``backends.DECODE_MAX_TOKENS`` rows, else the backend's prefill path.
    ``backend="auto"`` and the path and kernel variant are the planner's (``ftlab.backends.plan``;
    ``ftlab ops quant_matmul --explain`` prints its choice and why). A
    :class:`~ftlab.quant.Q4_0Weight` goes to :func:`~ftlab.ops.q4_0_matmul` (same paths). x may be
    non-contiguous (row stride > K).

    ``plan``: a plan this op made for the same call (``backends.plan("quant_matmul", ...)``,
    kept by a model for each weight), taken instead of planning again; ``backend`` and ``path``
    are then the plan's.

    ``validate=False`` skips the argument checks (the caller vouches for them, as the models do:
    a :class:`~ftlab.models.DecodePlan`'s ``checks``); the backends still refuse layouts they cannot
    read.
    """
    if isinstance(w, Q4_0Weight):
        return q4_0_matmul(x, w, path=path, backend=backend, validate=validate, plan=plan)
    if validate:
        _checks(x, w)
    plan = backends.checked_plan(plan, "quant_matmul") or backends.plan(
        "quant_matmul", calls.matmul(x, w), backend=backend, path=path
    )
    if x.shape[0] == 0 or w.shape[0] == 0 or x.shape[1] == 0:
        return torch.zeros((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.contiguous()
    return plan.run(x, w, plan.path)


def _checks(x: object, w: object) -> None:
    argcheck.float_tensor("x", x)
    if not isinstance(w, QuantWeight):
        raise TypeError(f"w must be a ftlab.quant.QuantWeight, got {type(w).__name__}")
    if w.qtype not in MATMUL_TYPES:
        raise ValueError(f"w.qtype must be one of {('Q4_0', *MATMUL_TYPES)}, got {w.qtype!r}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if len(w.shape) != 2:
        raise ValueError(f"w must be a 2-D QuantWeight [N, K], got shape {tuple(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(
            f"x must have K = {w.shape[1]} columns (w is {tuple(w.shape)}), got {x.shape[1]}"
        )
    if x.device != w.device:
        raise ValueError(f"x must be on the device of w ({w.device}), got {x.device}")

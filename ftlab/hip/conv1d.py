"""conv1d through the HIP kernels of ``csrc/conv1d.hip`` (JIT-built, cached): one thread per
(sequence, channel, run of tokens) for the prefill, one per (sequence, channel) for the decode
step, which shifts the state in place (from zeros for the rows flagged in ``reset``)."""

from __future__ import annotations

import torch

from ftlab import jit


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor | None,
    lengths: torch.Tensor | None,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.causal_conv1d` (ops checked the layouts)."""
    b, t, c = x.shape
    w = weight.shape[1]
    y = torch.empty((b, t, c), dtype=x.dtype, device=x.device)
    new_state = torch.empty((b, c, w - 1), dtype=x.dtype, device=x.device)
    lens = lengths.to(torch.int32) if lengths is not None else weight
    module = jit.module_for("conv1d", x.device)
    jit.on_device(
        x.device,
        lambda: module.causal_conv1d(
            x,
            weight,
            weight if bias is None else bias,
            new_state if state is None else state,
            lens,
            y,
            new_state,
            bias is not None,
            state is not None,
            lengths is not None,
            silu,
        ),
    )
    return y, new_state


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor,
    silu: bool,
    reset: torch.Tensor | None = None,
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.causal_conv1d_update` (state updated in place; ``reset``
    bool ``[B]`` or None, passed as its bytes)."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    flags = reset.view(torch.uint8) if reset is not None else None
    module = jit.module_for("conv1d", x.device)
    jit.on_device(
        x.device,
        lambda: module.causal_conv1d_update(
            x,
            weight,
            weight if bias is None else bias,
            state,
            y if flags is None else flags,
            y,
            bias is not None,
            flags is not None,
            silu,
        ),
    )
    return y

"""conv1d, the reference (docs/OPS.md section 8: causal depthwise conv1d with a carried state).

``xin`` is the state ``[B, C, W-1]`` followed by the tokens of x along time; output token t of
channel c is ``act(bias[c] + sum_j weight[c, j] * xin[t + j, c])``, the W inputs ending at
token t. Tokens past a sequence's length are zero, and the new state is the W-1 inputs ending at
the sequence's last token. fp32 throughout, rounded once to x's dtype.
"""

from __future__ import annotations

import torch


def _conv(
    xin: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool, t: int
) -> torch.Tensor:
    """``xin [B, W-1+T, C]`` in fp32 -> ``[B, T, C]`` in fp32."""
    w = weight.shape[1]
    acc = xin.new_zeros(xin.shape[0], t, xin.shape[2])
    if bias is not None:
        acc = acc + bias.float()
    for j in range(w):
        acc = acc + weight[:, j].float() * xin[:, j : j + t, :]
    return acc * torch.sigmoid(acc) if silu else acc


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor | None,
    lengths: torch.Tensor | None,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.causal_conv1d`."""
    b, t, c = x.shape
    w = weight.shape[1]
    if state is None:
        state = x.new_zeros(b, c, w - 1)
    xin = torch.cat([state.transpose(1, 2), x], dim=1)  # [B, W-1+T, C], x's dtype: exact
    y = _conv(xin.float(), weight, bias, silu, t)
    ends = (
        torch.full((b,), t, dtype=torch.int64, device=x.device)
        if lengths is None
        else lengths.long().clamp(0, t)
    )
    valid = torch.arange(t, device=x.device)[None, :] < ends[:, None]  # [B, T]
    y = torch.where(valid[:, :, None], y, torch.zeros((), device=x.device)).to(x.dtype)
    # [B, W-1], indices into xin
    taps = ends[:, None] + torch.arange(w - 1, device=x.device)[None, :]
    new_state = torch.gather(xin, 1, taps[:, :, None].expand(b, w - 1, c)).transpose(1, 2)
    return y.contiguous(), new_state.contiguous()


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor,
    silu: bool,
    reset: torch.Tensor | None = None,
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.causal_conv1d_update` (state updated in place). A row
    with ``reset[b]`` True reads zeros for its old state (a select: whatever it held is unused)."""
    old = state
    if reset is not None:
        old = torch.where(
            reset[:, None, None], torch.zeros((), dtype=state.dtype, device=state.device), state
        )
    xin = torch.cat([old.transpose(1, 2), x[:, None, :]], dim=1)  # [B, W, C]
    y = _conv(xin.float(), weight, bias, silu, 1)[:, 0, :].to(x.dtype)
    state.copy_(xin[:, 1:, :].transpose(1, 2))
    return y.contiguous()

"""conv1d (docs/OPS.md section 8): the causal depthwise conv1d of a gated-deltanet layer
(Qwen3-Next, Qwen3.5), prefill with a carried state and the one-token decode step."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends
from ftlab import platform as ftplatform

_ACTIVATIONS = ("silu", None)
_MAX_WIDTH = 4


def _activation(activation: object) -> bool:
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    return activation == "silu"


def _weights(
    weight: object, bias: object, c: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """weight ``[C, W]`` and bias ``[C]`` (or None) checked, as contiguous fp32."""
    argcheck.float_tensor("weight", weight)
    if weight.dim() != 2 or weight.shape[0] != c or not 2 <= weight.shape[1] <= _MAX_WIDTH:
        raise ValueError(
            f"weight must be [C={c}, W] with W in [2, {_MAX_WIDTH}], got shape "
            f"{tuple(weight.shape)}"
        )
    if weight.device != device:
        raise ValueError(f"weight must be on x's device {device}, got {weight.device}")
    if bias is not None:
        argcheck.float_tensor("bias", bias)
        if tuple(bias.shape) != (c,):
            raise ValueError(f"bias must be [C={c}], got shape {tuple(bias.shape)}")
        if bias.device != device:
            raise ValueError(f"bias must be on x's device {device}, got {bias.device}")
        bias = bias.to(torch.float32).contiguous()
    return weight.to(torch.float32).contiguous(), bias


def _state(state: object, b: int, c: int, w: int, x: torch.Tensor) -> torch.Tensor:
    argcheck.tensor("state", state)
    if tuple(state.shape) != (b, c, w - 1):
        raise ValueError(
            f"state must be [B={b}, C={c}, W-1={w - 1}], got shape {tuple(state.shape)}"
        )
    if state.dtype != x.dtype:
        raise TypeError(f"state must have x's dtype {x.dtype}, got {state.dtype}")
    if state.device != x.device:
        raise ValueError(f"state must be on x's device {x.device}, got {state.device}")
    return state


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    state: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    activation: str | None = "silu",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv1d over the tokens of each sequence, continuing from a carried state.

    ``x [B, T, C]`` (fp32 / fp16 / bf16, channels last; a view with contiguous channels, any
    batch and token strides, e.g. a slice of a fused projection), ``weight [C, W]`` (W in 2..4,
    any float dtype), ``bias [C]`` or None, ``state [B, C, W-1]`` in x's dtype (None: zeros, the
    sequences start fresh), ``lengths [B]`` int32 / int64 (valid tokens of each sequence, in
    ``[0, T]``; None: all T). With ``xin`` the state followed by x along the tokens::

        y[b, t, c] = act(bias[c] + sum_j weight[c, j] * xin[b, t + j, c])     for t < lengths[b]

    and 0 for ``t >= lengths[b]``; ``act`` is SiLU (``activation="silu"``) or the identity
    (None). fp32 accumulation, one rounding to x's dtype. Returns new contiguous ``(y [B, T, C]
    in x's dtype, new_state [B, C, W-1])``: ``new_state[b, :, i] = xin[b, lengths[b] + i, :]``,
    the last W-1 inputs up to the sequence's end (old state entries when lengths[b] < W-1).
    ``lengths`` values are checked on the host unless a CUDA graph is being captured; the
    kernels clamp them to ``[0, T]``.
    """
    argcheck.float_tensor("x", x)
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D [B, T, C], got shape {tuple(x.shape)}")
    silu = _activation(activation)
    b, t, c = x.shape
    weight, bias = _weights(weight, bias, c, x.device)
    w = weight.shape[1]
    if state is not None:
        state = _state(state, b, c, w, x).contiguous()
    if lengths is not None:
        argcheck.tensor("lengths", lengths)
        argcheck.dtype_in("lengths", lengths, argcheck.INDEX_DTYPES)
        if tuple(lengths.shape) != (b,):
            raise ValueError(f"lengths must be [B={b}], got shape {tuple(lengths.shape)}")
        if lengths.device != x.device:
            raise ValueError(f"lengths must be on x's device {x.device}, got {lengths.device}")
        if b and not ftplatform.capturing(x.device):
            low, high = int(lengths.min()), int(lengths.max())
            if low < 0 or high > t:
                raise ValueError(f"lengths must lie in [0, T={t}], got values in [{low}, {high}]")
        lengths = lengths.contiguous()
    if x.stride(2) != 1:
        x = x.contiguous()
    impl = backends.resolve("causal_conv1d", backend, x.device, x.dtype)
    return impl.fn(x, weight, bias, state, lengths, silu)


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor,
    *,
    activation: str | None = "silu",
    backend: str = "auto",
    reset: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode token of :func:`causal_conv1d`: ``x [B, C]`` (fp32 / fp16 / bf16, contiguous
    channels, any batch stride), ``weight [C, W]`` (W in 2..4, any float dtype), ``bias [C]`` or
    None, ``state [B, C, W-1]`` in x's dtype with a unit last stride, updated IN PLACE to its last
    W-2 entries followed by x. Returns ``y [B, C]`` in x's dtype: ``act(bias + sum_j weight[:, j]
    * xin[:, j])`` with ``xin`` the old state then x.

    ``reset`` (None, or bool ``[B]`` on x's device, any stride): the rows where it is True start
    afresh, as if their state were all zeros before the step: their old state is not read (NaN or
    inf there cannot reach y or the new state), ``y[b]`` is the conv of zeros then ``x[b]`` and
    ``state[b]`` becomes W-2 zeros then ``x[b]``. Rows where it is False are computed as without
    ``reset``, bit for bit. No host synchronisation (the Triton and HIP backends can be captured
    in a CUDA graph, ``reset`` included).
    """
    argcheck.float_tensor("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [B, C], got shape {tuple(x.shape)}")
    silu = _activation(activation)
    b, c = x.shape
    weight, bias = _weights(weight, bias, c, x.device)
    _state(state, b, c, weight.shape[1], x)
    if state.numel() and state.shape[2] > 1 and state.stride(2) != 1:
        raise ValueError(
            "state must have a unit last stride (it is updated in place), got strides "
            f"{state.stride()}"
        )
    if reset is not None:
        argcheck.reset_rows("reset", reset, b, "x", x)
    if x.stride(1) != 1:
        x = x.contiguous()
    impl = backends.resolve("causal_conv1d_update", backend, x.device, x.dtype)
    if reset is None:  # a registered backend may take (x, weight, bias, state, silu) only
        return impl.fn(x, weight, bias, state, silu)
    return impl.fn(x, weight, bias, state, silu, reset)

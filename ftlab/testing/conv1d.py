"""Tolerance and case checks of the causal conv1d (``ops.causal_conv1d``,
``ops.causal_conv1d_update``)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from ftlab import ops
from ftlab.testing.common import assert_within, backends_for, ulp

EPS32 = 2.0**-23
SILU_SLOPE = 1.1  # max |d/da (a * sigmoid(a))| = 1.0998...


def causal_conv1d_tolerance(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor | None,
    activation: str | None,
) -> torch.Tensor:
    """Per-element bound ``[B, T, C]`` on |backend - reference| for ``x [B, T, C]`` (all T
    tokens valid; padded ones are exactly 0 on both sides), derived in f64 from the exact
    result. Both sum the bias and W products in fp32, in any order and with or without fused
    multiply-adds: within ``(W + 2) eps32`` of ``S = |bias| + sum |w x|`` each. SiLU moves that
    error by at most its slope 1.1 and adds its own evaluation (exp, add, divide or the
    sigmoid and a product: 6 eps32 of |silu|, and |a|/2 eps32 more where the exponential is
    exp2 of a * log2(e), as Triton's on GPUs: that product's rounding). Then each rounds once to x's
    dtype: up to one ulp apart (half an ulp each; Triton's interpreter truncates bf16, one ulp), at
    the upper binade of ``|exact| + bound``."""
    b, t, c = x.shape
    w = weight.shape[1]
    st = (
        state.double().cpu() if state is not None else torch.zeros(b, c, w - 1, dtype=torch.float64)
    )
    xin = torch.cat([st.transpose(1, 2), x.double().cpu()], dim=1)
    wd = weight.double().cpu()
    exact = (
        bias.double().cpu().expand(b, t, c).clone()
        if bias is not None
        else torch.zeros(b, t, c, dtype=torch.float64)
    )
    size = exact.abs()
    for j in range(w):
        term = wd[:, j] * xin[:, j : j + t, :]
        exact = exact + term
        size = size + term.abs()
    err = (w + 2) * EPS32 * size
    if activation == "silu":
        exact_out = exact * torch.sigmoid(exact)
        err = SILU_SLOPE * err + (6 + exact.abs() / 2) * EPS32 * exact_out.abs()
    else:
        exact_out = exact
    bound = 2 * err
    if x.dtype != torch.float32:
        bound = bound + 1.5 * ulp((exact_out.abs() + bound).float(), x.dtype).double()
    return bound.float()


def _valid_bound(bound: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """The bound with the padded rows (``t >= lengths[b]``) set to 0: both sides write exact 0s."""
    if lengths is None:
        return bound
    t = bound.shape[1]
    valid = torch.arange(t)[None, :] < lengths.cpu().long().clamp(0, t)[:, None]
    return torch.where(valid[:, :, None], bound, torch.zeros(()))


def _copy_on(dev: torch.device, t: torch.Tensor | None) -> torch.Tensor | None:
    """A copy of ``t`` on ``dev`` with its strides (a view of a wider buffer stays one, and a
    state updated in place is the backend's own); None stays None."""
    if t is None:
        return None
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=dev).copy_(t)


def check_causal_conv1d_case(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor | None,
    lengths: torch.Tensor | None,
    activation: str | None,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> None:
    """Every backend's causal_conv1d against the reference: y within :func:`causal_conv1d_tolerance`
    (x as given: a strided view stays a view), the new state bit for bit (it is a copy of
    inputs)."""
    want_y, want_state = ops.causal_conv1d(
        x, weight, bias, state=state, lengths=lengths, activation=activation, backend="reference"
    )
    bound = _valid_bound(causal_conv1d_tolerance(x, weight, bias, state, activation), lengths)
    dev = torch.device(device)
    on = functools.partial(_copy_on, dev)
    for name in backends_for("causal_conv1d", dev, x.dtype, backends):
        if name == "reference":
            continue
        got_y, got_state = ops.causal_conv1d(
            on(x),
            on(weight),
            on(bias),
            state=on(state),
            lengths=on(lengths),
            activation=activation,
            backend=name,
        )
        assert got_y.shape == want_y.shape and got_y.dtype == x.dtype and got_y.is_contiguous()
        assert (
            got_state.shape == want_state.shape
            and got_state.dtype == x.dtype
            and got_state.is_contiguous()
        )
        b, t, c = want_y.shape
        assert_within(
            name, "y", got_y.reshape(b * t, c), want_y.reshape(b * t, c), bound.reshape(b * t, c)
        )
        assert torch.equal(got_state.cpu(), want_state), (
            f"{name}: new_state differs from the reference"
        )


def check_causal_conv1d_update_case(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state: torch.Tensor,
    activation: str | None,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
    *,
    reset: torch.Tensor | None = None,
) -> None:
    """Every backend's causal_conv1d_update against the reference on its own copy of ``state``
    (any strides, as given: the update is in place): y within the tolerance of a one-token
    causal_conv1d, the updated state bit for bit. With ``reset`` (bool ``[B]``, any stride) the
    old state of the reset rows may hold anything (NaN, inf): the tolerance is that of their zero
    state, and each backend must also give bit for bit what it gives without ``reset`` on the
    state with those rows zeroed (the other rows untouched by the flag, the reset ones a zero
    state)."""
    want_state = state.clone()
    want_y = ops.causal_conv1d_update(
        x, weight, bias, want_state, activation=activation, backend="reference", reset=reset
    )
    b, c = x.shape
    fresh = (
        state
        if reset is None
        else torch.where(reset[:, None, None], torch.zeros((), dtype=state.dtype), state)
    )
    bound = causal_conv1d_tolerance(x[:, None, :], weight, bias, fresh, activation)[:, 0, :]
    dev = torch.device(device)
    on = functools.partial(_copy_on, dev)
    for name in backends_for("causal_conv1d_update", dev, x.dtype, backends):
        if name == "reference":
            continue
        got_state = on(state)
        wd, bd = weight.to(dev), None if bias is None else bias.to(dev)
        got_y = ops.causal_conv1d_update(
            on(x), wd, bd, got_state, activation=activation, backend=name, reset=on(reset)
        )
        assert got_y.shape == (b, c) and got_y.dtype == x.dtype
        assert_within(name, "y", got_y, want_y, bound)
        assert torch.equal(got_state.cpu(), want_state), (
            f"{name}: the updated state differs from the reference"
        )
        if reset is not None:
            plain_state = on(fresh)
            plain_y = ops.causal_conv1d_update(
                on(x), wd, bd, plain_state, activation=activation, backend=name
            )
            assert torch.equal(got_y, plain_y), (
                f"{name}: y with reset differs from y on the zeroed state"
            )
            assert torch.equal(got_state, plain_state), (
                f"{name}: the state with reset differs from the zeroed one's"
            )

"""The gated delta rule with bf16 operands (``ops.gated_delta_rule(..., precision="bf16")``): the
bound of bf16 operands (``ftlab.testing.gated_delta_tolerance(..., operands="bf16")``) against the
usual mistakes, and Triton's chunk-64 kernels with bf16 dots in the interpreter and on a GPU
within it and within one plane's accuracy. HIP's one-plane chunks:
tests/unit/test_gated_delta_rule_chunk_host.py (the CPU) and
tests/property/test_gated_delta_rule_hip_chunk.py (the GPU)."""

import pytest
import torch

import ftlab.testing as ft
from ftlab import backends, ops
from ftlab.testing.gated_delta_bounds import gated_delta_exact_and_tolerance


def _inputs(gen, b, t, hk, hv, dk, dv, *, decay=1.0):
    """bf16 q, k, v, g (log decay <= 0), beta in (0, 1) and an fp32 initial state."""
    q = torch.randn(b, t, hk, dk, generator=gen).bfloat16()
    k = torch.randn(b, t, hk, dk, generator=gen).bfloat16()
    v = torch.randn(b, t, hv, dv, generator=gen).bfloat16()
    g = -decay * torch.nn.functional.softplus(torch.randn(b, t, hv, generator=gen))
    beta = torch.sigmoid(torch.randn(b, t, hv, generator=gen)).bfloat16()
    return q, k, v, g, beta, torch.randn(b, hv, dk, dv, generator=gen) * 0.5


@pytest.mark.parametrize("decay", [0.01, 1.0, 8.0])
def test_bf16_operand_bound_catches_mistakes(decay):
    """The bound of bf16 operands still fails value heads mapped modulo Hk and beta squared at
    every decay, and where the decay matters (not at g ~ -0.01) the decay one token off, g off by
    5% and the state not carried into the second chunk; bf16 inputs over three chunks. It is a
    worst case (each rounding's error added in absolute value, carried without the update's
    contraction), so at slow decays it widens chunk by chunk (the output's bound ~1x |o| in the
    first chunk, ~10x and ~25x in the next two at g ~ -0.01): there it checks validity, and
    ft.assert_one_plane_accuracy is the sharp check of the kernels."""
    gen = torch.Generator().manual_seed(11)
    q, k, v, g, beta, state = _inputs(gen, 1, 130, 2, 4, 32, 32, decay=decay)
    exact_o, _, o_bound, _ = gated_delta_exact_and_tolerance(
        q, k, v, g, beta, state, None, True, 64, operands="bf16"
    )
    regrouped = torch.cat([v[:, :, 0::2], v[:, :, 1::2]], 2)
    mistakes = [
        ("heads modulo", (q, k, regrouped, g, beta)),
        ("beta squared", (q, k, v, g, beta**2)),
    ]
    if decay >= 1.0:
        mistakes += [
            ("g shifted", (q, k, v, g.roll(1, 1), beta)),
            ("g * 1.05", (q, k, v, g * 1.05, beta)),
        ]
    for what, args in mistakes:
        o, _ = ops.gated_delta_rule(*args, state=state, backend="reference")
        assert not bool(((o.double() - exact_o).abs() <= 2 * o_bound).all()), what
    if decay >= 1.0:  # the second and third chunks from a zero state: only their outputs compared
        first = [x[:, :64] for x in (q, k, v, g, beta)]
        rest = [x[:, 64:] for x in (q, k, v, g, beta)]
        _, carried = ops.gated_delta_rule(*first, state=state, backend="reference")
        o, _ = ops.gated_delta_rule(*rest, state=torch.zeros_like(carried), backend="reference")
        assert not bool(((o.double() - exact_o[:, 64:]).abs() <= 2 * o_bound[:, 64:]).all()), (
            "state dropped"
        )


def _check_triton_bf16_operands(q, k, v, g, beta, state, device):
    """Triton's chunk-64 kernels with bf16 operands (``precision="bf16"``): within the bound of
    bf16 operands and one plane's accuracy (o's against the exact output truncated in the
    interpreter, whose casts truncate); and further from exact than fp32 operands get (1e-4 of
    the state: one plane gives ~2e-3), so a lost BF16 flag shows."""
    ft.check_gated_delta_rule_case(
        q, k, v, g, beta, state, chunk_size=64, backends=["triton"], device=device, precision="bf16"
    )
    exact_o, exact_s = ft.gated_delta_exact(q, k, v, g, beta, state)
    o, s = ops.gated_delta_rule(
        *(x.to(device) for x in (q, k, v, g, beta)),
        state=state.to(device),
        precision="bf16",
        backend="triton",
    )
    ft.assert_one_plane_accuracy(o, s, exact_o, exact_s, truncating=device == "cpu")
    assert float((s.cpu().double() - exact_s).norm() / exact_s.norm()) > 1e-4, (
        "fp32 operands' accuracy"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("decay", [0.01, 1.0])
def test_triton_bf16_operands_gpu(decay):
    """Triton's bf16 operands on the GPU at Qwen3.6's heads over five chunks."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, g, beta, state = _inputs(gen, 1, 300, 16, 32, 128, 128, decay=decay)
    _check_triton_bf16_operands(q, k, v, g, beta, state, "cuda")


@pytest.mark.parametrize("dims", [(1, 130, 2, 4, 128, 128), (2, 70, 1, 2, 128, 40)])
def test_triton_bf16_operands_interpreted(dims):
    """The same in Triton's interpreter: the models' key size over three chunks, a partial
    value-column tile; slow decays, so that the state carried from chunk to chunk weighs in."""
    if "triton" not in backends.available_backends(
        "gated_delta_rule", torch.device("cpu"), torch.float32
    ):
        pytest.skip("Triton's interpreter is off in this process")
    gen = torch.Generator().manual_seed(dims[1])
    _check_triton_bf16_operands(*_inputs(gen, *dims, decay=0.01), "cpu")

"""The gated delta rule's HIP kernels (ftlab/hip/csrc/gated_delta_rule.hip) run on the CPU: the
device code and the real q4_0_common.h compiled by the host C++ compiler against the host port.h of
tests/unit/host (harness: tests/unit/gated_delta_rule_host), a thread per GPU thread, fp32, held to
the exact recurrence within ftlab.testing.gated_delta_tolerance. Catches indexing and reduction
mistakes without a GPU; the GPU tests (tests/property/test_gated_delta_rule.py,
test_gated_delta_rule_kernels.py, ``gpu``) run the real thing."""

import ctypes

import pytest
import torch
from host_build import CSRC, HOST_PORT, ROOT, build_harness

import ftlab.testing as ft


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    # the host port.h beside the real device headers, which include it
    sources = [
        CSRC / "q4_0_common.h",
        CSRC / "gated_delta_rule.hip",
        HOST_PORT,
        ROOT / "tests/unit/gated_delta_rule_host/harness.cpp",
    ]
    return build_harness(tmp_path_factory.mktemp("gated_delta_rule_host"), sources, "harness.cpp")


def _ptr(t: torch.Tensor):
    return ctypes.c_void_p(t.data_ptr())


@pytest.mark.parametrize(
    "b, t, hk, hv, dk, dv, l2norm, cols, vec, gates",
    [
        (1, 0, 1, 2, 16, 40, True, 16, True, False),
        (1, 0, 1, 2, 16, 40, True, 32, True, False),  # a partial last block of columns
        (2, 0, 2, 4, 128, 32, True, 32, True, False),
        (1, 0, 2, 2, 100, 37, False, 32, False, False),  # Dv % 4 != 0: the scalar accesses
        (1, 0, 1, 1, 128, 20, True, 16, False, False),
        (3, 0, 2, 4, 32, 40, True, 16, True, True),  # the gates from a and b, a row reset
        (3, 0, 1, 2, 64, 37, True, 32, False, True),
        (1, 9, 1, 2, 32, 48, True, 0, False, False),
        (2, 5, 2, 2, 100, 16, False, 0, False, False),
    ],
)
def test_hip_kernels_on_the_host(harness, b, t, hk, hv, dk, dv, l2norm, cols, vec, gates):
    """t = 0: the decode step on one token (``cols`` state columns a block, 16-byte accesses
    when ``vec``; ``gates``: g and beta made in the kernel from the raw a and b, the middle row
    reset over a state of NaN); else the prefill scan over t tokens."""
    gen = torch.Generator().manual_seed(b + t + dk)
    steps = max(t, 1)
    q = torch.randn(b, steps, hk, dk, generator=gen)
    k = torch.randn(b, steps, hk, dk, generator=gen) * (1.0 if l2norm else dk**-0.5)
    v = torch.randn(b, steps, hv, dv, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(b, steps, hv, generator=gen))
    beta = torch.sigmoid(torch.randn(b, steps, hv, generator=gen))
    state = torch.randn(b, hv, dk, dv, generator=gen) * 0.5
    scale = dk**-0.5
    extra, kw, start = (None, None, None), {}, state
    if gates:  # raw a and b in g and beta's places, the gates' vectors, row 1 reset
        g, beta = (
            torch.randn(b, steps, hv, generator=gen) * 4,
            torch.randn(b, steps, hv, generator=gen) * 3,
        )
        a_neg, dt_bias = (
            -torch.empty(hv).uniform_(1.0, 16.0, generator=gen),
            torch.randn(hv, generator=gen) * 2,
        )
        reset = torch.tensor([i == 1 for i in range(b)], dtype=torch.uint8)
        extra, kw = (_ptr(a_neg), _ptr(dt_bias), _ptr(reset)), {"gates": (a_neg, dt_bias)}
        start = state.clone()
        start[1] = 0.0
        state[1] = float("nan")
    got_state = state.clone()
    o = torch.full((b, steps, hv, dv), float("nan"))
    harness.run(
        _ptr(q),
        _ptr(k),
        _ptr(v),
        _ptr(g),
        _ptr(beta),
        _ptr(got_state),
        _ptr(o),
        b,
        t,
        hk,
        hv,
        dk,
        dv,
        ctypes.c_float(scale),
        int(l2norm),
        cols,
        int(vec),
        *extra,
    )
    exact_o, exact_s = ft.gated_delta_exact(q, k, v, g, beta, start, scale, l2norm, **kw)
    o_bound, s_bound = ft.gated_delta_tolerance(
        q, k, v, g, beta, start, scale, l2norm, chunk_size=1, **kw
    )
    assert bool(((o.double() - exact_o).abs() <= o_bound).all()), float(
        (o.double() - exact_o).abs().max()
    )
    assert bool(((got_state.double() - exact_s).abs() <= s_bound).all())


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("hostile", ft.HOSTILE_DECAYS)
@pytest.mark.parametrize("step, b, t", [(False, 2, 40), (True, 1, 8)])
def test_hostile_decays_on_the_host(harness, hostile, step, b, t):
    """The prefill scan, and the decode step token after token (``step``), under hostile decays
    (ft.check_hostile_decays): the recurrence as it stands takes them (exp(-inf) = 0, a NaN
    reaches its token and the later ones only); this holds it there."""
    gen = torch.Generator().manual_seed(21)
    hk, hv, dk, dv = 1, 3, 32, 24
    q, k = torch.randn(b, t, hk, dk, generator=gen), torch.randn(b, t, hk, dk, generator=gen)
    v = torch.randn(b, t, hv, dv, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(b, t, hv, generator=gen))
    beta = torch.sigmoid(torch.randn(b, t, hv, generator=gen))
    state = torch.randn(b, hv, dk, dv, generator=gen) * 0.5
    sizes = (b, 0 if step else t, hk, hv, dk, dv, ctypes.c_float(dk**-0.5), 1)
    # a step's 32 columns a block, its scalar state accesses, no gates, no reset
    plain = (32, 0, None, None, None)

    def run(q, k, v, g, beta, state):
        s, o = state.clone(), torch.full(v.shape, float("nan"))
        if step:  # token after token, the state carried in place
            for i in range(t):
                one = [x[:, i].contiguous() for x in (q, k, v, g, beta)] + [s, o[:, i].contiguous()]
                harness.run(*(_ptr(x) for x in one), *sizes, *plain)
                o[:, i] = one[-1]
        else:
            harness.run(*(_ptr(x) for x in (q, k, v, g, beta, s, o)), *sizes, *plain)
        return o, s

    case = (q, k, v, g, beta, state)
    ft.check_hostile_decays(run, case, hostile, chunk_size=1, name="step" if step else "scan")

"""The gated delta rule's kernels in their own launch forms, each against the exact recurrence
within the derived bound (ftlab.testing.gated_delta_bounds): HIP's decode step at both block
widths, on aligned and unaligned states (GPU); the decode step replayed from a CUDA/HIP graph
(GPU); the Triton prefill with every target's tiles and the chunk-64 prefill with its tile
choices, in the interpreter."""

import pytest
import torch

import ftlab.testing as ft
from ftlab import backends, ops
from ftlab.testing.gated_delta_rule import gated_delta_inputs as _inputs


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [16, 32])
@pytest.mark.parametrize(
    "dk, dv, aligned",
    [(128, 128, True), (128, 128, False), (64, 37, True), (100, 20, True), (32, 200, False)],
)
def test_hip_step_block_widths_gpu(cols, dk, dv, aligned):
    """HIP's decode step at both block widths (16 and 32 state columns a block), on its 16-byte
    state accesses (Dv % 4 == 0, the state aligned) and on its scalar ones (odd Dv, or a state 4
    bytes off 16-byte alignment), partial column blocks included, against the exact step within
    the derived bound (fp32: this is about which state element goes where)."""
    from ftlab.hip import gated_delta_rule as hip_dn

    gen = torch.Generator().manual_seed(dk + dv + cols)
    q, k, v, g, beta, state = _inputs(gen, 3, 1, 2, 4, dk, dv, torch.float32, with_state=True)
    scale = dk**-0.5
    exact_o, exact_s = ft.gated_delta_exact(q, k, v, g, beta, state, scale, True)
    o_bound, s_bound = ft.gated_delta_tolerance(q, k, v, g, beta, state, scale, True, chunk_size=1)
    dev = torch.device("cuda")
    # floats before the state: 32 bytes, or 36 (4 bytes off 16-byte alignment)
    pad = 8 if aligned else 9
    # the slots around the state: never written
    buf = torch.full((pad + state.numel() + 8,), 7.0, device=dev)
    got_s = buf[pad : pad + state.numel()].view(state.shape)
    got_s.copy_(state)
    assert (got_s.data_ptr() % 16 == 0) == aligned
    o = hip_dn.gated_delta_step(
        *(x[:, 0].to(dev) for x in (q, k, v, g, beta)), got_s, scale, True, cols
    )
    assert bool(((o.cpu().double() - exact_o[:, 0]).abs() <= o_bound[:, 0]).all())
    assert bool(((got_s.cpu().double() - exact_s).abs() <= s_bound).all())
    assert bool((buf[:pad] == 7.0).all()) and bool((buf[pad + state.numel() :] == 7.0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "hip"])
def test_gated_delta_step_graph_replays(backend):
    """The decode step captured in a CUDA/HIP graph replays to the eager result, the state
    advancing in place on every replay, for new inputs written into the captured buffers."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(2)
    q, k, v, g, beta, state = (
        x.to(dev) for x in _inputs(gen, 2, 1, 16, 32, 128, 128, torch.bfloat16, with_state=True)
    )
    q, k, v, g, beta = q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0]
    eager_state = state.clone()

    def step(s):
        return ops.gated_delta_step(q, k, v, g, beta, s, backend=backend)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(state.clone())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(state)
    state.copy_(eager_state)
    for _ in range(4):
        for x in (q, k, v):
            x.copy_(torch.randn(x.shape, generator=gen).to(x.dtype).to(dev))
        graph.replay()
        want = step(eager_state)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        torch.testing.assert_close(state, eager_state, rtol=0, atol=0)


@pytest.mark.parametrize("target", ["sm_90", "gfx942", "gfx1100"])
def test_triton_prefill_every_target_config(monkeypatch, target):
    """The Triton prefill with each target's tiles (head dimensions and state columns a program
    not dividing Dk / Dv, chunks past T), on the CPU: the configurations the GPUs launch."""
    if "triton" not in backends.available_backends(
        "gated_delta_rule", torch.device("cpu"), torch.float32
    ):
        pytest.skip("Triton's interpreter is off in this process")
    from ftlab.triton import gated_delta_rule_chunk

    monkeypatch.setitem(
        gated_delta_rule_chunk.CONFIGS, "default", gated_delta_rule_chunk.CONFIGS[target]
    )
    gen = torch.Generator().manual_seed(5)
    q, k, v, g, beta, state = _inputs(gen, 1, 70, 2, 4, 48, 40, torch.bfloat16, with_state=True)
    ft.check_gated_delta_rule_case(q, k, v, g, beta, state, chunk_size=32, backends=["triton"])


@pytest.mark.parametrize(
    "dims, config",
    [
        ((1, 130, 2, 4, 128, 128), {}),
        (
            (2, 70, 1, 2, 128, 40),
            {"SCAN_NQ": 4, "SCAN_BV": 16, "WY_BS": 32, "OUT_BS": 32, "OUT_BV": 32},
        ),
        ((1, 64, 2, 2, 48, 72), {"SCAN_NQ": 1, "INV_BS": 16}),
        ((1, 129, 1, 1, 16, 16), {}),
    ],
)
def test_triton_chunk64_configs(monkeypatch, dims, config):
    """The chunk-64 Triton prefill (ftlab.triton.gated_delta_rule_chunk64) in the interpreter with
    its tile choices: the state in one, two or four blocks of key rows, head dimensions not powers
    of two, chunks past T, Dk = 128 as the models have it; slow decays, so that the state carried
    from chunk to chunk weighs in the output."""
    if "triton" not in backends.available_backends(
        "gated_delta_rule", torch.device("cpu"), torch.float32
    ):
        pytest.skip("Triton's interpreter is off in this process")
    from ftlab.triton import gated_delta_rule_chunk64

    monkeypatch.setitem(
        gated_delta_rule_chunk64.CONFIGS,
        "default",
        {**gated_delta_rule_chunk64.CONFIGS["default"], **config},
    )
    b, t, hk, hv, dk, dv = dims
    gen = torch.Generator().manual_seed(t + dk)
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v, g, beta, state = _inputs(
            gen, b, t, hk, hv, dk, dv, dtype, with_state=dtype == torch.float32, decay=0.01
        )
        ft.check_gated_delta_rule_case(q, k, v, g, beta, state, chunk_size=64, backends=["triton"])

"""Routed MoE (docs/OPS.md section 3): the reference's contract, checked by properties, and the
router / align kernels against it (Triton so far; the expert kernels and HIP have not landed).
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import backends, ops
from ftlab.reference.moe import align_capacity
from ftlab.testing.moe import check_invalid_ids_read_nothing


@st.composite
def routing(draw):
    t = draw(st.sampled_from([1, 2, 5, 64, 300]))
    e = draw(st.sampled_from([8, 60, 128]))
    k = draw(st.sampled_from([1, 2, 8]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    kind = draw(st.sampled_from(["random", "ties", "one-expert", "invalid"]))
    logits = torch.randn(t, e, generator=gen)
    if kind == "ties":
        logits = torch.randint(0, 3, (t, e), generator=gen).float()  # many equal logits
    if kind == "one-expert":
        logits[:, 3] = 50.0
    weights, ids = ops.route_topk(logits, k)
    if kind == "invalid":
        ids = ids.clone()
        ids[torch.rand(ids.shape, generator=gen) < 0.3] = -1
        ids[torch.rand(ids.shape, generator=gen) < 0.05] = e + 7
    return logits, weights, ids, e, k


@given(routing())
def test_route_topk_contract(case):
    logits, weights, ids, e, k = case
    probs = torch.softmax(logits.float(), -1)
    w, i = ops.route_topk(logits, k)
    assert i.dtype == torch.int32 and w.dtype == torch.float32
    torch.testing.assert_close(w.sum(-1), torch.ones(len(w)), rtol=0, atol=1e-6)
    chosen = probs.gather(1, i.long())
    assert bool((chosen[:, :-1] >= chosen[:, 1:]).all()), "best first"
    kth = chosen[:, -1:]
    assert bool(((probs > kth).sum(-1) <= k - 1).all()), "no better expert left out"
    # ties: among equal probabilities the lower ids are taken, in ascending order
    for t in range(len(i)):
        for j in range(k - 1):
            if chosen[t, j] == chosen[t, j + 1]:
                assert i[t, j] < i[t, j + 1]
        left_out = [x for x in range(e) if x not in i[t].tolist() and probs[t, x] == kth[t, 0]]
        assert all(x > int(i[t, -1]) for x in left_out), "a tie went to a higher id"
    raw, _ = ops.route_topk(logits, k, renormalize=False)
    torch.testing.assert_close(raw, chosen)


def test_route_topk_ties_by_example():
    w, i = ops.route_topk(torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0]]), 2)
    assert i.tolist() == [[1, 2]] and torch.allclose(w, torch.tensor([[0.5, 0.5]]))


@given(routing(), st.sampled_from([1, 4, 16, 64]))
def test_moe_align_invariants(case, block_m):
    _, _, ids, e, k = case
    t = ids.shape[0]
    sorted_ids, expert_ids, post = ops.moe_align(ids, e, block_m)
    total = int(post[0])
    flat = ids.flatten().long()
    valid = ((flat >= 0) & (flat < e)).nonzero().flatten()
    assert sorted_ids.numel() == align_capacity(t * k, e, block_m)
    assert total % block_m == 0 and total <= sorted_ids.numel()
    rows = sorted_ids[:total].long()
    real = rows[rows != t * k]
    assert sorted(real.tolist()) == valid.tolist(), "every valid (token, slot) exactly once"
    assert bool((sorted_ids[total:] == t * k).all()), "sentinel past the end"
    assert bool((expert_ids[total // block_m :] == -1).all())
    for b in range(total // block_m):
        block = rows[b * block_m : (b + 1) * block_m]
        members = block[block != t * k]
        assert members.numel() > 0, "no all-padding blocks"
        assert bool((flat[members] == int(expert_ids[b])).all()), "a block holds one expert's pairs"
        assert members.tolist() == sorted(members.tolist()), "flat order within a group"
    used = expert_ids[: total // block_m].tolist()
    assert used == sorted(used), "groups in expert order"
    assert set(used) == set(flat[valid].tolist()), "experts with no tokens take no rows"


def vectorized_experts(x, w_gate_up, w_down, weights, ids):
    """An independent formulation: gather every slot's expert weights at once."""
    e = w_gate_up.shape[0]
    ok = (ids >= 0) & (ids < e)
    safe = ids.long().clamp(0, e - 1)
    gu = torch.einsum("th,tknh->tkn", x.float(), w_gate_up.float()[safe])
    inter = w_down.shape[-1]
    h = F.silu(gu[..., :inter]) * gu[..., inter:]
    y = torch.einsum("tki,tkhi->tkh", h, w_down.float()[safe])
    return (y * (weights * ok)[..., None]).sum(1)


@settings(max_examples=20)
@given(routing(), st.sampled_from([torch.float32, torch.bfloat16]), st.integers(0, 2**31 - 1))
def test_moe_experts_matches_vectorized(case, dtype, seed):
    logits, weights, ids, e, k = case
    if ids.shape[0] > 64:
        ids, weights = ids[:64], weights[:64]
    t = ids.shape[0]
    gen = torch.Generator().manual_seed(seed)
    h, inter = 64, 32
    x = torch.randn(t, h, generator=gen).to(dtype)
    w_gate_up = (torch.randn(e, 2 * inter, h, generator=gen) * 0.1).to(dtype)
    w_down = (torch.randn(e, h, inter, generator=gen) * 0.1).to(dtype)
    got = ops.moe_experts(x, w_gate_up, w_down, weights, ids)
    want = vectorized_experts(x, w_gate_up, w_down, weights, ids)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


def test_invalid_ids_contribute_nothing_and_read_nothing():
    """-1 and >= E slots add nothing; the expert they would name could hold NaN."""
    x = torch.randn(3, 32)
    w_gate_up = torch.randn(4, 16, 32) * 0.1
    w_down = torch.randn(4, 32, 8) * 0.1
    ids = torch.tensor([[0, -1], [4, 1], [-1, -1]], dtype=torch.int32)
    weights = torch.full((3, 2), 0.5)
    w_nan_up, w_nan_down = w_gate_up.clone(), w_down.clone()
    w_nan_up[2:], w_nan_down[2:] = float("nan"), float("nan")  # experts 2, 3: never named
    y = ops.moe_experts(x, w_nan_up, w_nan_down, weights, ids)
    assert torch.isfinite(y).all() and bool((y[2] == 0).all())
    only_valid = ops.moe_experts(
        x,
        w_gate_up,
        w_down,
        weights,
        torch.tensor([[0, 0], [1, 1], [0, 0]]).int(),
    )
    assert not torch.equal(y, only_valid)


def _small_q4_0_layer(seed: int, gu_scale: float, dn_scale: float):
    """x [4, 64], Q4_0 banks of 8 experts [8, 64, 64] and [8, 64, 32] (random values times the
    scales) and a top-2 routing: (x, gu, dn, weights, ids)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 64, generator=gen)
    gu = ops.quantize_q4_0(torch.randn(8, 64, 64, generator=gen) * gu_scale)
    dn = ops.quantize_q4_0(torch.randn(8, 64, 32, generator=gen) * dn_scale)
    return (x, gu, dn, *ops.route_topk(torch.randn(4, 8, generator=gen), 2))


def test_q4_0_banks_dequant_path_equals_dense_dequantized():
    x, gu, dn, weights, ids = _small_q4_0_layer(0, 0.1, 0.1)
    q = ops.moe_experts(x, gu, dn, weights, ids, path="dequant")
    dense = ops.moe_experts(x, ops.dequantize_q4_0(gu), ops.dequantize_q4_0(dn), weights, ids)
    torch.testing.assert_close(q, dense, rtol=1e-6, atol=1e-6)
    int8 = ops.moe_experts(x, gu, dn, weights, ids, path="int8")
    torch.testing.assert_close(int8, dense, rtol=0.05, atol=0.02)  # Q8_1 rounding of x and h


def test_fused_moe_is_route_then_experts():
    gen = torch.Generator().manual_seed(1)
    x, logits = torch.randn(6, 32, generator=gen), torch.randn(6, 8, generator=gen)
    gu, dn = (
        torch.randn(8, 32, 32, generator=gen) * 0.1,
        torch.randn(8, 32, 16, generator=gen) * 0.1,
    )
    w, i = ops.route_topk(logits, 2, renormalize=False)
    torch.testing.assert_close(
        ops.fused_moe(x, logits, gu, dn, 2, renormalize=False), ops.moe_experts(x, gu, dn, w, i)
    )


def _experts_with(**given):
    """ops.moe_experts of x [2, 32], banks [4, 16, 32] and [4, 32, 8], weights and ids [2, 1], with
    the arguments ``given`` in their place."""
    args = {
        "x": torch.randn(2, 32),
        "w_gate_up": torch.randn(4, 16, 32),
        "w_down": torch.randn(4, 32, 8),
        "topk_weights": torch.ones(2, 1),
        "topk_ids": torch.zeros(2, 1, dtype=torch.int32),
    }
    return ops.moe_experts(*{**args, **given}.values())


BAD = [
    ("top_k 0", lambda: ops.route_topk(torch.randn(2, 8), 0), ValueError, "top_k must be"),
    ("top_k > E", lambda: ops.route_topk(torch.randn(2, 8), 9), ValueError, r"\[1, 8\]"),
    (
        "logits int",
        lambda: ops.route_topk(torch.zeros(2, 8, dtype=torch.int32), 1),
        TypeError,
        "logits must be",
    ),
    ("align float ids", lambda: ops.moe_align(torch.zeros(2, 2), 8, 4), TypeError, "ids must be"),
    (
        "align block_m",
        lambda: ops.moe_align(torch.zeros(2, 2, dtype=torch.int32), 8, 0),
        ValueError,
        "block_m",
    ),
    (
        "bank shapes",
        lambda: _experts_with(w_down=torch.randn(4, 32, 9)),
        ValueError,
        "banks must be",
    ),
    (
        "weights dtype",
        lambda: _experts_with(topk_weights=torch.ones(2, 1).half()),
        TypeError,
        "topk_weights must be float32",
    ),
    (
        "ids rows",
        lambda: _experts_with(
            topk_weights=torch.ones(3, 1), topk_ids=torch.zeros(3, 1, dtype=torch.int32)
        ),
        ValueError,
        "T = 2",
    ),
]


@pytest.mark.parametrize("label, call, exc, msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input(label, call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


# ------------------------------------------------------------------ kernels vs reference


@given(routing(), st.booleans(), st.sampled_from([torch.float32, torch.bfloat16]))
def test_route_backends_cpu(case, renormalize, dtype):
    logits, _, _, _, k = case
    ft.check_route_case(logits.to(dtype), k, renormalize, "cpu")


@given(routing(), st.sampled_from([1, 4, 16, 64]))
def test_align_backends_cpu(case, block_m):
    _, _, ids, e, _ = case
    ft.check_align_case(ids, e, block_m, "cpu")


@pytest.mark.gpu
@given(routing(), st.booleans(), st.sampled_from([torch.float32, torch.bfloat16]))
def test_route_gpu(case, renormalize, dtype):
    logits, _, _, _, k = case
    ft.check_route_case(logits.to(dtype), k, renormalize, "cuda")


@pytest.mark.gpu
@given(routing(), st.sampled_from([1, 4, 16, 64]))
def test_align_gpu(case, block_m):
    _, _, ids, e, _ = case
    ft.check_align_case(ids, e, block_m, "cuda")


@st.composite
def expert_cases(draw, max_tokens: int = 64, min_tokens: int = 1):
    logits, weights, ids, e, k = draw(routing())
    ids, weights = ids[:max_tokens], weights[:max_tokens]
    if ids.shape[0] < min_tokens:  # more tokens, with the same routing repeated
        reps = -(-min_tokens // ids.shape[0])
        ids, weights = ids.repeat(reps, 1)[:min_tokens], weights.repeat(reps, 1)[:min_tokens]
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    h = 32 * draw(st.sampled_from([1, 3, 5]))
    inter = 32 * draw(st.sampled_from([1, 2, 3]))
    x = torch.randn(ids.shape[0], h, generator=gen).to(dtype)
    gu = torch.randn(e, 2 * inter, h, generator=gen) * h**-0.5
    dn = torch.randn(e, h, inter, generator=gen) * inter**-0.5
    path = draw(st.sampled_from(["auto", "dequant", "int8"]))
    if draw(st.booleans()):
        return x, ops.quantize_q4_0(gu), ops.quantize_q4_0(dn), weights, ids, path
    return x, gu.to(dtype), dn.to(dtype), weights, ids, path


@settings(max_examples=15)
@given(expert_cases(max_tokens=6))  # the interpreter runs every program in Python
def test_experts_backends_cpu(case):
    ft.check_experts_case(*case, device="cpu", backends=["reference", "triton"])


@settings(max_examples=8)
@given(expert_cases(max_tokens=24, min_tokens=9))  # past DECODE_MAX_TOKENS: the grouped GEMM
def test_experts_prefill_backends_cpu(case):
    from ftlab.backends import DECODE_MAX_TOKENS

    assert case[0].shape[0] > DECODE_MAX_TOKENS
    ft.check_experts_case(*case, device="cpu", backends=["reference", "triton"])


def test_experts_tolerance_catches_a_wrong_slot_weight():
    """The bound is tight enough to fail a kernel that mixes up two slots' weights."""
    x, gu, dn, weights, ids = _small_q4_0_layer(3, 0.125, 0.18)
    for path in ("int8", "dequant"):
        good = ops.moe_experts(x, gu, dn, weights, ids, path=path)
        swapped = ops.moe_experts(x, gu, dn, weights.flip(1), ids, path=path)
        bound = ft.experts_tolerance(x, gu, dn, weights, ids, path)
        assert bool(((swapped - good).abs() > bound).any())
        assert float(bound.max()) < 0.05 * float(good.abs().max()), path


def test_triton_experts_read_no_memory_for_invalid_ids():
    check_invalid_ids_read_nothing("triton")


@pytest.mark.gpu
@settings(max_examples=60)
@given(expert_cases(max_tokens=300))
def test_experts_gpu(case):
    ft.check_experts_case(*case, device="cuda")


@st.composite
def wide_expert_cases(draw):
    """Decode cases whose Q4_0 rows are whole superblocks (H and I multiples of 256), where
    hip's decode experts read their weights in regions: H of 1, 3, 8 or 9 superblocks (up to 8:
    linear regions of whole packed rows, 8 as Qwen3-30B-A3B's 2048; 9: a second, partial K-step
    of the gate/up regions), I of 1, 3 or 5 (up to 4 linear; 5: two K-steps of the down
    regions), top-k past the block's 8 groups (10, 20), invalid slots."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(draw(st.integers(0, 2**31 - 1)))
    t = draw(st.sampled_from([1, 2, 5, 8]))
    e = draw(st.sampled_from([4, 12]))
    k = draw(st.sampled_from([1, 3, 8, 10, 20]))
    h = 256 * draw(st.sampled_from([1, 3, 8, 9]))
    # k * I <= 8192
    inter = 256 * draw(st.sampled_from([n for n in (1, 3, 5) if k * 256 * n <= 8192]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    x = torch.randn(t, h, device=dev, generator=gen).to(dtype)
    gu = ops.quantize_q4_0(torch.randn(e, 2 * inter, h, device=dev, generator=gen) * h**-0.5)
    dn = ops.quantize_q4_0(torch.randn(e, h, inter, device=dev, generator=gen) * inter**-0.5)
    # -1, e, e + 1 invalid
    ids = torch.randint(-1, e + 2, (t, k), device=dev, generator=gen, dtype=torch.int32)
    weights = torch.rand(t, k, device=dev, generator=gen)
    return x, gu, dn, weights, ids, "int8"


@pytest.mark.gpu
@settings(max_examples=60, deadline=None)
@given(wide_expert_cases())
def test_experts_wide_rows_gpu(case):
    ft.check_experts_case(*case, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "hip"])
@pytest.mark.parametrize("dims", [(64, 64), (256, 256)])  # (256, 256): hip's region kernels
def test_invalid_ids_read_nothing_gpu(backend, dims):
    check_invalid_ids_read_nothing(backend, "cuda", dims)


def check_no_slots_give_zeros(device: str) -> None:
    """top_k = 0 (topk_ids [T, 0]): y is an empty sum, zeros, on every backend, Q4_0 (whole
    superblock rows: hip's region kernels) and dense banks."""
    dev = torch.device(device)
    x = torch.randn(3, 256, device=dev).bfloat16()
    q4 = tuple(ops.quantize_q4_0(torch.randn(4, n, 256, device=dev)) for n in (512, 256))
    dense = (
        torch.randn(4, 512, 256, device=dev).bfloat16(),
        torch.randn(4, 256, 256, device=dev).bfloat16(),
    )
    ids, wts = torch.zeros(3, 0, dtype=torch.int32, device=dev), torch.zeros(3, 0, device=dev)
    for backend in backends.available_backends("moe_experts", dev, x.dtype):
        for gu, dn in (q4, dense):
            for t in (1, 3):
                y = ops.moe_experts(x[:t], gu, dn, wts[:t], ids[:t], backend=backend)
                assert y.shape == (t, 256) and y.dtype == x.dtype and not y.any(), (
                    backend,
                    type(gu).__name__,
                    t,
                )


def test_no_slots_give_zeros_cpu():
    check_no_slots_give_zeros("cpu")


@pytest.mark.gpu
def test_no_slots_give_zeros_gpu():
    check_no_slots_give_zeros("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "hip"])
@pytest.mark.parametrize("tokens", [1, 4, 64])
@pytest.mark.parametrize("q4", [True, False, "Q4_K_M", "Q4_0 wide"])
def test_fused_moe_graph_replay_gpu(backend, tokens, q4):
    """fused_moe captured in a CUDA graph (router, align, experts: no host synchronization)
    replays to the eager result, for new inputs written into the captured buffers. "Q4_0 wide":
    I = 256, whole-superblock rows (hip's region kernels at decode), and three calls chained in
    one graph, each on the last one's output, as a model's layers reuse the workspace."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(tokens)
    # Q6_K down: 256-blocks
    e, k, h, inter = (
        16,
        4,
        256,
        256 if q4 in ("Q4_K_M", "Q4_0 wide") else 128,
    )
    gu = torch.randn(e, 2 * inter, h, device=dev, generator=gen) * h**-0.5
    dn = torch.randn(e, h, inter, device=dev, generator=gen) * inter**-0.5
    gu, dn = (
        (ops.quantize_q4_0(gu), ops.quantize_q4_0(dn)) if q4 else (gu.bfloat16(), dn.bfloat16())
    )
    if q4 == "Q4_K_M":  # Q4_K gate/up, Q6_K down: the K-quant kernels
        gu = ft.random_quant_bank(1, "Q4_K", e, 2 * inter, h, magnitude=4 * h**-0.5).to(dev)
        dn = ft.random_quant_bank(2, "Q6_K", e, h, inter, magnitude=4 * inter**-0.5).to(dev)
    x = torch.randn(tokens, h, device=dev, generator=gen, dtype=torch.bfloat16)
    logits = torch.randn(tokens, e, device=dev, generator=gen)

    def step():
        y = ops.fused_moe(x, logits, gu, dn, k, backend=backend)
        for _ in range(2 if q4 == "Q4_0 wide" else 0):
            y = ops.fused_moe(y, logits, gu, dn, k, backend=backend)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(5):
        x.copy_(torch.randn(x.shape, device=dev, generator=gen))
        logits.copy_(torch.randn(logits.shape, device=dev, generator=gen))
        graph.replay()
        torch.testing.assert_close(out, step(), rtol=0, atol=0)

"""Careless and hostile arguments to the ops, as a new user tried them: each one is either
computed correctly by every backend or refused before anything is written, with a message
naming the argument."""

import pytest
import torch

from ftlab import ops

CPU_BACKENDS = ["reference", "triton"]  # triton: its CPU interpreter (tests/conftest.py)


# the GPU cases carry the gpu marker: skipped without a GPU, run by `pytest -m gpu`
CASES = [("cpu", b) for b in CPU_BACKENDS] + [
    pytest.param("cuda", b, marks=pytest.mark.gpu, id=f"cuda-{b}")
    for b in ("reference", "triton", "hip")
]


@pytest.mark.parametrize("device, backend", CASES)
def test_index_honours_the_indices_stride(device, backend):
    """A strided index vector (every other row) reads the rows it names, not the first ones."""
    w = torch.arange(40, dtype=torch.float32, device=device).view(10, 4)
    idx = torch.arange(10, device=device)[::2]
    assert torch.equal(ops.index(w, idx, backend=backend), w[[0, 2, 4, 6, 8]])
    idx32 = torch.arange(10, dtype=torch.int32, device=device).flip(0)[::3]  # 9, 6, 3, 0
    assert torch.equal(ops.index(w, idx32, backend=backend), w[[9, 6, 3, 0]])


@pytest.mark.parametrize("device, backend", CASES)
def test_store_honours_the_indices_stride(device, backend):
    kc, vc = torch.zeros(8, 4, device=device), torch.zeros(8, 4, device=device)
    k = torch.arange(12, dtype=torch.float32, device=device).view(3, 4)
    slots = torch.tensor([7, -5, 1, -5, 4], device=device)[::2]  # 7, 1, 4
    ops.store(kc, vc, slots, k, -k, backend=backend)
    want = torch.zeros(8, 4, device=device)
    want[[7, 1, 4]] = k
    assert torch.equal(kc, want) and torch.equal(vc, -want)


@pytest.mark.parametrize("device, backend", CASES)
def test_qk_norm_rope_cache_honours_the_slots_stride(device, backend):
    """qk_norm_rope writing the KV cache through a strided slot vector writes the slots it names,
    the rows of v (a strided view of a wider tensor) and k_out, and nothing else."""
    q, k = torch.randn(3, 2, 8, device=device), torch.randn(3, 1, 8, device=device)
    v = torch.randn(3, 12, device=device)[:, 2:10]
    w, cos = torch.ones(8, device=device), torch.ones(3, 8, device=device)
    kc, vc = torch.zeros(8, 8, device=device), torch.zeros(8, 8, device=device)
    slots = torch.tensor([7, -5, 1, -5, 4], device=device)[::2]  # 7, 1, 4
    _, k_out = ops.qk_norm_rope(
        q, k, w, w, cos, 0 * cos, 1e-6, k_cache=kc, v_cache=vc, slots=slots, v=v, backend=backend
    )
    want_k, want_v = torch.zeros(8, 8, device=device), torch.zeros(8, 8, device=device)
    want_k[[7, 1, 4]], want_v[[7, 1, 4]] = k_out.reshape(3, 8), v
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


@pytest.mark.parametrize("device, backend", CASES)
def test_a_refused_store_writes_nothing(device, backend):
    kc, vc = torch.randn(8, 4, device=device), torch.randn(8, 4, device=device)
    before = kc.clone(), vc.clone()
    k = torch.ones(3, 4, device=device)
    for slots, exc in (
        (torch.tensor([1, 1, 2]), ValueError),
        (torch.tensor([1, 9, 2]), IndexError),
    ):
        with pytest.raises(exc, match="indices"):
            ops.store(kc, vc, slots.to(device), k, k, backend=backend)
        assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def _banks(e=4, h=64, inter=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(e, 2 * inter, h, generator=gen) * 0.1, torch.randn(
        e, h, inter, generator=gen
    ) * 0.1


@pytest.mark.parametrize("device, backend", CASES)
def test_mixed_q4_0_and_dense_banks_are_refused(device, backend):
    gu, dn = _banks()
    x = torch.randn(2, 64, device=device)
    w, ids = torch.full((2, 2), 0.5, device=device), torch.tensor([[0, 1], [2, 3]], device=device)
    q_gu, q_dn = ops.quantize_q4_0(gu).to(device), ops.quantize_q4_0(dn).to(device)
    for a, b in ((q_gu, dn.to(device)), (gu.to(device), q_dn)):
        with pytest.raises(
            TypeError, match="w_gate_up and w_down must both be QuantWeight banks or both dense"
        ):
            ops.moe_experts(x, a, b, w, ids, backend=backend)


@pytest.mark.parametrize("device, backend", CASES)
def test_int64_ids_do_not_wrap_into_valid_experts(device, backend):
    """2**32 + 1 is no expert: truncated to int32 it would be expert 1."""
    gu, dn = _banks()
    x = torch.randn(2, 64, device=device)
    w = torch.full((2, 2), 0.5, device=device)
    far = torch.tensor([[2**32 + 1, 0], [-(2**32) + 2, 3]], device=device)
    near = torch.tensor([[-1, 0], [-1, 3]], device=device)
    got = ops.moe_experts(x, gu.to(device), dn.to(device), w, far, backend=backend)
    want = ops.moe_experts(x, gu.to(device), dn.to(device), w, near, backend=backend)
    assert torch.equal(got, want)
    sorted_ids, _, npad = ops.moe_align(far, 4, 16, backend=backend)
    assert int(npad) == 32 and set(sorted_ids[:32].tolist()) - {4} == {1, 3}


def test_fused_moe_router_logits_must_match_the_banks():
    gu, dn = _banks(e=4)
    x = torch.randn(3, 64)
    with pytest.raises(
        ValueError, match=r"router_logits must be \[T, E\] = \[3, 4\].*got \(3, 6\)"
    ):
        ops.fused_moe(x, torch.randn(3, 6), gu, dn, 2)
    with pytest.raises(
        ValueError, match=r"router_logits must be \[T, E\] = \[3, 4\].*got \(2, 4\)"
    ):
        ops.fused_moe(x, torch.randn(2, 4), gu, dn, 2)


@pytest.mark.parametrize(
    "eps, exc",
    [
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (-1e-6, ValueError),
        ("1e-6", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_qk_norm_rope_eps_must_be_finite_and_non_negative(eps, exc):
    q, k = torch.randn(2, 4, 8), torch.randn(2, 2, 8)
    ones, table = torch.ones(8), torch.ones(2, 8)
    with pytest.raises(exc, match="eps must be a finite number >= 0.0"):
        ops.qk_norm_rope(q, k, ones, ones, table, table, eps)


@pytest.mark.parametrize("device, backend", CASES)
def test_quantize_refuses_nan_and_matches_gguf_on_infinities(device, backend):
    gguf = pytest.importorskip("gguf")
    w = torch.randn(3, 64)
    w[1, 37] = float("nan")
    with pytest.raises(ValueError, match=r"w must not hold NaN, got NaN at \(1, 37\)"):
        ops.quantize_q4_0(w.to(device), backend=backend)
    w[1, 37] = float("inf")
    w[2, 3] = -float("inf")
    want = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_0)
    got = ops.quantize_q4_0(w.to(device), backend=backend).data.cpu().numpy()
    assert (got == want).all()


@pytest.mark.parametrize(
    "top_k, renormalize, exc, match",
    [
        (True, True, TypeError, "top_k must be an int"),
        (2.0, True, TypeError, "top_k must be an int"),
        (0, True, ValueError, "top_k must be an int"),
        (9, True, ValueError, r"top_k must be an int \[1, 8\]"),
        (2, "yes", TypeError, "renormalize must be a bool"),
    ],
)
def test_route_topk_arguments(top_k, renormalize, exc, match):
    with pytest.raises(exc, match=match):
        ops.route_topk(torch.randn(3, 8), top_k, renormalize)


@pytest.mark.parametrize(
    "num_experts, block_m, exc",
    [(0, 16, ValueError), (True, 16, TypeError), (4, 0, ValueError), (4, 2.0, TypeError)],
)
def test_moe_align_arguments(num_experts, block_m, exc):
    with pytest.raises(exc, match="num_experts|block_m"):
        ops.moe_align(torch.zeros(2, 2, dtype=torch.int32), num_experts, block_m)


def test_index_mask_must_be_two_ints():
    w = torch.zeros(4, 8)
    for mask in ((0, True), (0,), "ab", (0.0, 2)):
        with pytest.raises(TypeError, match="mask must be a pair of ints"):
            ops.index(w, torch.tensor([0]), mask=mask)


def test_path_choices_are_named():
    w = ops.quantize_q4_0(torch.randn(8, 32))
    with pytest.raises(
        ValueError, match=r"path must be 'auto' or one of \('int8', 'dequant'\), got 'fp8'"
    ):
        ops.q4_0_matmul(torch.randn(1, 32), w, path="fp8")
    gu, dn = _banks()
    with pytest.raises(ValueError, match="path must be 'auto' or one of"):
        ops.moe_experts(
            torch.randn(1, 64),
            gu,
            dn,
            torch.ones(1, 1),
            torch.zeros(1, 1, dtype=torch.int32),
            path="x",
        )

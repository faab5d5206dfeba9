"""Routed MoE experts on Q8_0 and K-quant banks (docs/OPS.md section 3): the native CPU kernels,
the Triton int8 matvecs and dequant GEMMs (the 64-weight steps and the weight-at-a-time tiles) and
the reference's two paths, each against the reference within ``ftlab.testing``'s bounds."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import backends, ops
from ftlab.backends import BackendUnavailable, calls
from ftlab.jit import cpu_unavailable_reason

#: (gate_up, down) bank types: Q4_K_M's two mixes, the others alone, and Q4_0 beside a K-quant
KQUANT_PAIRS = [
    ("Q4_K", "Q6_K"),
    ("Q4_K", "Q4_K"),
    ("Q6_K", "Q6_K"),
    ("Q8_0", "Q8_0"),
    ("Q5_K", "Q6_K"),
    ("Q4_0", "Q6_K"),
]


@st.composite
def kquant_expert_cases(draw, tokens=(1, 3, 9)):
    """Small K-quant / Q8_0 banks (H and I multiples of 256, E <= 4) and a routing of T tokens."""
    gate, down = draw(st.sampled_from(KQUANT_PAIRS))
    e, t = draw(st.integers(1, 4)), draw(st.sampled_from(list(tokens)))
    k = draw(st.integers(1, min(e, 2)))
    h, inter = (256 * draw(st.sampled_from([1, 2])) for _ in range(2))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    weights, ids = ops.route_topk(torch.randn(t, e, generator=gen), k)
    ids[torch.rand(ids.shape, generator=gen) < 0.2] = -1
    x = torch.randn(t, h, generator=gen) * draw(st.sampled_from([1.0, 0.05, 8.0]))
    x = x.to(draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16])))
    if gate == "Q4_0":
        gu = ops.quantize_q4_0(torch.randn(e, 2 * inter, h, generator=gen) * h**-0.5)
    else:
        gu = ft.random_quant_bank(seed, gate, e, 2 * inter, h, magnitude=4 * h**-0.5)
    dn = ft.random_quant_bank(seed + 7, down, e, h, inter, magnitude=4 * inter**-0.5)
    return x, gu, dn, weights, ids, draw(st.sampled_from(["auto", "int8"]))


@pytest.mark.skipif(cpu_unavailable_reason() is not None, reason=str(cpu_unavailable_reason()))
@settings(max_examples=12, deadline=None)
@given(kquant_expert_cases())
def test_kquant_experts_backends_cpu(case):
    """The native CPU kernels (the hybrid's) against the reference on K-quant / Q8_0 banks."""
    ft.check_experts_case(*case, device="cpu", backends=["reference", "cpu"])


@settings(max_examples=2, deadline=None)
@given(kquant_expert_cases(tokens=(1, 3)))
def test_kquant_experts_triton_cpu(case):
    """The Triton K-quant expert kernels (under the interpreter) against the reference."""
    ft.check_experts_case(*case, device="cpu", backends=["triton"])


@pytest.mark.parametrize("gate, down", [("Q4_K", "Q6_K"), ("Q5_K", "Q8_0"), ("Q4_0", "Q6_K")])
def test_kquant_experts_triton_each_type_cpu(gate, down):
    """Every type's branch of the Triton kernels (one dot, one tile for both kernels) at least
    once, int8 matvecs and the dequant GEMM: a token of top-2 over 2 experts, and a token with one
    slot invalid."""
    gen = torch.Generator().manual_seed(len(gate + down))
    x = torch.randn(2, 256, generator=gen)
    weights, ids = ops.route_topk(torch.randn(2, 2, generator=gen), 2)
    ids[1, 0] = -1
    gu = (
        ops.quantize_q4_0(torch.randn(2, 512, 256, generator=gen) / 16)
        if gate == "Q4_0"
        else ft.random_quant_bank(1, gate, 2, 512, 256, magnitude=0.25)
    )
    dn = ft.random_quant_bank(2, down, 2, 256, 256, magnitude=0.25)
    for path in ("int8", "dequant"):
        ft.check_experts_case(x, gu, dn, weights, ids, path, device="cpu", backends=["triton"])


@pytest.mark.parametrize(
    "gate, down, h, dtype",
    [
        ("Q4_K", "Q6_K", 256, torch.float16),
        ("Q5_K", "Q4_K", 256, torch.float32),
        ("Q6_K", "Q5_K", 256, torch.float32),
        ("Q8_0", "Q8_0", 96, torch.float16),
    ],
)
def test_kquant_gemm_tiles_cpu(gate, down, h, dtype):
    """The dequant GEMM's 64-weight steps (two 32-column halves a step) over several row blocks,
    column blocks and experts: every K-quant half (Q4_K / Q5_K low and high nibbles, Q6_K's four
    quarters, Q8_0 with K % 64 == 32 ending in a half step), 16-bit and fp32 operands."""
    gen = torch.Generator().manual_seed(len(gate) + h)
    t, e, k, inter = 40, 3, 2, 256
    weights, ids = ops.route_topk(torch.randn(t, e, generator=gen), k)
    ids[5, 1] = -1
    x = torch.randn(t, h, generator=gen).to(dtype)
    gu = ft.random_quant_bank(3, gate, e, 2 * inter, h, magnitude=4 * h**-0.5)
    dn = ft.random_quant_bank(4, down, e, h, inter, magnitude=4 * inter**-0.5)
    import ftlab.triton.moe_kquant_gemm as mk

    dt = torch.float32 if dtype == torch.bfloat16 else dtype  # the interpreter's operands
    assert all(mk.kq_gemm_config(dt, q, None, g)["PAIRS"] for q, g in ((gate, True), (down, False)))
    ft.check_experts_case(x, gu, dn, weights, ids, "dequant", device="cpu", backends=["triton"])


@pytest.mark.parametrize("pairs", [True, False])
def test_kquant_gemm_configs_cpu(pairs):
    """experts_kquant_gemm with explicit tiles: 64-weight steps at BLOCK_N 64 over N = 96 (a
    partial column block in the down GEMM; a Q4_0 bank's blocks with K % 64 == 32), and the
    weight-at-a-time tiles (RDNA's) on the same banks, all within the bound of the reference."""
    import ftlab.triton.moe_kquant_gemm as mk

    gen = torch.Generator().manual_seed(17)
    t, e, k, h, inter = 12, 3, 2, 96, 256
    weights, ids = ops.route_topk(torch.randn(t, e, generator=gen), k)
    x = torch.randn(t, h, generator=gen).to(torch.float16)
    gu = ft.random_quant_bank(5, "Q8_0", e, 2 * inter, h, magnitude=4 * h**-0.5)
    dn = ft.random_quant_bank(6, "Q6_K", e, h, inter, magnitude=4 * inter**-0.5)
    cfg = (
        {
            "BLOCK_M": 16,
            "BLOCK_N": 64,
            "BLOCK_K": 64,
            "num_warps": 4,
            "num_stages": 2,
            "PAIRS": True,
        }
        if pairs
        else {
            "BLOCK_M": 16,
            "BLOCK_N": 32,
            "BLOCK_K": 16,
            "num_warps": 4,
            "num_stages": 2,
            "PAIRS": False,
        }
    )
    got = mk.experts_kquant_gemm(
        x, gu, dn, weights.contiguous(), ids.to(torch.int32), configs=[cfg, cfg]
    )
    want = ops.moe_experts(x.float(), gu, dn, weights, ids, path="dequant", backend="reference")
    bound = ft.experts_tolerance(x, gu, dn, weights, ids, "dequant", want)
    assert bool(((got.float() - want).abs() <= bound).all())
    # Q4_0 beside Q6_K
    q4 = ops.quantize_q4_0(torch.randn(e, 2 * inter, h, generator=gen) * h**-0.5)
    got = mk.experts_kquant_gemm(
        x, q4, dn, weights.contiguous(), ids.to(torch.int32), configs=[cfg, cfg]
    )
    want = ops.moe_experts(x.float(), q4, dn, weights, ids, path="dequant", backend="reference")
    bound = ft.experts_tolerance(x, q4, dn, weights, ids, "dequant", want)
    assert bool(((got.float() - want).abs() <= bound).all())
    q4d = ops.quantize_q4_0(torch.randn(e, h, inter, generator=gen) * inter**-0.5)  # two Q4_0 banks
    got = mk.experts_kquant_gemm(
        x, q4, q4d, weights.contiguous(), ids.to(torch.int32), configs=[cfg, cfg]
    )
    want = ops.moe_experts(x.float(), q4, q4d, weights, ids, path="dequant", backend="reference")
    bound = ft.experts_tolerance(x, q4, q4d, weights, ids, "dequant", want)
    assert bool(((got.float() - want).abs() <= bound).all())


def test_q4_0_bank_tiles():
    """Q4_0 banks take 64-weight steps only where KQ_GEMM_CONFIGS["q4_0_pairs"] has timed tiles
    (16-bit activations), the weight-at-a-time tiles elsewhere; the archs are the ones where
    auto's prefill plan leaves hip for them, as for the dense GEMM."""
    import ftlab.triton.moe_kquant_gemm as mk
    import ftlab.triton.quant_matmul as tqm

    for arch in mk.KQ_GEMM_CONFIGS["q4_0_pairs"]:
        assert mk.q4_0_pairs(torch.bfloat16, arch) and not mk.q4_0_pairs(torch.float32, arch)
        for gated in (True, False):
            cfg = mk.kq_gemm_config(torch.float16, "Q4_0", arch, gated)
            assert cfg["PAIRS"] and cfg["BLOCK_K"] == 64
    for arch in (None, "gfx1100", "sm_80"):
        assert not mk.q4_0_pairs(torch.bfloat16, arch)
        assert not mk.kq_gemm_config(torch.float16, "Q4_0", arch, True)["PAIRS"]
    from ftlab.platform import ARCHS, platform_from_arch

    call = backends.Call("cuda", 0, torch.bfloat16, (512, 2048, 768, 128, 8), "Q4_0", "Q4_0")
    archs = {
        a
        for a in ARCHS
        if backends.plan("moe_experts", call, path="auto", platform=platform_from_arch(a)).backend
        == "triton"
    }
    assert archs == set(mk.KQ_GEMM_CONFIGS["q4_0_pairs"]) == set(tqm.GEMM_CONFIGS["q4_0"])


@settings(max_examples=4, deadline=None)
@given(kquant_expert_cases(tokens=(1, 3)))
def test_kquant_reference_paths(case):
    """dequant is the dense reference on the dequantized banks; int8 within Q8_1 rounding of it."""
    x, gu, dn, w, ids, _ = case
    dense = ops.moe_experts(x.float(), ops.dequantize(gu), ops.dequantize(dn), w, ids)
    deq = ops.moe_experts(x.float(), gu, dn, w, ids, path="dequant", backend="reference")
    torch.testing.assert_close(deq, dense, rtol=0, atol=0)
    int8 = ops.moe_experts(x.float(), gu, dn, w, ids, path="int8", backend="reference")
    scale = float(dense.abs().max()) + 1e-30
    assert float((int8 - dense).abs().max()) <= 0.05 * scale


def test_kquant_banks_on_backends_without_them():
    gu = ft.random_quant_bank(0, "Q4_K", 2, 512, 256)
    dn = ft.random_quant_bank(1, "Q6_K", 2, 256, 256)
    x, w, ids = torch.randn(1, 256), torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(BackendUnavailable, match="cannot serve"):
        ops.moe_experts(x, gu, dn, w, ids, path="dequant", backend="cpu")
    with pytest.raises(TypeError, match="both be QuantWeight banks or both dense"):
        ops.moe_experts(x, gu, torch.randn(2, 256, 256), w, ids)
    with pytest.raises(TypeError, match="w_gate_up must be one of"):
        ops.moe_experts(x, gu.data, dn, w, ids)


@pytest.mark.gpu
@settings(max_examples=20, deadline=None)
@given(kquant_expert_cases(tokens=(1, 3, 9)))
def test_kquant_experts_gpu(case):
    ft.check_experts_case(*case, device="cuda")


@st.composite
def kquant_vec_cases(draw):
    """Decode-sized routings (T <= 8, up to 10 slots, some invalid) of Q4_K / Q5_K / Q6_K banks at
    model widths: hip's "vec" decode kernels. (2048, 768) is Qwen3-30B-A3B's layer, (2048, 512)
    Qwen3.6's; H = 2304 takes the gate/up kernel's long-row walk; I = 768 and 1024 give down rows
    of three and four super-blocks."""
    gate, down = draw(
        st.sampled_from([("Q4_K", "Q6_K"), ("Q4_K", "Q4_K"), ("Q5_K", "Q6_K"), ("Q6_K", "Q5_K")])
    )
    h, inter = draw(
        st.sampled_from([(2048, 768), (2048, 512), (2304, 256), (512, 1024), (256, 256)])
    )
    e = draw(st.integers(2, 16))
    # up to 10 slots (Qwen3-Next's top-10: more slots than a block's 8 groups), k * I <= 8192
    k, t = draw(st.integers(1, min(e, 10, 8192 // inter))), draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    weights, ids = ops.route_topk(torch.randn(t, e, generator=gen), k)
    ids[torch.rand(ids.shape, generator=gen) < 0.15] = draw(st.sampled_from([-1, e]))
    x = torch.randn(t, h, generator=gen) * draw(st.sampled_from([1.0, 0.05, 8.0]))
    x = x.to(draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16])))
    gu = ft.random_quant_bank(seed, gate, e, 2 * inter, h, magnitude=4 * h**-0.5)
    dn = ft.random_quant_bank(seed + 7, down, e, h, inter, magnitude=4 * inter**-0.5)
    return x, gu, dn, weights, ids


@pytest.mark.gpu
@settings(max_examples=30, deadline=None)
@given(kquant_vec_cases())
def test_kquant_vec_decode_gpu(case):
    """hip's vec decode experts against the int8 reference within its bound, and the same bits
    from a second call (no atomics: a replayed graph and an eager step agree)."""
    x, gu, dn, weights, ids = (v.to("cuda") for v in case)
    assert (
        backends.variant_for(
            "moe_experts", "hip", calls.experts(x, gu, dn, ids.shape[1]), path="int8"
        )
        == "vec"
    )
    ft.check_experts_case(x, gu, dn, weights, ids, path="int8", device="cuda", backends=["hip"])
    got = ops.moe_experts(x, gu, dn, weights, ids, path="int8", backend="hip")
    again = ops.moe_experts(x, gu, dn, weights, ids, path="int8", backend="hip")
    assert torch.equal(got, again)


@pytest.mark.gpu
def test_kquant_vec_decode_entry_checks_gpu():
    """The vec entry's checks name the argument, what it expects and what came."""
    from ftlab import jit

    dev = torch.device("cuda")
    module = jit.module_for("moe_kquant", dev)
    gu = ft.random_quant_bank(0, "Q4_K", 2, 512, 256).to(dev)
    dn = ft.random_quant_bank(1, "Q6_K", 2, 256, 256).to(dev)
    x = torch.randn(1, 256, device=dev, dtype=torch.bfloat16)
    ids = torch.zeros(1, 1, dtype=torch.int32, device=dev)
    wts = torch.ones(1, 1, device=dev)
    hq = torch.empty(1, 256, dtype=torch.int8, device=dev)
    hd, hs = torch.empty(1, 8, device=dev), torch.empty(1, 8, device=dev)
    y = torch.empty_like(x)
    module.moe_experts_decode_kq(x, gu.data, 1, dn.data, 3, ids, wts, hq, hd, hs, y)  # well formed
    with pytest.raises(ValueError, match="w_gate_up, got code 0"):
        module.moe_experts_decode_kq(x, gu.data, 0, dn.data, 3, ids, wts, hq, hd, hs, y)
    with pytest.raises(ValueError, match=r"w_down must be \[E, 256, 144\]"):
        module.moe_experts_decode_kq(x, gu.data, 1, dn.data, 1, ids, wts, hq, hd, hs, y)
    with pytest.raises(ValueError, match="in x's dtype"):
        module.moe_experts_decode_kq(x, gu.data, 1, dn.data, 3, ids, wts, hq, hd, hs, y.float())
    off = torch.empty(257 + 16, dtype=torch.int8, device=dev)[1:257].view(1, 256)
    with pytest.raises(ValueError, match="hq must be 16-byte aligned"):
        module.moe_experts_decode_kq(x, gu.data, 1, dn.data, 3, ids, wts, off, hd, hs, y)
    with pytest.raises(TypeError, match="hq must be int8"):
        module.moe_experts_decode_kq(
            x, gu.data, 1, dn.data, 3, ids, wts, hq.view(torch.uint8), hd, hs, y
        )

"""hip's grouped expert GEMM on fp16 / bf16 banks (``csrc/moe_gemm.hip``, the matrix cores of
``csrc/mma.h``): past the decode kernels' token count, against the reference within
:func:`ftlab.testing.moe.experts_tolerance` (hip alone: Triton's own tests cover it, and each
shape here would compile it anew). The shapes reach the kernel's edges: K not a multiple of its
64-wide step (a last step of one to seven 16-byte chunks), K not whole chunks and activations off
16-byte alignment (the FMA tiles take those), output widths not a multiple of 64, experts with
several 64-row blocks and a partly filled last one, 32-row blocks (under 16 rows an expert),
invalid slots, and the entries' refusals of wrong dtypes, top_k and block_m."""

import pytest
import torch

import ftlab.testing as ft
from ftlab import ops

DTYPES = [torch.bfloat16, torch.float16]


def _case(
    tokens: int,
    experts: int,
    top_k: int,
    hidden: int,
    inter: int,
    dtype,
    seed: int,
    invalid: bool = False,
):
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(tokens, hidden, device=dev, generator=gen).to(dtype)
    gu = (torch.randn(experts, 2 * inter, hidden, device=dev, generator=gen) * hidden**-0.5).to(
        dtype
    )
    dn = (torch.randn(experts, hidden, inter, device=dev, generator=gen) * inter**-0.5).to(dtype)
    weights, ids = ops.route_topk(torch.randn(tokens, experts, device=dev, generator=gen), top_k)
    if invalid:
        ids = torch.where(torch.rand(ids.shape, device=dev, generator=gen) < 0.2, -1, ids)
    return x, gu, dn, weights, ids


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "tokens,experts,top_k,hidden,inter",
    [
        (12, 8, 2, 64, 32),  # one 32-row block an expert, mostly padding
        (300, 4, 2, 96, 64),  # ~150 rows an expert: three blocks, the last partly filled
        (40, 6, 3, 40, 24),  # K = 40 / 24: one step of five / three chunks (of eight)
        # K = 200 / 72: last steps of one / nine chunks; 32-row blocks; widths not x64
        (
            33,
            5,
            2,
            200,
            72,
        ),
        (20, 4, 2, 36, 20),  # K = 36 / 20: not whole 16-byte chunks -> the FMA tiles
        (64, 128, 8, 256, 96),  # many experts, top-8
    ],
)
def test_hip_dense_experts_gemm_gpu(dtype, tokens, experts, top_k, hidden, inter):
    for seed, invalid in ((0, False), (1, True)):
        case = _case(tokens, experts, top_k, hidden, inter, dtype, seed, invalid)
        ft.check_experts_case(*case, device="cuda", backends=["hip"])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
# 1: base and row stride off 16 bytes (FMA tiles); 8: aligned
@pytest.mark.parametrize("offset", [1, 8])
def test_hip_dense_experts_gemm_strided_x_gpu(dtype, offset):
    x, gu, dn, weights, ids = _case(48, 6, 2, 64, 32, dtype, 2)
    wide = torch.zeros(48, 64 + offset, dtype=dtype, device=x.device)
    wide[:, offset:] = x
    xs = wide[:, offset:]
    assert xs.stride() == (64 + offset, 1)
    want = ops.moe_experts(x, gu, dn, weights, ids, backend="hip")
    got = ops.moe_experts(xs, gu, dn, weights, ids, backend="hip")
    ft.check_experts_case(xs, gu, dn, weights, ids, device="cuda", backends=["hip"])
    if offset == 8:  # the same kernel on the same values: the same bits
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.gpu
def test_hip_dense_gemm_entry_refuses_mismatched_outputs_gpu():
    """The module entry checks h's dtype (the bank's for gate/up, fp32 for down)."""
    from ftlab import jit
    from ftlab.hip.moe import GEMM_BLOCK_M, moe_align

    x, gu, dn, weights, ids = _case(12, 4, 2, 64, 32, torch.bfloat16, 3)
    sorted_ids, expert_ids, npad = moe_align(ids.to(torch.int32), 4, GEMM_BLOCK_M)
    flat_w = weights.contiguous().view(-1)
    module = jit.module_for("moe", x.device)
    h32 = torch.empty(24, 32, device=x.device)
    with pytest.raises(TypeError, match="out must have w's dtype"):
        module.moe_gemm_dense(x, gu, sorted_ids, expert_ids, npad, flat_w, h32, 2, True)
    h = torch.empty(24, 32, dtype=torch.bfloat16, device=x.device)
    with pytest.raises(TypeError, match="a must have w's dtype"):
        module.moe_gemm_dense(
            h32,
            dn,
            sorted_ids,
            expert_ids,
            npad,
            flat_w,
            torch.empty(24, 64, device=x.device),
            2,
            False,
        )
    with pytest.raises(ValueError, match="top_k must be >= 1 and divide the pairs"):
        module.moe_gemm_dense(x, gu, sorted_ids, expert_ids, npad, flat_w, h[:23], 2, True)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        module.moe_gemm_dense(x, gu, sorted_ids, expert_ids, npad, flat_w, h, 0, True)
    with pytest.raises(TypeError, match="float32"):
        module.moe_gemm_dense(
            h,
            dn,
            sorted_ids,
            expert_ids,
            npad,
            flat_w,
            torch.empty(24, 64, dtype=torch.bfloat16, device=x.device),
            2,
            False,
        )


@pytest.mark.gpu
def test_hip_grouped_gemm_entries_refuse_other_block_m_gpu():
    """The matrix-core GEMM takes moe_align's rows in blocks of 32 or 64, the dp4a and FMA tiles
    in blocks of 64: another block_m is refused with what came, before any launch."""
    from ftlab import jit
    from ftlab.hip.moe import moe_align
    from ftlab.hip.q4_0 import quantize_q8_1

    x, gu, dn, weights, ids = _case(12, 4, 2, 64, 32, torch.bfloat16, 4)
    flat_w = weights.contiguous().view(-1)
    module = jit.module_for("moe", x.device)
    h = torch.full((24, 32), 7.0, dtype=torch.bfloat16, device=x.device)
    for block_m in (16, 128):
        align = moe_align(ids.to(torch.int32), 4, block_m)
        with pytest.raises(ValueError, match=f"block_m.*got {block_m}"):
            module.moe_gemm_dense(x, gu, *align, flat_w, h, 2, True)
    assert bool((h == 7).all())  # nothing written
    align32 = moe_align(ids.to(torch.int32), 4, 32)
    with pytest.raises(ValueError, match="FMA tiles.*block_m = 64, got 32"):
        module.moe_gemm_dense(x.float(), gu.float(), *align32, flat_w, h.float(), 2, True)
    q = ops.quantize_q4_0(gu.float()).data
    x8 = quantize_q8_1(x.float())
    with pytest.raises(ValueError, match="Q4_0 grouped GEMM.*block_m = 64, got 32"):
        module.moe_gemm_q4(q, x8.q, x8.d, x8.s, *align32, flat_w, h.float(), 2, True)


def test_gemm_block_m_rule():
    """moe_align's block_m for hip's grouped GEMMs: 32 on the matrix cores (16-bit banks, rows in
    whole 16-byte chunks) when an expert has under 16 rows on average, else 64 (as the dp4a and FMA
    tiles need)."""
    from ftlab.hip.moe import gemm_block_m

    experts, hidden, inter = 8, 64, 32
    gu = torch.zeros(experts, 2 * inter, hidden, dtype=torch.bfloat16)
    dn = torch.zeros(experts, hidden, inter, dtype=torch.bfloat16)
    x = torch.zeros(40, hidden, dtype=torch.bfloat16)
    assert gemm_block_m(x, gu, dn, pairs=16 * experts - 1) == 32
    assert gemm_block_m(x, gu, dn, pairs=16 * experts) == 64
    assert gemm_block_m(x.float(), gu.float(), dn.float(), pairs=8) == 64  # fp32: FMA tiles
    off = torch.zeros(40, hidden + 1, dtype=torch.bfloat16)[:, 1:]  # rows off 16-byte alignment
    assert gemm_block_m(off, gu, dn, pairs=8) == 64
    odd = torch.zeros(40, 36, dtype=torch.bfloat16)  # K = 36: not whole chunks
    assert (
        gemm_block_m(
            odd, gu[..., :36], torch.zeros(experts, 36, inter, dtype=torch.bfloat16), pairs=8
        )
        == 64
    )

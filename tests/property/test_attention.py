"""decode_attention: every backend against the reference within the derived bound, on views of
a static slot-indexed cache (the model's layout), over lengths from 0 past the cache's end (and
below 0: clamped), in the Triton interpreter on the CPU and on a GPU; the reference against
torch's scaled_dot_product_attention; the split plans; graph capture. Hostile caches and bad
arguments: test_attention_hostile.py."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import ops
from ftlab.reference.attention import split_plan

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@st.composite
def decode_attention_case(
    draw,
    dtypes=DTYPES,
    lengths=(1, 5, 64, 65, 200, 300),
    dims=(8, 12, 64, 128),
    batches=(1, 2, 3),
    kv_heads=(1, 2, 4),
    groups=(1, 2, 8),
):
    b = draw(st.sampled_from(batches))
    kvh = draw(st.sampled_from(kv_heads))
    g = draw(st.sampled_from(groups))
    d = draw(st.sampled_from(dims))
    s = draw(st.sampled_from(lengths))
    dtype = draw(st.sampled_from(dtypes))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = (torch.randn(b, kvh * g, d, generator=gen) * draw(st.sampled_from([0.3, 1.0, 4.0]))).to(
        dtype
    )
    # a static cache of max_batch >= b sequences, [slots, KVH * D], viewed per sequence
    max_b = b + draw(st.sampled_from([0, 1]))
    cache_k = torch.randn(max_b * s, kvh * d, generator=gen).to(dtype)
    cache_v = torch.randn(max_b * s, kvh * d, generator=gen).to(dtype)
    k = cache_k.view(max_b, s, kvh, d)[:b]
    v = cache_v.view(max_b, s, kvh, d)[:b]
    lens = [draw(st.sampled_from([0, 1, s // 2, s - 1, s, s + 3, -2])) for _ in range(b)]
    lengths = torch.tensor(lens, dtype=draw(st.sampled_from([torch.int32, torch.int64])))
    scale = draw(st.sampled_from([None, 0.05]))
    return q, k, v, lengths, scale


@given(decode_attention_case())
def test_decode_attention_cpu(case):
    ft.check_decode_attention_case(*case)


@settings(max_examples=6, deadline=None)
@given(
    decode_attention_case(dtypes=(torch.float32, torch.bfloat16), lengths=(1, 65), dims=(8, 128))
)
def test_decode_attention_quantize_cpu(case):
    """quantize=True: the same output and its Q8_1 (that of quantize_q8_1), in every backend."""
    ft.check_decode_attention_case(*case, quantize=True)


@settings(max_examples=4, deadline=None)
@given(decode_attention_case(dtypes=(torch.bfloat16,), lengths=(4200,), dims=(8,)))
def test_decode_attention_long_cache_cpu(case):
    """Past 64 x 64 positions a split holds more than one tile (4200: 33 splits of 128)."""
    ft.check_decode_attention_case(*case)


@pytest.mark.gpu
@given(decode_attention_case())
def test_decode_attention_gpu(case):
    ft.check_decode_attention_case(*case, device="cuda", quantize=True)


@pytest.mark.gpu
@settings(max_examples=10, deadline=None)
@given(decode_attention_case(lengths=(640, 4200, 33000), dims=(8, 64, 128, 256)))
def test_decode_attention_long_cache_gpu(case):
    ft.check_decode_attention_case(*case, device="cuda", quantize=True)


@pytest.mark.gpu
@settings(max_examples=24, deadline=None)
@given(
    decode_attention_case(
        dtypes=(torch.bfloat16, torch.float16),
        lengths=(520, 640, 2100),
        dims=(128,),
        batches=(4, 8, 16),
        kv_heads=(4,),
        groups=(8,),
    )
)
def test_decode_attention_model_batches_gpu(case):
    """A Qwen3-MoE decode step's attention at 4 to 16 sequences (32 query / 4 key heads of 128 over
    a static cache of 520+ slots a sequence): every backend within the bound, hip's one-launch
    kernel merging its splits over up to 16 x 4 (sequence, key head) counters."""
    ft.check_decode_attention_case(*case, device="cuda", quantize=True)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [2, 4])
@settings(max_examples=30, deadline=None)
@given(
    case=decode_attention_case(
        dtypes=(torch.bfloat16, torch.float16), lengths=(1, 17, 65, 300, 2100), dims=(128, 256)
    )
)
def test_hip_one_launch_rows_gpu(rows, case):
    """hip's one-launch kernel with tiles of 16 and 32 positions at head dim 128 (8 and 16 at 256;
    ``ROWS_PER_THREAD`` 2 and 4): within the bound of the reference."""
    import ftlab.hip.attention as hip_attention
    from ftlab import backends

    if "hip" not in backends.available_backends(
        "decode_attention", torch.device("cuda"), torch.bfloat16
    ):
        pytest.skip("hip cannot serve decode_attention on this GPU")
    hip_attention.ROWS_PER_THREAD = rows
    try:
        ft.check_decode_attention_case(*case, device="cuda", backends=["hip"], quantize=True)
    finally:
        hip_attention.ROWS_PER_THREAD = 4


@pytest.mark.gpu
@pytest.mark.parametrize("want", [1, 2, 3])
@settings(max_examples=8, deadline=None)
@given(
    case=decode_attention_case(
        dtypes=(torch.bfloat16, torch.float16), lengths=(65, 640, 4200), dims=(128, 256)
    )
)
def test_hip_one_launch_capped_splits_gpu(want, case):
    """hip's one-launch kernel with a sequence's live splits capped at 1, 2 and 3 (``tile_want``):
    splits of many tiles, grown from the plan's chunk inside the kernel: within the bound of the
    reference."""
    import ftlab.hip.attention as hip_attention
    from ftlab import backends

    if "hip" not in backends.available_backends(
        "decode_attention", torch.device("cuda"), torch.bfloat16
    ):
        pytest.skip("hip cannot serve decode_attention on this GPU")
    planned = hip_attention.tile_want
    hip_attention.tile_want = lambda b, kvh, device, d: want
    try:
        ft.check_decode_attention_case(*case, device="cuda", backends=["hip"], quantize=True)
    finally:
        hip_attention.tile_want = planned


def test_held_to_reference_counts_calls_and_catches_a_fault(monkeypatch):
    """decode_attention_held_to_reference: each non-reference call counted with the elements over
    the bound -- none for Triton's kernel, all of them for one that adds 0.01 to its output."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, 16, generator=gen),
        torch.randn(2, 9, 2, 16, generator=gen),
        torch.randn(2, 9, 2, 16, generator=gen),
    )
    lengths = torch.tensor([9, 4], dtype=torch.int32)
    real = ops.decode_attention
    with ft.decode_attention_held_to_reference() as calls:
        got = ops.decode_attention(q, k, v, lengths, backend="triton")
        ops.decode_attention(q, k, v, lengths, backend="reference")
        ops.decode_attention(q, k, v, lengths, backend="triton", quantize=True)
    assert calls == [("triton", 0, got.numel())] * 2 and ops.decode_attention is real

    def broken(*args, **kwargs):
        out = real(*args, **kwargs)
        return out if kwargs.get("backend") == "reference" else out + 0.01

    monkeypatch.setattr(ops, "decode_attention", broken)
    with ft.decode_attention_held_to_reference() as calls:
        ops.decode_attention(q, k, v, lengths, backend="triton")
    assert calls == [("triton", got.numel(), got.numel())]
    assert ops.decode_attention is broken  # put back on the way out


def test_split_plan():
    """Splits of 64 positions up to 64 of them, then longer ones; they always cover the cache."""
    assert split_plan(1) == (64, 1) and split_plan(64) == (64, 1) and split_plan(65) == (64, 2)
    assert split_plan(4096) == (64, 64) and split_plan(4097) == (128, 33)
    for s in (1, 63, 640, 4200, 33000, 10**6):
        chunk, splits = split_plan(s)
        assert chunk % 64 == 0 and chunk * splits >= s > chunk * (splits - 1) and splits <= 64


def test_hip_tile_plan():
    """hip's one-launch kernel: a split is whole tiles (4 rows a thread: 32 positions at head dim
    128, 16 at 256; 2 rows: half), one a split up to 64 splits, then more tiles a split; the splits
    cover the cache, none empty."""
    from ftlab.hip.attention import TILE_MAX_SPLITS, tile_plan, tile_rows

    assert tile_rows(128, 4) == 32 and tile_rows(256, 4) == 16 and tile_rows(128, 2) == 16
    assert tile_plan(513, 128, 4) == (32, 17) and tile_plan(2048, 128, 4) == (32, 64)
    assert tile_plan(2049, 128, 4) == (64, 33) and tile_plan(513, 128, 2) == (16, 33)
    for d in (128, 256):
        for rows in (2, 4):
            for s in (1, 31, 520, 1025, 4096, 33000, 10**6):
                chunk, splits = tile_plan(s, d, rows)
                assert chunk % tile_rows(d, rows) == 0 and chunk * splits >= s > chunk * (
                    splits - 1
                )
                assert 1 <= splits <= TILE_MAX_SPLITS


def test_hip_tile_want(monkeypatch):
    """The most live splits a (sequence, key head): all 64 while every split of every sequence's key
    heads fits the kernel's residency (3 blocks a multiprocessor at head dim 128, 2 at 256), else
    ~2.5 (head dim 128) or ~1.5 (256) blocks a multiprocessor over them (132 multiprocessors: 64
    splits for one sequence of 4 key heads of 128, 42 for 2, 11 for 8; 13 for 8 sequences of 2 key
    heads of 256), 1 to 64."""
    import ftlab.hip.attention as ha

    monkeypatch.setattr(ha.ftplatform, "multiprocessors", lambda device: 132)
    dev = torch.device("cpu")
    assert [ha.tile_want(b, 4, dev, 128) for b in (1, 2, 4, 8, 16, 64)] == [64, 42, 21, 11, 6, 2]
    assert [ha.tile_want(b, 2, dev, 256) for b in (1, 2, 3, 8, 64)] == [64, 64, 33, 13, 2]
    assert (
        ha.tile_want(1, 1, dev, 128) == ha.TILE_MAX_SPLITS
        and ha.tile_want(0, 4, dev, 128) == ha.TILE_MAX_SPLITS
    )
    with pytest.raises(ValueError, match="head dim 128 or 256, got 64"):
        ha.tile_want(1, 4, dev, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_sdpa(dtype):
    """The reference is torch's attention with the causal mask of a decode step (GQA), within the
    derived bound; a sequence with no position gives zeros (SDPA gives NaN there)."""
    gen = torch.Generator().manual_seed(3)
    b, kvh, g, d, s = 3, 2, 4, 32, 40
    q = torch.randn(b, kvh * g, d, generator=gen).to(dtype)
    k = torch.randn(b, s, kvh, d, generator=gen).to(dtype)
    v = torch.randn(b, s, kvh, d, generator=gen).to(dtype)
    lengths = torch.tensor([s, 7, 0])
    got = ops.decode_attention(q, k, v, lengths, backend="reference")
    mask = torch.arange(s)[None, None, None, :] < lengths[:, None, None, None]
    want = F.scaled_dot_product_attention(
        q.float()[:, :, None],
        k.float().transpose(1, 2),
        v.float().transpose(1, 2),
        attn_mask=mask,
        enable_gqa=True,
    )[:, :, 0]
    bound = ft.decode_attention_tolerance(q, k, v, lengths, d**-0.5).view(b, kvh * g, d)
    assert bool(((got[:2].float() - want[:2]).abs() <= bound[:2]).all())
    assert bool((got[2] == 0).all())


def test_strided_heads_are_copied_not_misread():
    """k with non-contiguous heads (a transposed view) is taken through a copy: same result."""
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(1, 4, 16, generator=gen)
    # [B, S, KVH, D], heads strided by S * D
    k = torch.randn(1, 2, 9, 16, generator=gen).transpose(1, 2)
    v = torch.randn(1, 9, 2, 16, generator=gen)
    lengths = torch.tensor([9])
    ft.check_decode_attention_case(q, k, v, lengths)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "hip"])
def test_graph_capturable(backend):
    """Captured in a CUDA graph (no host work) and replayed after the lengths and the cache
    change in place: equal to an eager call on the new values."""
    from ftlab import backends

    dev = torch.device("cuda")
    if backend not in backends.available_backends("decode_attention", dev, torch.bfloat16):
        pytest.skip(f"{backend} cannot serve decode_attention on this GPU")
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, 32, 128, generator=gen).bfloat16().to(dev)
    k = torch.randn(2, 700, 4, 128, generator=gen).bfloat16().to(dev)
    v = torch.randn(2, 700, 4, 128, generator=gen).bfloat16().to(dev)
    lengths = torch.tensor([5, 600], device=dev)
    ops.decode_attention(q, k, v, lengths, backend=backend)  # build and warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.decode_attention(q, k, v, lengths, backend=backend)
    lengths.copy_(torch.tensor([700, 1], device=dev))
    k.normal_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ops.decode_attention(q, k, v, lengths, backend=backend))

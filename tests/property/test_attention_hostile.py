"""decode_attention on hostile inputs, in every backend (the reference included): NaN and inf in
a cache's slots past each sequence's length change no bit; a NaN in a live key reaches the
output of the heads that read it (and its Q8_1), never hidden; an -inf score weighs nothing,
and a head whose every score is -inf gives NaN, not zeros. Bad arguments name themselves, in
the op and in hip's one-launch entries called directly."""

import pytest
import torch

import ftlab.testing as ft
from ftlab import ops


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("d", [8, 128, 256])
def test_slots_past_the_length_are_never_read(device, d):
    """NaN and Inf in a cache's slots past each sequence's length change nothing: every backend
    gives the bits it gives on a clean cache (the reference included: p = 0 times a NaN value
    would be NaN)."""
    from ftlab import backends

    dev = torch.device(device)
    gen = torch.Generator().manual_seed(d)
    b, s, kvh, g = 2, 90, 2, 4
    q, k, v = (
        torch.randn(*shape, generator=gen).bfloat16().to(dev)
        for shape in ((b, kvh * g, d), (b, s, kvh, d), (b, s, kvh, d))
    )
    lengths = torch.tensor([37, 70], device=dev)
    dirty_k, dirty_v = k.clone(), v.clone()
    for i, n in enumerate(lengths.tolist()):
        dirty_k[i, n:] = float("nan")
        dirty_v[i, n:] = float("inf") if i else float("nan")
    for name in backends.available_backends("decode_attention", dev, torch.bfloat16):
        clean = ops.decode_attention(q, k, v, lengths, backend=name)
        dirty = ops.decode_attention(q, dirty_k, dirty_v, lengths, backend=name)
        assert torch.equal(clean, dirty), name


@pytest.mark.parametrize("s", [5, 130])
@pytest.mark.parametrize(
    "device, dtype, d",
    [("cpu", torch.float32, 8), pytest.param("cuda", torch.bfloat16, 128, marks=pytest.mark.gpu)],
)
def test_nan_in_the_cache_is_not_hidden(s, device, dtype, d):
    """A NaN in a live key reaches the output of the heads that read it (one split and several),
    in every backend: a split with no position (sum 0) is skipped, a NaN sum is not (bf16 at head
    dim 128 on a GPU: hip's one-launch kernel). With quantize=True the Q8_1 is that backend's
    quantize_q8_1 of the output, NaN blocks included."""
    q = torch.randn(1, 4, d).to(device, dtype)
    k = torch.randn(1, s, 2, d).to(device, dtype)
    k[0, 1, 0, 0] = float("nan")
    for name in ft.backends_for("decode_attention", q.device, q.dtype, None):
        out = ops.decode_attention(q, k, k.clone(), torch.tensor([s], device=device), backend=name)
        assert out[0, :2].isnan().all() and not out[0, 2:].isnan().any(), name
        again, q8 = ops.decode_attention(
            q, k, k.clone(), torch.tensor([s], device=device), backend=name, quantize=True
        )
        want = ops.quantize_q8_1(again.view(1, -1), backend=name)
        assert again[0, :2].isnan().all() and not again[0, 2:].isnan().any(), name
        for part in ("q", "d", "s"):
            assert torch.equal(
                getattr(q8, part).nan_to_num(7.0), getattr(want, part).nan_to_num(7.0)
            ), (name, part)


@pytest.mark.parametrize("s", [5, 130])
@pytest.mark.parametrize(
    "device, dtype, d",
    [("cpu", torch.float32, 8), pytest.param("cuda", torch.bfloat16, 128, marks=pytest.mark.gpu)],
)
def test_minus_inf_scores_weigh_nothing(s, device, dtype, d):
    """A live key whose score is -inf (an -inf element against a positive query) weighs nothing, as
    in the reference's softmax: the same output as with that element at -1e30 (a weight of exactly
    0 there too), in every backend; where every live score of a head is -inf the output is NaN (the
    softmax of -inf alone), not zeros -- so hip's one-launch kernel (bf16 at head dim 128 on a GPU)
    tells that from a sequence of no position."""
    gen = torch.Generator().manual_seed(11)
    # positive: q . k = -inf where k has -inf
    q = (torch.rand(1, 4, d, generator=gen) + 0.1).to(device, dtype)
    k = torch.randn(1, s, 2, d, generator=gen).to(device, dtype)
    v = torch.randn(1, s, 2, d, generator=gen).to(device, dtype)
    lengths = torch.tensor([s], device=device)
    k_inf, k_big = k.clone(), k.clone()
    k_inf[0, 1, 0, 0], k_big[0, 1, 0, 0] = float("-inf"), -1e30
    k_all = k.clone()
    k_all[0, :, 0, 0] = float("-inf")
    for name in ft.backends_for("decode_attention", q.device, q.dtype, None):
        got = ops.decode_attention(q, k_inf, v, lengths, backend=name)
        assert not got.isnan().any() and torch.equal(
            got, ops.decode_attention(q, k_big, v, lengths, backend=name)
        ), name
        out = ops.decode_attention(q, k_all, v, lengths, backend=name)
        assert out[0, :2].isnan().all() and not out[0, 2:].isnan().any(), name


def test_bad_arguments_name_themselves():
    q = torch.randn(2, 8, 16)
    k = torch.randn(2, 10, 2, 16)
    lengths = torch.tensor([3, 10])
    with pytest.raises(ValueError, match="q must be 3-D"):
        ops.decode_attention(q[0], k, k, lengths)
    with pytest.raises(ValueError, match="KVH dividing"):
        ops.decode_attention(q, torch.randn(2, 10, 3, 16), torch.randn(2, 10, 3, 16), lengths)
    with pytest.raises(ValueError, match=r"k must be \[B=2"):
        ops.decode_attention(q, k[:1], k[:1], lengths)
    with pytest.raises(ValueError, match="v must have k's 10 positions"):
        ops.decode_attention(q, k, k[:, :5], lengths)
    with pytest.raises(TypeError, match="v must have the dtype of q"):
        ops.decode_attention(q, k, k.half(), lengths)
    with pytest.raises(TypeError, match="lengths must be one of int32, int64"):
        ops.decode_attention(q, k, k, lengths.float())
    with pytest.raises(ValueError, match=r"lengths must have shape \(2,\)"):
        ops.decode_attention(q, k, k, lengths[:1])
    with pytest.raises(ValueError, match="scale must be a finite number"):
        ops.decode_attention(q, k, k, lengths, scale=float("inf"))


def test_quantize_needs_whole_q8_blocks():
    q = torch.zeros(1, 2, 12)
    k = torch.zeros(1, 4, 1, 12)
    with pytest.raises(ValueError, match="quantize=True needs H \\* D a multiple of 32"):
        ops.decode_attention(q, k, k, torch.ones(1, dtype=torch.int32), quantize=True)


@pytest.mark.gpu
def test_hip_one_launch_refuses_bad_direct_calls():
    """The one-launch entries, called directly: a chunk past int32, fp16 workspaces, strided
    counters, no live split wanted, Q8_1 outputs of the wrong dtype, size or device are refused
    before any launch."""
    from ftlab import backends, jit

    dev = torch.device("cuda")
    if "hip" not in backends.available_backends("decode_attention", dev, torch.bfloat16):
        pytest.skip("hip cannot serve decode_attention on this GPU")
    module = jit.module_for("attention", dev)
    q = torch.randn(1, 8, 128, device=dev).bfloat16()
    k = torch.randn(1, 100, 2, 128, device=dev).bfloat16()
    lengths = torch.tensor([50], dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    ml, acc = torch.zeros(1, 2, 4, 4, 2, device=dev), torch.zeros(1, 2, 4, 4, 128, device=dev)
    counters = torch.zeros(16, dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="at most 2147483647"):
        module.decode_attention_tiles(
            q, k, k, lengths, ml, acc, counters, out, 2**32 + 32, 1, 1, 4, 0.1
        )
    with pytest.raises(TypeError, match="ml and acc must be float32"):
        module.decode_attention_tiles(
            q, k, k, lengths, ml.half(), acc, counters, out, 32, 4, 4, 4, 0.1
        )
    with pytest.raises(ValueError, match="contiguous"):
        module.decode_attention_tiles(
            q, k, k, lengths, ml, acc, counters[::2], out, 32, 4, 4, 4, 0.1
        )
    with pytest.raises(
        ValueError, match=r"want \(the most live splits a sequence\) must be 1 to 64, got 0"
    ):
        module.decode_attention_tiles(q, k, k, lengths, ml, acc, counters, out, 32, 4, 0, 4, 0.1)
    oq = torch.full((1, 1024), 7, dtype=torch.int8, device=dev)
    od, os_ = torch.zeros(1, 32, device=dev), torch.zeros(1, 32, device=dev)
    with pytest.raises(TypeError, match="oq must be int8"):
        module.decode_attention_tiles_q8(
            q, k, k, lengths, ml, acc, counters, out, oq.int(), od, os_, 32, 4, 4, 4, 0.1
        )
    with pytest.raises(TypeError, match="od and os must be float32 with"):
        module.decode_attention_tiles_q8(
            q, k, k, lengths, ml, acc, counters, out, oq, od[:, :16], os_, 32, 4, 4, 4, 0.1
        )
    with pytest.raises(ValueError, match="oq, od and os"):
        module.decode_attention_tiles_q8(
            q, k, k, lengths, ml, acc, counters, out, oq, od.cpu(), os_, 32, 4, 4, 4, 0.1
        )
    assert not counters.any() and (oq == 7).all() and not od.any()

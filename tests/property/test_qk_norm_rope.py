"""qk_norm_rope (per-head RMSNorm of q and k, then RoPE): every backend against the reference
within the derived bound, on views of a fused q/k/v projection and on contiguous rows, with
full and partial rotary (Qwen3-Next's 64 of 256 dims), in the Triton interpreter on the CPU and
on a GPU; bad arguments name themselves."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import backends, ops
from ftlab.models.layers import rope_tables


@st.composite
def qk_norm_rope_case(draw, dtypes=(torch.float32, torch.bfloat16, torch.float16)):
    n = draw(st.sampled_from([1, 2, 5, 17]))
    hq = draw(st.sampled_from([1, 2, 4, 8]))
    hk = draw(st.sampled_from([1, 2]))
    d, rot = draw(
        st.sampled_from(
            [
                (6, None),
                (16, None),
                (64, None),
                (128, None),
                (16, 4),
                (256, 64),
                (128, 32),
                (10, 6),
                (128, 128),
            ]
        )
    )
    dtype = draw(st.sampled_from(dtypes))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 300.0]))
    qkv = (torch.randn(n, (hq + 2 * hk) * d, generator=gen) * scale).to(dtype)
    if draw(st.booleans()):  # views of the fused projection, as the model passes them
        q, k = qkv[:, : hq * d].view(n, hq, d), qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)
    else:
        q, k = (
            qkv[:, : hq * d].reshape(n, hq, d).clone(),
            qkv[:, hq * d : (hq + hk) * d].reshape(n, hk, d).clone(),
        )
    qw = (1 + 0.5 * torch.randn(d, generator=gen)).to(dtype)
    kw = (1 + 0.5 * torch.randn(d, generator=gen)).to(dtype)
    positions = torch.randint(0, 40000, (1, n), generator=gen)
    r = d if rot is None else rot
    cos, sin = rope_tables(positions, r, draw(st.sampled_from([1e4, 1e6])), dtype)
    eps = draw(st.sampled_from([1e-6, 1e-5]))
    return q, k, qw, kw, cos.reshape(n, r), sin.reshape(n, r), eps, rot


@given(qk_norm_rope_case())
def test_qk_norm_rope_cpu(case):
    *args, rot = case
    ft.check_qk_norm_rope_case(*args, rotary_dim=rot)


@pytest.mark.gpu
@given(qk_norm_rope_case())
def test_qk_norm_rope_gpu(case):
    *args, rot = case
    ft.check_qk_norm_rope_case(*args, device="cuda", rotary_dim=rot)


@st.composite
def qk_norm_rope_cache_case(draw, dtypes=(torch.float32, torch.bfloat16, torch.float16)):
    """A qk_norm_rope case with a KV cache to write: v the fused projection's view (or its own
    rows), caches of S slots (row stride at or past the width), unique slots with some -1 and
    some past S."""
    q, k, qw, kw, cos, sin, eps, rot = draw(qk_norm_rope_case(dtypes))
    n, hk, d = k.shape
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    v = (torch.randn(n, hk * d + 3, generator=gen) * 2).to(q.dtype)[:, 3:].view(n, hk, d)
    if draw(st.booleans()):
        v = v.reshape(n, hk * d).clone()
    s = n + draw(st.integers(0, 9))
    slots = torch.randperm(s + 6, generator=gen)[:n]  # some past S: skipped
    skip = torch.rand(n, generator=gen) < 0.25
    slots = torch.where(skip, -1, slots).to(draw(st.sampled_from([torch.int32, torch.int64])))
    pad = draw(st.sampled_from([0, 8]))
    k_cache = torch.randn(s, hk * d + pad, generator=gen).to(q.dtype)[:, : hk * d]
    v_cache = torch.randn(s, hk * d + pad, generator=gen).to(q.dtype)[:, : hk * d]
    return q, k, v, qw, kw, cos, sin, eps, k_cache, v_cache, slots, rot


@given(qk_norm_rope_cache_case())
def test_qk_norm_rope_writes_the_cache_cpu(case):
    *args, rot = case
    ft.check_qk_norm_rope_cache_case(*args, rotary_dim=rot)


@pytest.mark.gpu
@given(qk_norm_rope_cache_case())
def test_qk_norm_rope_writes_the_cache_gpu(case):
    *args, rot = case
    ft.check_qk_norm_rope_cache_case(*args, device="cuda", rotary_dim=rot)


def test_reference_is_the_model_formula():
    """The reference equals RMSNorm then rotate-half RoPE written out plainly, in f64."""
    gen = torch.Generator().manual_seed(0)
    n, h, d = 3, 2, 8
    x = torch.randn(n, h, d, generator=gen, dtype=torch.float64)
    w = torch.randn(d, generator=gen, dtype=torch.float64)
    cos, sin = rope_tables(torch.arange(n)[None], d, 1e4, torch.float64)
    got, _ = ops.qk_norm_rope(
        x.float(),
        x.float(),
        w.float(),
        w.float(),
        cos.float(),
        sin.float(),
        1e-6,
        backend="reference",
    )
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    half = d // 2
    rotate_half = torch.cat([-y[..., half:], y[..., :half]], -1)
    # unsigned
    plain_sin = sin.reshape(n, 1, d) * torch.cat([-torch.ones(half), torch.ones(half)]).double()
    want = y * cos.reshape(n, 1, d) + rotate_half * plain_sin
    assert torch.allclose(got.double(), want, atol=1e-5), float((got.double() - want).abs().max())


def test_partial_rotary_is_the_model_formula():
    """rotary_dim R < D: transformers' apply_rotary_pos_emb with cos / sin of R dims (Qwen3-Next,
    Qwen3.5: partial_rotary_factor) rotates the first R dims rotate-half within R and passes the
    rest; the norm is over all D. rotary_dim = D is the full form, bit for bit."""
    gen = torch.Generator().manual_seed(0)
    n, h, d, r = 3, 2, 16, 4
    x = torch.randn(n, h, d, generator=gen, dtype=torch.float64)
    w = torch.randn(d, generator=gen, dtype=torch.float64)
    cos, sin = rope_tables(torch.arange(5, 5 + n)[None], r, 1e4, torch.float64)
    got, _ = ops.qk_norm_rope(
        x.float(),
        x.float(),
        w.float(),
        w.float(),
        cos.float(),
        sin.float(),
        1e-6,
        rotary_dim=r,
        backend="reference",
    )
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    yr = y[..., :r]
    rotate_half = torch.cat([-yr[..., r // 2 :], yr[..., : r // 2]], -1)
    plain_sin = sin.reshape(n, 1, r) * torch.cat([-torch.ones(r // 2), torch.ones(r // 2)]).double()
    want = torch.cat([yr * cos.reshape(n, 1, r) + rotate_half * plain_sin, y[..., r:]], -1)
    assert torch.allclose(got.double(), want, atol=1e-5), float((got.double() - want).abs().max())
    full_cos, full_sin = rope_tables(torch.arange(n)[None], d, 1e4, torch.float32)
    for backend in backends.available_backends("qk_norm_rope", torch.device("cpu"), torch.float32):
        a = ops.qk_norm_rope(
            x.float(), x.float(), w.float(), w.float(), full_cos, full_sin, 1e-6, backend=backend
        )
        b = ops.qk_norm_rope(
            x.float(),
            x.float(),
            w.float(),
            w.float(),
            full_cos,
            full_sin,
            1e-6,
            rotary_dim=d,
            backend=backend,
        )
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_bad_arguments_name_themselves():
    q = torch.randn(2, 4, 8)
    k = torch.randn(2, 1, 8)
    w = torch.ones(8)
    cos = torch.ones(2, 8)
    with pytest.raises(ValueError, match="k must be"):
        ops.qk_norm_rope(q, torch.randn(3, 1, 8), w, w, cos, cos, 1e-6)
    with pytest.raises(ValueError, match="D must be even"):
        ops.qk_norm_rope(
            torch.randn(2, 4, 7),
            torch.randn(2, 1, 7),
            torch.ones(7),
            torch.ones(7),
            torch.ones(2, 7),
            torch.ones(2, 7),
            1e-6,
        )
    with pytest.raises(ValueError, match="k_weight must hold 8 elements"):
        ops.qk_norm_rope(q, k, w, torch.ones(4), cos, cos, 1e-6)
    with pytest.raises(ValueError, match="sin must hold 16 elements"):
        ops.qk_norm_rope(q, k, w, w, cos, torch.ones(3, 8), 1e-6)
    with pytest.raises(TypeError, match="k must have q's dtype"):
        ops.qk_norm_rope(q, k.half(), w, w, cos, cos, 1e-6)
    with pytest.raises(ValueError, match="eps"):
        ops.qk_norm_rope(q, k, w, w, cos, cos, -1.0)
    short = torch.ones(2, 4)
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        ops.qk_norm_rope(q, k, w, w, short, short, 1e-6, rotary_dim=3)
    with pytest.raises(ValueError, match=r"rotary_dim must be an int \[2, 8\]"):
        ops.qk_norm_rope(q, k, w, w, short, short, 1e-6, rotary_dim=10)
    with pytest.raises(TypeError, match="rotary_dim must be an int"):
        ops.qk_norm_rope(q, k, w, w, short, short, 1e-6, rotary_dim=4.0)
    with pytest.raises(ValueError, match=r"cos must hold 8 elements \(N \* rotary_dim\)"):
        ops.qk_norm_rope(q, k, w, w, cos, cos, 1e-6, rotary_dim=4)
    # odd D with an even rotary part
    ops.qk_norm_rope(
        torch.randn(2, 4, 7),
        torch.randn(2, 1, 7),
        torch.ones(7),
        torch.ones(7),
        short,
        short,
        1e-6,
        rotary_dim=4,
    )


def test_bad_cache_arguments_name_themselves_and_write_nothing():
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    w, cos = torch.ones(8), torch.ones(2, 8)
    kc, vc, slots = torch.zeros(5, 8), torch.zeros(5, 8), torch.tensor([0, 3])

    def call(**kw):
        args = {"k_cache": kc, "v_cache": vc, "slots": slots, "v": v} | kw
        return ops.qk_norm_rope(q, k, w, w, cos, cos, 1e-6, **args)

    with pytest.raises(ValueError, match="go together: v_cache, v not given"):
        call(v_cache=None, v=None)
    with pytest.raises(TypeError, match="slots must be int32 or int64"):
        call(slots=slots.float())
    with pytest.raises(ValueError, match=r"slots must be \[N = 2\]"):
        call(slots=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"k_cache must be \[S, Hk \* D = 8\]"):
        call(k_cache=torch.zeros(5, 16))
    with pytest.raises(ValueError, match="v_cache must be"):
        call(v_cache=torch.zeros(4, 8))
    with pytest.raises(TypeError, match="v_cache must have q's dtype"):
        call(v_cache=vc.half())
    with pytest.raises(ValueError, match="v must be"):
        call(v=torch.randn(3, 8))
    with pytest.raises(ValueError, match="k_cache must have contiguous rows"):
        call(k_cache=torch.zeros(8, 5).t())
    assert not kc.any() and not vc.any()  # nothing written by a refused call
    call()
    assert kc[[0, 3]].any() and not kc[[1, 2, 4]].any() and torch.equal(vc[[0, 3]], v.reshape(2, 8))
    q0, k0 = ops.qk_norm_rope(
        q[:0], k[:0], w, w, cos[:0], cos[:0], 1e-6, k_cache=kc, v_cache=vc, slots=slots[:0], v=v[:0]
    )
    assert q0.shape == (0, 4, 8) and k0.shape == (0, 1, 8)  # no tokens: nothing written


def test_qwen3_5_mrope_is_plain_rope_for_text():
    """Qwen3.5's multimodal RoPE (mrope_section) on text positions -- three equal rows -- gives
    exactly the 1-D tables of rope_tables over the rotary dim; distinct rows would not."""
    hf = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

    cfg = Qwen3_5MoeTextConfig(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=256,
        vocab_size=10,
        num_hidden_layers=1,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1e7,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
        },
    )
    emb = hf.Qwen3_5MoeTextRotaryEmbedding(cfg)
    positions = torch.tensor([[0, 5, 100, 40000]])
    x = torch.zeros(1, 4, 64)
    cos, sin = emb(x, positions)
    want_cos, want_sin = rope_tables(positions, 64, 1e7, torch.float32)
    assert torch.equal(cos, want_cos[:, :, 0])
    # ours is signed
    assert torch.equal(sin * torch.cat([-torch.ones(32), torch.ones(32)]), want_sin[:, :, 0])
    spatial, _ = emb(x, torch.stack([positions, 2 * positions, 3 * positions]))
    assert not torch.equal(spatial, want_cos[:, :, 0])

"""``validate=False`` on the ops a decode step calls (the models' calls, a DecodePlan's ``checks``):
on arguments the checks pass, every backend returns the bits of the checked call, on the layouts the
models hand over (views of a fused projection, ``[B, T, 1, R]`` rope tables, v as ``[N, Hv, D]``, a
slot-indexed cache viewed per sequence, weights of another dtype) and on plain ones; and the models
run with the checks on give the logits they give with them off (their calls pass every check)."""

import pytest
import torch

from ftlab import ops
from ftlab.models import DecodePlan
from ftlab.models.layers import rope_tables
from ftlab.models.pipeline import Pipeline
from ftlab.quant import Q4_0Weight

CASES = [("cpu", b) for b in ("reference", "triton")] + [
    pytest.param("cuda", b, marks=pytest.mark.gpu, id=f"cuda-{b}")
    for b in ("reference", "triton", "hip")
]


def same(a, b) -> None:
    """Equal bits, through tuples and Q8_1 / QuantWeight-like records."""
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    else:
        same(tuple(vars(a).values()), tuple(vars(b).values()))


def both(fn, *args, **kwargs) -> None:
    same(fn(*args, **kwargs, validate=True), fn(*args, **kwargs, validate=False))


def fused_qkv(device, n, hq, hk, d, dtype, gen):
    qkv = torch.randn(n, (hq + 2 * hk) * d, generator=gen).to(dtype).to(device)
    q = qkv[:, : hq * d].view(n, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)
    v = qkv[:, (hq + hk) * d :].view(n, hk, d)
    return q, k, v


@pytest.mark.parametrize("device, backend", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_norm_rope_unvalidated(device, backend, dtype):
    gen = torch.Generator().manual_seed(0)
    n, hq, hk, d = 3, 4, 2, 64
    q, k, v = fused_qkv(device, n, hq, hk, d, dtype, gen)
    qw, kw = (
        (1 + 0.1 * torch.randn(d, generator=gen)).to(device),
        (1 + 0.1 * torch.randn(d, generator=gen)).to(device),
    )
    for rot in (None, 16):
        r = d if rot is None else rot
        # [1, N, 1, R]
        cos, sin = rope_tables(torch.arange(5, 5 + n, device=device)[None], r, 1e6, dtype)
        # fp32 weights: cast
        both(ops.qk_norm_rope, q, k, qw, kw, cos, sin, 1e-6, rotary_dim=rot, backend=backend)
        kc, vc = (
            torch.zeros(2, 8, hk * d, dtype=dtype, device=device),
            torch.zeros(2, 8, hk * d, dtype=dtype, device=device),
        )
        caches = []
        # each call writes its own copy of the caches (row stride 2 * 8 ... any: a view)
        for _ in range(2):
            kc2, vc2 = kc.clone().view(16, hk * d), vc.clone().view(16, hk * d)
            caches.append((kc2, vc2))
        slots = torch.tensor([3, -1, 9], device=device)
        outs = [
            ops.qk_norm_rope(
                q,
                k,
                qw,
                kw,
                cos,
                sin,
                1e-6,
                rotary_dim=rot,
                k_cache=kc2,
                v_cache=vc2,
                slots=slots,
                v=v,
                backend=backend,
                validate=check,
            )
            for (kc2, vc2), check in zip(caches, (True, False), strict=True)
        ]
        same(outs[0], outs[1])
        same(caches[0], caches[1])


@pytest.mark.parametrize("device, backend", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_and_router_unvalidated(device, backend, dtype):
    gen = torch.Generator().manual_seed(1)
    t, h, e = 2, 256, 16
    base = torch.randn(t, 2 * h, generator=gen).to(dtype).to(device)
    x, res = base[:, :h], base[:, h:]  # views with a row stride past H
    w = (1 + 0.1 * torch.randn(h, generator=gen)).to(dtype).to(device)
    router = torch.randn(e, h, generator=gen).to(dtype).to(device)
    both(ops.add_rmsnorm, x, res, w, 1e-6, backend=backend)
    both(ops.add_rmsnorm, x, None, w.float(), 1e-5, backend=backend)
    both(ops.add_rmsnorm_router_topk, x, res, w, 1e-6, router, 4, True, backend=backend)
    both(
        ops.add_rmsnorm_router_topk,
        x.contiguous(),
        res.contiguous(),
        w,
        1e-6,
        router,
        2,
        False,
        backend=backend,
    )


@pytest.mark.parametrize("device, backend", CASES)
def test_matmuls_and_experts_unvalidated(device, backend):
    gen = torch.Generator().manual_seed(2)
    m, k, n, e, inter, top = 1, 256, 96, 8, 64, 2
    x = torch.randn(m, 2 * k, generator=gen).to(device)[:, :k]  # a strided row
    w = ops.quantize_q4_0(torch.randn(n, k, generator=gen).to(device))
    both(ops.q4_0_matmul, x, w, backend=backend)
    both(
        ops.q4_0_matmul,
        x,
        w,
        backend=backend,
        x_q8=ops.quantize_q8_1(x.contiguous(), backend=backend),
    )
    both(ops.quant_matmul, x, w, backend=backend)  # a Q4_0Weight goes through q4_0_matmul
    gu = ops.quantize_q4_0(torch.randn(e, 2 * inter, k, generator=gen).to(device))
    dn = ops.quantize_q4_0(torch.randn(e, k, inter, generator=gen).to(device))
    assert isinstance(gu, Q4_0Weight)
    wts = torch.rand(m, top, generator=gen).to(device)
    ids = torch.tensor([[5, -1]], device=device)  # int64, one slot outside [0, E)
    both(ops.moe_experts, x, gu, dn, wts, ids, backend=backend)
    both(
        ops.moe_experts,
        x,
        ops.dequantize_q4_0(gu),
        ops.dequantize_q4_0(dn),
        wts,
        ids.int(),
        backend=backend,
    )


@pytest.mark.parametrize("device, backend", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_unvalidated(device, backend, dtype):
    gen = torch.Generator().manual_seed(3)
    b, h, kvh, d, slots = 2, 8, 2, 128, 40
    q = torch.randn(b, h, d, generator=gen).to(dtype).to(device)
    # the static cache's layout
    cache_k = torch.randn(b * slots, kvh * d, generator=gen).to(dtype).to(device)
    cache_v = torch.randn(b * slots, kvh * d, generator=gen).to(dtype).to(device)
    k, v = cache_k.view(b, slots, kvh, d), cache_v.view(b, slots, kvh, d)
    lengths = torch.tensor([33, 7], device=device)
    both(ops.decode_attention, q, k, v, lengths, backend=backend)
    both(ops.decode_attention, q, k, v, lengths.int(), scale=0.05, backend=backend, quantize=True)
    # heads not contiguous
    kt = torch.randn(b, kvh, slots, d, generator=gen).to(dtype).to(device).transpose(1, 2)
    both(ops.decode_attention, q, kt, v, lengths, backend=backend)


@pytest.mark.parametrize("device, backend", CASES)
def test_unvalidated_layouts_a_backend_cannot_read_are_refused(device, backend):
    """validate=False skips the ops' checks; each backend's entry still refuses, naming the
    argument, the shapes it cannot read (a head count KVH does not divide, a K unlike w's), where it
    would otherwise give a result of another shape or an unnamed error."""
    gen = torch.Generator().manual_seed(4)
    q, k = (
        torch.randn(1, 3, 8, generator=gen).to(device),
        torch.randn(1, 5, 2, 8, generator=gen).to(device),
    )
    lengths = torch.tensor([5], device=device)
    for args, message in [
        ((q, k, k, lengths), r"k must be \[B, S, KVH, D\] with KVH dividing q's 3 heads"),
        ((q[:, :2], k, k[:, :4], lengths), r"v must have k's 5 positions, got 4"),
        ((q[:, :2], k, k, lengths[:0]), r"lengths must have shape \(1,\), got \(0,\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            ops.decode_attention(*args, backend=backend, validate=False)
    x = torch.randn(2, 224, generator=gen).to(device)
    w = torch.randn(16, 256, generator=gen).to(device)
    k_unlike_w = r"x must be 2-D \[M, K\] with w's K = 256 columns .*, got shape \(2, 224\)"
    for weight in (ops.quantize(w, "Q8_0"), ops.quantize_q4_0(w)):
        for path in ("int8", "dequant") if backend != "hip" else ("int8",):
            with pytest.raises(ValueError, match=k_unlike_w):
                ops.quant_matmul(x, weight, path=path, backend=backend, validate=False)
    with pytest.raises(ValueError, match=k_unlike_w):
        ops.q4_0_matmul(x, ops.quantize_q4_0(w), backend=backend, validate=False)


def test_models_pass_the_op_checks(monkeypatch):
    """The models' op calls run with the checks on (DecodePlan(checks=True)) raise nothing and give
    the logits they give with them off: prefill, then decode steps, Qwen3-MoE (dense and Q4_0) and a
    hybrid model (Q4_0). The checks do not depend on the backend: the reference serves (the Triton
    interpreter takes minutes for these models)."""
    backend = "reference"
    for name, quant in (
        ("tiny-qwen3-moe-wide", "f32"),
        ("tiny-qwen3-moe-wide", "q4_0"),
        ("tiny-qwen35-moe", "q4_0"),
    ):
        runs = []
        for checks in (False, True):
            pipe = Pipeline.load(
                name, backends=backend, quant=quant, plan=DecodePlan(checks=checks)
            )
            ids = pipe.tokenizer.encode("Every operator has a reference")
            runs.append([pipe.prefill(ids[:4])] + [pipe.decode_step(t) for t in ids[4:8]])
        for a, b in zip(*runs, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)

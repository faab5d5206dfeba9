"""Qwen3Moe's decode-step fusions (its DecodePlan's choices) against the separate ops they
replace, through the same backend: the KV cache written by ops.qk_norm_rope's launch
(``kv_store_in_rope``) against ops.store, and the post-attention add and norm inside
ops.add_rmsnorm_router_topk (``norm_in_router``) against add_rmsnorm then router_topk: the same
bits, and the replaced launch gone."""

import pytest
import torch

from ftlab.models import DecodePlan
from ftlab.models.pipeline import Pipeline


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_kv_store_in_rope_equals_the_store_op(monkeypatch, backend):
    """The KV cache written by ops.qk_norm_rope's launch (kv_store_in_rope) gives the bits of
    the separate ops.store: prefill, then decode steps, through one backend; "store" named
    apart keeps the separate op."""
    ids = Pipeline.load("tiny-qwen3-moe-wide").tokenizer.encode("Every operator has a reference")
    runs = []
    for fused in (False, True):
        plan = DecodePlan(kv_store_in_rope=fused)
        pipe = Pipeline.load(
            "tiny-qwen3-moe-wide", backends={"qk_norm_rope": backend, "store": backend}, plan=plan
        )
        runs.append([pipe.prefill(ids[:3])] + [pipe.decode_step(t) for t in ids[3:]])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_kv_store_in_rope_replaces_the_store_launch(monkeypatch):
    """Under kv_store_in_rope (the default) the model calls ops.store no more (the cache is written
    by qk_norm_rope), unless the backends map names a store backend of its own."""
    from ftlab import ops

    assert DecodePlan().kv_store_in_rope
    stores = []
    real = ops.store
    monkeypatch.setattr(ops, "store", lambda *a, **k: stores.append(1) or real(*a, **k))
    pipe = Pipeline.load("tiny-qwen3-moe-wide")
    pipe.prefill(pipe.tokenizer.encode("Every operator"))
    assert stores == []
    apart = Pipeline.load(
        "tiny-qwen3-moe-wide", backends={"store": "reference", "qk_norm_rope": "triton"}
    )
    apart.prefill(apart.tokenizer.encode("Every operator"))
    assert stores


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_norm_in_router_equals_norm_then_router(monkeypatch, backend):
    """The post-attention add and norm inside the router's op (norm_in_router) give the bits
    of add_rmsnorm then router_topk: prefill, then decode steps, and every stage of a pass."""
    ids = Pipeline.load("tiny-qwen3-moe-wide").tokenizer.encode("Every operator has a reference")
    runs, stages = [], []
    for fused in (False, True):
        pipe = Pipeline.load(
            "tiny-qwen3-moe-wide",
            backends={"add_rmsnorm": backend, "router_topk": backend},
            plan=DecodePlan(norm_in_router=fused),
        )
        stages.append(list(pipe.stages("Every operator")))
        runs.append([pipe.prefill(ids[:3])] + [pipe.decode_step(t) for t in ids[3:]])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(*stages, strict=True):
        assert a.name == b.name and all(
            torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors
        ), a.name


# Triton's bits: tests/property/test_q4_0_norm_matvec.py
@pytest.mark.parametrize("backend", ["reference"])
def test_norm_in_qkv_equals_norm_then_matvec(monkeypatch, backend):
    """Each layer's input add and norm inside its q/k/v matvec (norm_in_qkv, the Q4_0 file)
    give the bits of add_rmsnorm then q4_0_matmul: a 3-token prefill (the fused op, which falls
    back to the two ops past one row), then decode steps."""
    from ftlab import ops

    ids = Pipeline.load("tiny-qwen3-moe", quant="q4_0").tokenizer.encode(
        "Every operator has a reference"
    )
    runs, calls = [], []
    real = ops.add_rmsnorm_q4_0_matmul
    monkeypatch.setattr(
        ops, "add_rmsnorm_q4_0_matmul", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    for fused in (False, True):
        plan = DecodePlan(norm_in_qkv="always" if fused else "never")
        pipe = Pipeline.load(
            "tiny-qwen3-moe",
            quant="q4_0",
            backends={"add_rmsnorm": backend, "q4_0_matmul": backend},
            plan=plan,
        )
        runs.append([pipe.prefill(ids[:3])] + [pipe.decode_step(t) for t in ids[3:]])
        assert bool(calls) == fused
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_hip_attention_picks_the_backend():
    """The plan's hip_attention turns only "auto" to hip, and only on a GPU where the planner gives
    the call hip's one-launch kernel (fp16 / bf16, head dim 128 or 256, at most 8 query heads a
    key head); a named backend stays."""
    from ftlab.models import kv_cache

    q, kv = (
        torch.zeros(1, 8, 128, dtype=torch.bfloat16),
        torch.zeros(1, 16, 2, 128, dtype=torch.bfloat16),
    )
    assert kv_cache.hip_attention(DecodePlan(), "auto", q, kv, kv, {}) == "auto"
    assert kv_cache.hip_attention(DecodePlan(), "triton", q, kv, kv, {}) == "triton"


def _head_dim_128_model(dev: torch.device):
    """A 2-layer bf16 Qwen3-MoE of head dim 128 (8 / 2 heads) with random Q4_0 weights: the shape
    hip's one-launch decode attention takes."""
    from ftlab.bench.model import random_model
    from ftlab.models.qwen3_moe import Qwen3MoeConfig

    config = Qwen3MoeConfig(
        vocab_size=512,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
    )
    return config, random_model(config, dev)


@pytest.mark.gpu
def test_hip_decode_attention_in_the_model_gpu(monkeypatch):
    """Under hip_attention="always" a bf16 model of head dim 128 attends each decode step through
    ops.decode_attention's hip kernel: the logits of backends={"decode_attention": "hip"} bit for
    bit (prefill, then decode steps), and a graph-replayed step equals the eager one."""
    from ftlab import ops
    from ftlab.models.pipeline import DecodeGraph
    from ftlab.models.qwen3_moe import Qwen3Moe

    dev = torch.device("cuda")
    config, weights = _head_dim_128_model(dev)
    gen = torch.Generator(device=dev).manual_seed(3)
    tokens = torch.randint(0, config.vocab_size, (1, 40), device=dev, generator=gen)
    calls = []
    real = ops.decode_attention
    monkeypatch.setattr(
        ops, "decode_attention", lambda *a, **k: calls.append(k.get("backend")) or real(*a, **k)
    )
    runs = []
    for flag, backends in ((True, {}), (False, {"decode_attention": "hip"})):
        plan = DecodePlan(backends, hip_attention="always" if flag else "never")
        model = Qwen3Moe(config, weights, max_batch=1, max_seq_len=64, static=True, plan=plan)
        out = [model.forward(tokens[:, :20], torch.arange(20, device=dev)[None]).clone()]
        out += [
            model.forward(tokens[:, p : p + 1], torch.full((1, 1), p, device=dev)).clone()
            for p in range(20, 40)
        ]
        runs.append(out)
    assert calls and set(calls) == {"hip"} and len(calls) == 2 * 20 * config.num_hidden_layers
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    graph = DecodeGraph(model, 1)
    for p in range(40, 50):
        replayed = graph(tokens[:, p - 40 : p - 39], torch.full((1, 1), p, device=dev)).clone()
        assert torch.equal(
            replayed, model.forward(tokens[:, p - 40 : p - 39], torch.full((1, 1), p, device=dev))
        )


@pytest.mark.gpu
def test_eager_decode_takes_hip_attention_gpu(monkeypatch):
    """Under hip_attention="eager" an eager decode step of a bf16 model of head dim 128 attends
    through hip's kernel, a captured one through SDPA; under plan.attention_as_captured() the eager
    step takes SDPA too and equals the replayed step bit for bit; the eager step again, its
    attention held to the reference's in every layer, gives the same bits."""
    import ftlab.testing as ft
    from ftlab import ops
    from ftlab.models.pipeline import DecodeGraph
    from ftlab.models.qwen3_moe import Qwen3Moe

    dev = torch.device("cuda")
    config, weights = _head_dim_128_model(dev)
    gen = torch.Generator(device=dev).manual_seed(4)
    tokens = torch.randint(0, config.vocab_size, (1, 30), device=dev, generator=gen)
    model = Qwen3Moe(
        config,
        weights,
        max_batch=1,
        max_seq_len=64,
        static=True,
        plan=DecodePlan(hip_attention="eager"),
    )
    model.forward(tokens[:, :20], torch.arange(20, device=dev)[None])
    graph = DecodeGraph(model, 1)
    calls = []
    real = ops.decode_attention
    monkeypatch.setattr(
        ops, "decode_attention", lambda *a, **k: calls.append(k.get("backend")) or real(*a, **k)
    )
    for p in range(20, 30):
        tok, pos = tokens[:, p : p + 1], torch.full((1, 1), p, device=dev)
        replayed = graph(tok, pos).clone()
        assert calls == []  # the replay launches no Python
        eager = model.forward(tok, pos).clone()
        assert calls == ["hip"] * config.num_hidden_layers
        calls.clear()
        with model.planned(model.plan.attention_as_captured()):
            same = model.forward(tok, pos).clone()
        assert calls == [] and torch.equal(replayed, same)
        with ft.decode_attention_held_to_reference() as held:
            again = model.forward(tok, pos).clone()
        assert [h[0] for h in held] == ["hip"] * config.num_hidden_layers
        assert all(over == 0 for _, over, _ in held) and torch.equal(again, eager)
        calls.clear()


@pytest.mark.gpu
def test_attention_q8_for_o_proj_in_the_model_gpu(monkeypatch):
    """Under attention_q8 (hip_attention "always") hip's decode attention writes its
    output's Q8_1 and the Q4_0 o_proj matvec takes it instead of quantizing its input: the same
    arithmetic, so the logits equal those with the flag off bit for bit (eager decode steps, and a
    graph-replayed step equals the eager one)."""
    from ftlab import ops
    from ftlab.models.pipeline import DecodeGraph
    from ftlab.models.qwen3_moe import Qwen3Moe

    dev = torch.device("cuda")
    config, weights = _head_dim_128_model(dev)
    gen = torch.Generator(device=dev).manual_seed(4)
    tokens = torch.randint(0, config.vocab_size, (2, 60), device=dev, generator=gen)
    given = []
    real = ops.q4_0_matmul
    monkeypatch.setattr(
        ops, "q4_0_matmul", lambda *a, **k: given.append(k.get("x_q8") is not None) or real(*a, **k)
    )
    runs = []
    for flag in (True, False):
        plan = DecodePlan(hip_attention="always", attention_q8=flag)
        model = Qwen3Moe(config, weights, max_batch=2, max_seq_len=96, static=True, plan=plan)
        out = [
            model.forward(tokens[:, :30], torch.arange(30, device=dev)[None].expand(2, -1)).clone()
        ]
        out += [
            model.forward(tokens[:, p : p + 1], torch.full((2, 1), p, device=dev)).clone()
            for p in range(30, 60)
        ]
        runs.append(out)
    # the flag's decode steps: every layer's o_proj
    assert sum(given) == 30 * config.num_hidden_layers
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    model.plan = model.plan.with_(attention_q8=True)
    graph = DecodeGraph(model, 2)
    for p in range(60, 70):
        tok, pos = tokens[:, p - 60 : p - 59], torch.full((2, 1), p, device=dev)
        assert torch.equal(graph(tok, pos).clone(), model.forward(tok, pos))


@pytest.mark.gpu
def test_decode_graph_keeps_its_model_alive_gpu():
    """A DecodeGraph of a model no one else holds: the graph keeps the model (its KV cache and
    weights) alive, so a replay after the caller dropped it reads live memory."""
    import gc
    import weakref

    from ftlab.models.pipeline import DecodeGraph, Pipeline
    from ftlab.models.qwen3_moe import Qwen3Moe

    pipe = Pipeline.load("tiny-qwen3-moe", "cuda", quant="q4_0")
    graph = DecodeGraph(
        Qwen3Moe(pipe.config, pipe.weights, max_batch=1, max_seq_len=64, static=True), 1
    )
    model = weakref.ref(graph.model)
    gc.collect()
    assert model() is not None  # nothing but the graph holds it
    junk = torch.full((1 << 24,), float("nan"), device="cuda")  # would land where a freed cache was
    tokens = torch.tensor([[5]], device="cuda")
    for p in range(4):
        replayed = graph(tokens, torch.tensor([[p]], device="cuda")).clone()
        assert torch.isfinite(replayed).all()
        assert torch.equal(
            replayed, graph.model.forward(tokens, torch.tensor([[p]], device="cuda"))
        )
    del junk

"""Qwen3Moe's decode-step fusions against the separate ops they replace, through the same backend:
the KV cache written by ops.qk_norm_rope's launch (layers.KV_STORE_IN_ROPE) against ops.store,
and the post-attention add and norm inside ops.add_rmsnorm_router_topk (layers.NORM_IN_ROUTER)
against add_rmsnorm then router_topk: the same bits, and the replaced launch gone."""

import pytest
import torch

from ftlab.models.pipeline import Pipeline


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_kv_store_in_rope_equals_the_store_op(monkeypatch, backend):
    """The KV cache written by ops.qk_norm_rope's launch (layers.KV_STORE_IN_ROPE) gives the bits of
    the separate ops.store: prefill, then decode steps, through one backend; "store" named
    apart keeps the separate op."""
    from ftlab.models import layers

    ids = Pipeline.load("tiny-qwen3-moe-wide").tokenizer.encode("Every operator has a reference")
    runs = []
    for fused in (False, True):
        monkeypatch.setattr(layers, "KV_STORE_IN_ROPE", fused)
        pipe = Pipeline.load("tiny-qwen3-moe-wide", backends={"qk_norm_rope": backend, "store": backend})
        runs.append([pipe.prefill(ids[:3])] + [pipe.decode_step(t) for t in ids[3:]])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_kv_store_in_rope_replaces_the_store_launch(monkeypatch):
    """Under layers.KV_STORE_IN_ROPE the model calls ops.store no more (the cache is written by
    qk_norm_rope), unless the backends map names a store backend of its own."""
    from ftlab import ops
    from ftlab.models import layers

    monkeypatch.setattr(layers, "KV_STORE_IN_ROPE", True)
    stores = []
    real = ops.store
    monkeypatch.setattr(ops, "store", lambda *a, **k: stores.append(1) or real(*a, **k))
    pipe = Pipeline.load("tiny-qwen3-moe-wide")
    pipe.prefill(pipe.tokenizer.encode("Every operator"))
    assert stores == []
    apart = Pipeline.load("tiny-qwen3-moe-wide", backends={"store": "reference", "qk_norm_rope": "triton"})
    apart.prefill(apart.tokenizer.encode("Every operator"))
    assert stores


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_norm_in_router_equals_norm_then_router(monkeypatch, backend):
    """The post-attention add and norm inside the router's op (layers.NORM_IN_ROUTER) give the bits
    of add_rmsnorm then router_topk: prefill, then decode steps, and every stage of a pass."""
    from ftlab.models import layers

    ids = Pipeline.load("tiny-qwen3-moe-wide").tokenizer.encode("Every operator has a reference")
    runs, stages = [], []
    for fused in (False, True):
        monkeypatch.setattr(layers, "NORM_IN_ROUTER", fused)
        pipe = Pipeline.load("tiny-qwen3-moe-wide", backends={"add_rmsnorm": backend, "router_topk": backend})
        stages.append(list(pipe.stages("Every operator")))
        runs.append([pipe.prefill(ids[:3])] + [pipe.decode_step(t) for t in ids[3:]])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(*stages, strict=True):
        assert a.name == b.name and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors), a.name


@pytest.mark.parametrize("backend", ["reference"])  # Triton's bits: tests/property/test_q4_0_norm_matvec.py
def test_norm_in_qkv_equals_norm_then_matvec(monkeypatch, backend):
    """Each layer's input add and norm inside its q/k/v matvec (layers.NORM_IN_QKV, the Q4_0 file)
    give the bits of add_rmsnorm then q4_0_matmul: a 3-token prefill (the fused op, which falls
    back to the two ops past one row), then decode steps."""
    from ftlab import ops
    from ftlab.models import layers

    ids = Pipeline.load("tiny-qwen3-moe", quant="q4_0").tokenizer.encode("Every operator has a reference")
    runs, calls = [], []
    real = ops.add_rmsnorm_q4_0_matmul
    monkeypatch.setattr(ops, "add_rmsnorm_q4_0_matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    for fused in (False, True):
        monkeypatch.setattr(layers, "NORM_IN_QKV", fused)
        pipe = Pipeline.load("tiny-qwen3-moe", quant="q4_0", backends={"add_rmsnorm": backend, "q4_0_matmul": backend})
        runs.append([pipe.prefill(ids[:3])] + [pipe.decode_step(t) for t in ids[3:]])
        assert bool(calls) == fused
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_decode_attention_hip_flag_picks_the_backend():
    """layers.DECODE_ATTENTION_HIP turns only "auto" to hip, and only on a GPU for the shapes of
    hip's one-launch kernel (fp16 / bf16, head dim 128 or 256, at most 8 query heads a key head);
    a named backend stays."""
    from ftlab.models import layers

    cpu = torch.zeros(1, 8, 128, dtype=torch.bfloat16)
    assert layers.decode_attention_backend("auto", cpu, 4, {}) == "auto"
    assert layers.decode_attention_backend("triton", cpu, 4, {}) == "triton"


@pytest.mark.gpu
def test_hip_decode_attention_in_the_model_gpu(monkeypatch):
    """Under layers.DECODE_ATTENTION_HIP a bf16 model of head dim 128 attends each decode step through
    ops.decode_attention's hip kernel: the logits of backends={"decode_attention": "hip"} bit for
    bit (prefill, then decode steps), and a graph-replayed step equals the eager one."""
    from ftlab import ops
    from ftlab.bench.model import random_model
    from ftlab.models import layers
    from ftlab.models.pipeline import DecodeGraph
    from ftlab.models.qwen3_moe import Qwen3Moe, Qwen3MoeConfig

    dev = torch.device("cuda")
    config = Qwen3MoeConfig(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=8,
                            num_key_value_heads=2, head_dim=128, num_experts=8, num_experts_per_tok=2,
                            moe_intermediate_size=64)  # fmt: skip
    weights = random_model(config, dev)
    gen = torch.Generator(device=dev).manual_seed(3)
    tokens = torch.randint(0, config.vocab_size, (1, 40), device=dev, generator=gen)
    calls = []
    real = ops.decode_attention
    monkeypatch.setattr(ops, "decode_attention", lambda *a, **k: calls.append(k.get("backend")) or real(*a, **k))
    runs = []
    for flag, backends in ((True, None), (False, {"decode_attention": "hip"})):
        monkeypatch.setattr(layers, "DECODE_ATTENTION_HIP", flag)
        model = Qwen3Moe(config, weights, max_batch=1, max_seq_len=64, static=True, backends=backends)
        out = [model.forward(tokens[:, :20], torch.arange(20, device=dev)[None]).clone()]
        out += [model.forward(tokens[:, p:p + 1], torch.full((1, 1), p, device=dev)).clone() for p in range(20, 40)]
        runs.append(out)
    assert calls and set(calls) == {"hip"} and len(calls) == 2 * 20 * config.num_hidden_layers
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    monkeypatch.setattr(layers, "DECODE_ATTENTION_HIP", True)
    graph = DecodeGraph(model, 1)
    for p in range(40, 50):
        replayed = graph(tokens[:, p - 40:p - 39], torch.full((1, 1), p, device=dev)).clone()
        assert torch.equal(replayed, model.forward(tokens[:, p - 40:p - 39], torch.full((1, 1), p, device=dev)))

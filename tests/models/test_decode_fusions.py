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

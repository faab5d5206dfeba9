"""Qwen3Moe with its KV cache written by ops.qk_norm_rope's launch (layers.KV_STORE_IN_ROPE)
against the separate ops.store: the same bits, and no store launch."""

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

"""Decode steps repeat bit for bit on the bench's shape (Qwen3-30B-A3B, 8 of its 48 layers, random
Q4_0 weights, every cache slot filled, position 512): over many token draws, two eager steps through
the captured kernels are equal, a replay of the captured step equals them, and so does the eager
step as the pipeline launches it (the fused norm and q/k/v matvec, same bits by contract). torch's
SDPA on cuDNN parted from itself here on the H200 (benchmarks/NOTES.md, "Graph against eager decode:
cuDNN's attention"): one draw gives no evidence, hence the draws, batch 1 and 8."""

from dataclasses import replace

import pytest
import torch


@pytest.fixture(scope="module")
def bench_shape():
    from ftlab.bench.model import CONFIG, random_model

    config = replace(CONFIG, num_hidden_layers=8)
    return config, random_model(config, torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
def test_decode_steps_repeat_bit_for_bit_gpu(bench_shape, batch):
    from ftlab.bench.model import fill_cache
    from ftlab.models.decode_steps import DecodeGraph
    from ftlab.models.qwen3_moe import Qwen3Moe

    config, weights = bench_shape
    dev = torch.device("cuda")
    model = Qwen3Moe(config, weights, max_batch=batch, max_seq_len=520, static=True)
    fill_cache(model.cache)
    graph = DecodeGraph(model, batch)
    gen = torch.Generator().manual_seed(batch)
    pos = torch.full((batch, 1), 512, device=dev)
    parted = []
    for draw in range(40):
        tok = torch.randint(0, config.vocab_size, (batch, 1), generator=gen).to(dev)
        with model.planned(model.plan.as_captured()):
            first = model.forward(tok, pos).clone()
            second = model.forward(tok, pos).clone()
        replayed = graph(tok, pos).clone()
        eager = model.forward(tok, pos)
        assert torch.isfinite(first).all()
        if not (
            torch.equal(first, second)
            and torch.equal(replayed, first)
            and torch.equal(eager, first)
        ):
            parted.append(draw)
    assert parted == [], f"draws whose steps parted: {parted}"

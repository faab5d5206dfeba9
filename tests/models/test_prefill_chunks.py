"""Pipeline.prefill in chunks (``Pipeline.prefill_chunk``): a prompt run in chunks of any size
gives the logits and the cache (seen through the decode steps after it) of one pass, on every
model family; a prompt's start attends over its own keys (``geo["fresh"]``), later chunks over
the live positions only."""

import pytest
import torch

from ftlab.models.pipeline import Pipeline

pytestmark = pytest.mark.usefixtures("module_cache_dir")  # tiny models built in a fresh cache

MODELS = ["tiny-qwen3-moe", "tiny-qwen35-moe", "tiny-qwen3-next"]


def run(pipe: Pipeline, ids: torch.Tensor, chunk: int, steps: int = 3) -> list[torch.Tensor]:
    """The prefill's logits, then those of ``steps`` greedy decode steps."""
    pipe.prefill_chunk = chunk
    out = [pipe.prefill(ids)]
    assert pipe.position == ids.numel()
    for _ in range(steps):
        out.append(pipe.decode_step(int(out[-1].argmax())))
    return out


@pytest.mark.parametrize("name", MODELS)
def test_chunks_give_the_one_pass_logits(name):
    pipe = Pipeline.load(name, quant="f32", max_seq_len=40)
    ids = torch.randint(pipe.config.vocab_size, (17,), generator=torch.Generator().manual_seed(1))
    whole = run(pipe, ids, 4096)
    for chunk in (1, 5, 16):
        got = run(pipe, ids, chunk)
        for i, (a, b) in enumerate(zip(got, whole, strict=True)):
            scale = b.abs().max()
            assert torch.allclose(a, b, atol=1e-4 * scale, rtol=0), (chunk, i, (a - b).abs().max())


def test_a_prompts_start_is_fresh_and_a_later_chunk_reads_the_live_positions():
    pipe = Pipeline.load("tiny-qwen3-moe", quant="f32", max_seq_len=40)
    cache, dtype = pipe.model.cache, torch.float32
    start = cache.geometry(torch.arange(6)[None], 8, 1e4, dtype)
    later = cache.geometry(torch.arange(6, 10)[None], 8, 1e4, dtype)
    step = cache.geometry(torch.tensor([[10]]), 8, 1e4, dtype)
    assert start["fresh"] and not later["fresh"] and not step["fresh"]
    assert later["span"] == 10 and not later["whole"]


def test_prefill_chunk_is_checked():
    pipe = Pipeline.load("tiny-qwen3-moe", quant="f32")
    pipe.prefill_chunk = 0
    with pytest.raises(ValueError, match="prefill_chunk must be an int >= 1, got 0"):
        pipe.prefill([1, 2, 3])
    assert pipe.position == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
@pytest.mark.parametrize("name", MODELS)
def test_chunks_give_the_one_pass_logits_with_graphs_gpu(name):
    """The static model (graphs on): a later chunk reads the live positions, not every slot."""
    pipe = Pipeline.load(name, "cuda", quant="f32", max_seq_len=64)
    assert pipe.graph_capturable
    ids = torch.randint(pipe.config.vocab_size, (33,), generator=torch.Generator().manual_seed(2))
    whole = run(pipe, ids, 4096)
    got = run(pipe, ids, 8)
    for a, b in zip(got, whole, strict=True):
        assert torch.allclose(a, b, atol=1e-3 * b.abs().max(), rtol=0), (a - b).abs().max()

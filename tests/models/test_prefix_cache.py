"""The prefix cache (:mod:`ftlab.models.prefix_cache`): a prompt that shares a prefix with an
earlier one (a snapshot's, or the pipeline's live sequence: the next turn of a conversation)
resumes after it, and its logits and greedy tokens equal a full recompute's -- at random cut
points, on every model family (attention-only, and with the recurrent delta-rule state); the
memory budget, the KV copies shared along a line of prompts, eviction; the bench's prefill rows
timing new prompts."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlab.models.pipeline import Pipeline
from ftlab.models.prefix_cache import PrefixCache, common_prefix, cuts

pytestmark = pytest.mark.usefixtures("module_cache_dir")  # tiny models built in a fresh cache

MODELS = ["tiny-qwen3-moe", "tiny-qwen35-moe", "tiny-qwen3-next"]
_PIPES: dict = {}


def pipes(name: str) -> tuple[Pipeline, Pipeline]:
    """(with a prefix cache snapshotting every 8 tokens, without one): one pair a model."""
    if name not in _PIPES:
        cached = Pipeline.load(name, quant="f32", max_seq_len=96)
        cached.prefix_cache.every = 8
        cached.prefill_chunk = 12  # chunks that do not line up with the snapshots
        plain = Pipeline.load(name, quant="f32", max_seq_len=96, prefix_cache_bytes=0)
        _PIPES[name] = cached, plain
    return _PIPES[name]


def steps(pipe: Pipeline, ids: list[int], n: int = 3) -> tuple[list[torch.Tensor], list[int]]:
    """The prefill's logits and ``n`` greedy decode steps': (logits, tokens)."""
    out = [pipe.prefill(ids)]
    tokens = []
    for _ in range(n):
        tokens.append(int(out[-1].argmax()))
        out.append(pipe.decode_step(tokens[-1]))
    return out, tokens


def assert_near(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        scale = b.abs().max()
        assert torch.allclose(a, b, atol=1e-4 * scale, rtol=0), (i, float((a - b).abs().max()))


def random_ids(pipe: Pipeline, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(pipe.config.vocab_size, (n,), generator=g).tolist()


@pytest.mark.parametrize("name", MODELS)
@settings(max_examples=6, deadline=None)
@given(
    first=st.integers(1, 40),
    shared=st.integers(0, 40),
    rest=st.integers(1, 20),
    seed=st.integers(0, 2**16),
)
def test_a_shared_prefix_resumes_and_equals_a_full_recompute(name, first, shared, rest, seed):
    cached, plain = pipes(name)
    a = random_ids(cached, first, seed)
    shared = min(shared, first)
    b = a[:shared] + random_ids(cached, rest, seed + 1)
    for prompt in (a, b, a):
        got, got_tokens = steps(cached, prompt)
        want, want_tokens = steps(plain, prompt)
        assert_near(got, want)
        assert got_tokens == want_tokens
    # the last prompt is a's again: taken whole from its snapshot (with the logits after it)
    assert cached.reused == len(a)


@pytest.mark.parametrize("name", MODELS)
def test_where_a_prompt_resumes(name):
    """A recurrent model resumes at the last snapshot within the shared prefix (every 8 tokens,
    and each prompt's end), an attention-only one at the shared prefix itself."""
    cached, _ = pipes(name)
    cached.prefix_cache.clear()
    cached.reset()
    a = random_ids(cached, 30, 5)
    cached.prefill(a)
    assert cached.reused == 0
    assert [s.position for s in cached.prefix_cache.snapshots] == [8, 16, 24, 30]
    b = a[:21] + random_ids(cached, 5, 6)
    cached.prefill(b)
    recurrent = name != "tiny-qwen3-moe"
    assert cached.reused == (16 if recurrent else 21)
    cached.prefill(a[:27])  # from a's snapshot at 24, or a's KV slots (b's live ones end at 21)
    assert cached.reused == (24 if recurrent else 26)


@pytest.mark.parametrize("name", MODELS)
def test_a_conversations_next_turn_continues_the_live_sequence(name):
    cached, plain = pipes(name)
    cached.prefix_cache.clear()  # only the live sequence to resume from
    cached.prefix_cache.budget, budget = 0, cached.prefix_cache.budget
    try:
        turn = random_ids(cached, 11, 7)
        assert "".join(cached.generate(turn, 6, ignore_eos=True))  # the answer's text
        held = cached.tokens  # the turn, then the 6 tokens generated (each fed to a step)
        assert held[: len(turn)] == turn and len(held) == len(turn) + 6
        nxt = held + random_ids(cached, 4, 8)
        got, _ = steps(cached, nxt)
        assert cached.reused == len(held)
        want, _ = steps(plain, nxt)
        assert_near(got, want)
    finally:
        cached.prefix_cache.budget = budget


def test_the_budget_evicts_the_least_recently_used_and_shares_kv_along_a_line():
    pipe = Pipeline.load("tiny-qwen35-moe", quant="f32", max_seq_len=96)
    cache = pipe.prefix_cache
    cache.every = 8
    a = random_ids(pipe, 32, 9)
    pipe.prefill(a)
    # the snapshots at 8, 16, 24 and 32 read one KV copy of a's 32 positions
    assert [s.position for s in cache.snapshots] == [8, 16, 24, 32]
    assert len(cache.copies) == 1 and len(cache.copies[0].tokens) == 32
    one = cache.snapshots[0].nbytes
    kv_per_token = cache.copies[0].nbytes // 32
    # a longer prompt of the same line extends that copy in place
    pipe.prefill(a + random_ids(pipe, 8, 10))
    assert len(cache.copies) == 1 and len(cache.copies[0].tokens) == 40
    # a budget of three snapshots and 24 positions of KV: the older ones go, the copy is cut back
    cache.budget = 3 * one + 24 * kv_per_token
    pipe.prefill(a[:20])  # a's snapshot at 16 used again, then one at 20 for this prompt
    assert cache.nbytes <= cache.budget
    kept = sorted(s.position for s in cache.snapshots)
    assert 16 in kept and 20 in kept and 40 not in kept
    assert len(cache.copies[0].tokens) == max(kept)
    # a snapshot larger than the budget is not kept, and nothing is evicted for it
    cache.budget = one + 5 * kv_per_token
    before = [s.position for s in cache.snapshots]
    pipe.prefill(random_ids(pipe, 90, 11))
    assert [s.position for s in cache.snapshots] == before


def test_no_budget_keeps_nothing():
    pipe = Pipeline.load("tiny-qwen3-moe", quant="f32", prefix_cache_bytes=0)
    ids = random_ids(pipe, 20, 12)
    pipe.prefill(ids)
    pipe.prefill(random_ids(pipe, 5, 13))
    pipe.prefill(ids)
    assert pipe.prefix_cache.snapshots == [] and pipe.reused == 0


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"prefix_cache_bytes must be an int >= 0, got -1"):
        Pipeline.load("tiny-qwen3-moe", prefix_cache_bytes=-1)
    with pytest.raises(TypeError, match=r"prefix_cache_bytes must be an int >= 0, got 1.5"):
        Pipeline.load("tiny-qwen3-moe", prefix_cache_bytes=1.5)
    with pytest.raises(ValueError, match=r"snapshot_every must be an int >= 1, got 0"):
        PrefixCache(every=0)


@given(
    a=st.lists(st.integers(0, 3), max_size=12),
    b=st.lists(st.integers(0, 3), max_size=12),
)
def test_common_prefix(a, b):
    n = common_prefix(a, b)
    assert a[:n] == b[:n] and (n == min(len(a), len(b)) or a[n] != b[n])


@given(
    start=st.integers(0, 50),
    n=st.integers(1, 80),
    chunk=st.integers(1, 20),
    every=st.one_of(st.none(), st.integers(1, 20)),
)
def test_cuts_cover_the_prompt_in_chunks_cut_at_the_snapshots(start, n, chunk, every):
    got = cuts(start, n, chunk, every)
    if start >= n:
        assert got == []
        return
    assert got[0][0] == start and got[-1][1] == n
    assert all(a < b <= a + chunk for a, b in got)
    assert all(x[1] == y[0] for x, y in itertools.pairwise(got))
    if every:
        ends = {b for _, b in got}
        assert all(m in ends for m in range(every, n, every) if m > start)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
@pytest.mark.parametrize("name", MODELS)
def test_a_shared_prefix_resumes_with_graphs_gpu(name):
    """The static model (graphs on): restored KV slots and recurrent state are read by the
    captured decode step in place."""
    cached = Pipeline.load(name, "cuda", quant="f32", max_seq_len=128)
    plain = Pipeline.load(name, "cuda", quant="f32", max_seq_len=128, prefix_cache_bytes=0)
    cached.prefix_cache.every = 16
    assert cached.graph_capturable
    a = random_ids(cached, 50, 14)
    b = a[:37] + random_ids(cached, 9, 15)
    for prompt in (a, b, a, b):
        got, got_tokens = steps(cached, prompt, 4)
        want, want_tokens = steps(plain, prompt, 4)
        for x, y in zip(got, want, strict=True):
            assert torch.allclose(x, y, atol=1e-3 * y.abs().max(), rtol=0)
        assert got_tokens == want_tokens
    assert cached.reused == len(b)  # b again: whole, from its snapshot


@pytest.mark.parametrize("name", MODELS)
def test_memory_names_what_the_pipeline_holds(name):
    pipe = Pipeline.load(name, quant="f32", max_seq_len=48)
    c = pipe.config
    empty = pipe.memory()
    pipe.prefill(random_ids(pipe, 20, 16))
    mem = pipe.memory()
    layers = len(pipe.model.cache.k)
    width = pipe.model.cache.k[0].shape[1] if layers else 0
    assert mem["kv_cache"] == 2 * layers * 48 * width * 4
    assert mem["weights"] >= c.vocab_size * c.hidden_size * 4  # the embedding at least
    assert (mem["recurrent_state"] > 0) == (name != "tiny-qwen3-moe")
    assert empty["prefix_cache"] == 0 and mem["prefix_cache"] == pipe.prefix_cache.nbytes > 0
    assert mem["total"] == sum(v for k, v in mem.items() if k != "total")

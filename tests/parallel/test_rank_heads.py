"""A tensor-parallel rank of a Qwen3-MoE model reads only its attention heads: the loaders take
``heads=((q_start, q_stop), (kv_start, kv_stop))`` (GGUF: ``attn_q`` / ``attn_k`` / ``attn_v``
rows cut from the mapped file before any cast, ``attn_output`` columns whole blocks of each row, or
read whole when the cut falls inside a block; HF: safetensors slices of the rows and columns,
copied), ``rank_heads`` gives the range from the config (None for the hybrid models, whose
attention is read whole), and the shard keeps such projections as they are, giving the shard of a
full load. Everything else loads as without a range."""

import dataclasses
import re
import warnings
from pathlib import Path

import pytest
import torch

from ftlab.models import tiny
from ftlab.models.loader import load_gguf_model, load_hf
from ftlab.models.pipeline import rank_heads, rank_ranges
from ftlab.models.qwen3_moe import load_gguf
from ftlab.models.tensor_parallel import (
    ShardDequantizedWarning,
    TensorParallel,
    columns,
    rows,
    shard_qwen3_moe,
    whole_blocks,
)
from ftlab.quant import QuantWeight
from tests.parallel.test_rank_experts import same
from tests.parallel.test_rank_experts_next import owns_its_memory
from tests.parallel.test_rank_vocab import gguf_path, kept, quiet, rewritten, same_tree

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_cpp"
GGUF_MOE = [
    LLAMA / "qwen3moe-q4_0.gguf",
    LLAMA / "qwen3moe-q4_k_m.gguf",
    LLAMA / "qwen3moe-q8_0.gguf",
    ("tiny-qwen3-moe", "model-f32.gguf"),
    ("tiny-qwen3-moe", "model-q4_0.gguf"),
    ("tiny-qwen3-moe-wide", "model-f32.gguf"),
]
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
pytestmark = pytest.mark.usefixtures("module_cache_dir")


def same_but_heads(c, full, part, heads) -> None:
    """``part`` is ``full`` with each layer's q/k/v cut to the rows of ``heads`` and o_proj to the
    query heads' columns (or whole, a packed o_proj whose cut falls inside its blocks); a dense
    cut of its own memory."""
    (q0, q1), (k0, k1) = heads
    hd = c.head_dim
    for lf, lp in zip(full.layers, part.layers, strict=True):
        same(lp.q_proj, rows(lf.q_proj, q0 * hd, q1 * hd))
        same(lp.k_proj, rows(lf.k_proj, k0 * hd, k1 * hd))
        same(lp.v_proj, rows(lf.v_proj, k0 * hd, k1 * hd))
        if whole_blocks(lf.o_proj, q0 * hd, q1 * hd):
            same(lp.o_proj, columns(lf.o_proj, q0 * hd, q1 * hd, "o_proj"))
        else:
            same(lp.o_proj, lf.o_proj)
        for w in (lp.q_proj, lp.o_proj):
            assert isinstance(w, QuantWeight) or owns_its_memory(w)
    unchanged = dict.fromkeys(PROJ)
    same_tree(
        [dataclasses.replace(lw, **unchanged) for lw in part.layers],
        [dataclasses.replace(lw, **unchanged) for lw in full.layers],
    )
    same_tree(dataclasses.replace(part, layers=None), dataclasses.replace(full, layers=None))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "spec", GGUF_MOE, ids=lambda s: s.name if isinstance(s, Path) else "/".join(s)
)
def test_gguf_rows_and_columns_of_the_heads(spec, dtype):
    """llama.cpp's files (one kv head: replicated; Q4_K / Q6_K o_proj cut inside its blocks of
    256, read whole) and the tiny ones (F32, Q4_0: over 4 ranks o_proj's 16 columns fall inside
    its blocks of 32), a rank of 2 and of 4 where they divide the heads: the rows and columns of
    the full load."""
    path = gguf_path(spec)
    c, full = quiet(load_gguf, path, dtype=dtype, progress=False)
    for world in (w for w in (2, 4) if c.num_attention_heads % w == 0):
        heads = rank_heads(path, TensorParallel(world // 2, world))
        c2, part = quiet(load_gguf, path, dtype=dtype, progress=False, heads=heads)
        assert c2 == c and heads[0] != (0, c.num_attention_heads)
        same_but_heads(c, full, part, heads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-qwen3-moe-wide"])
def test_hf_rows_and_columns_of_the_heads(name, dtype):
    root = tiny.ensure(name)
    c, full = load_hf(root, dtype=dtype, progress=False)
    heads = rank_heads(root, TensorParallel(0, 2))
    c2, part = load_hf(root, dtype=dtype, progress=False, heads=heads)
    assert c2 == c and part.layers[0].q_proj.dtype == dtype
    same_but_heads(c, full, part, heads)


def test_hf_stored_bf16_heads_own_their_memory(tmp_path):
    """Stored bf16, loaded bf16 (no cast to copy them): the slices are copied all the same."""
    path = rewritten(tiny.ensure("tiny-qwen3-moe"), tmp_path, lambda k, t: t.bfloat16())
    c, full = load_hf(path, dtype=torch.bfloat16, progress=False)
    heads = ((2, 4), (1, 2))
    _, part = load_hf(path, dtype=torch.bfloat16, progress=False, heads=heads)
    same_but_heads(c, full, part, heads)
    assert owns_its_memory(part.layers[0].k_proj) and owns_its_memory(part.layers[0].o_proj)


WHOLE = "heads must be ((start, stop), (start, stop)) of the query and key/value heads"
Q, KV = "heads[0] (the query heads)", "heads[1] (the key/value heads)"
BAD = [
    ((0, 2), WHOLE),
    (((0, 2),), WHOLE),
    (((0, 2), (0, 1), (0, 1)), WHOLE),
    ([(0, 2), (0, 1)], WHOLE),
    (((2, 1), (0, 1)), Q),
    (((0, 5), (0, 1)), Q),
    (((0.0, 2), (0, 1)), Q),
    (((0, 2), (0, 3)), KV),
    (((0, 2), (-1, 1)), KV),
    (((0, 2), (True, 2)), KV),
    (((0, 2), [0, 1]), WHOLE),
]


@pytest.mark.parametrize("bad, what", BAD)
def test_hostile_heads_are_refused(bad, what):
    """Of the tiny model's 4 query heads and 2 kv heads, by the GGUF and HF loaders: the error
    names ``heads`` (the part), the expectation and what came."""
    moe = tiny.ensure("tiny-qwen3-moe")
    if what == WHOLE:
        message = re.escape(f"{WHOLE}, got {bad!r}")
    else:
        count, got = (4, bad[0]) if what == Q else (2, bad[1])
        message = re.escape(
            f"{what} must be (start, stop) with 0 <= start < stop <= {count}, got {got!r}"
        )
    for load in (
        lambda: load_gguf(moe / "model-q4_0.gguf", progress=False, heads=bad),
        lambda: load_gguf_model(moe / "model-f32.gguf", progress=False, heads=bad),
        lambda: load_hf(moe, progress=False, heads=bad),
    ):
        with pytest.raises(ValueError, match=message):
            load()


@pytest.mark.parametrize("name", ["tiny-qwen35-moe", "tiny-qwen3-next"])
def test_hybrid_models_read_their_attention_whole(name):
    """rank_heads gives None for them, and their loaders refuse a range."""
    root = tiny.ensure(name)
    assert rank_heads(root, TensorParallel(0, 2)) is None
    assert rank_heads(root / "model-q4_0.gguf", TensorParallel(0, 2)) is None
    for load in (
        lambda: load_hf(root, progress=False, heads=((0, 1), (0, 1))),
        lambda: load_gguf_model(root / "model-q4_0.gguf", progress=False, heads=((0, 1), (0, 1))),
    ):
        with pytest.raises(
            ValueError, match=r"heads must be None for a Qwen3-Next / Qwen3\.5-MoE checkpoint"
        ):
            load()


def test_rank_heads_from_the_config():
    """The rank's equal share of the query heads and its kv heads (replicated when fewer than
    the ranks), from config.json or the GGUF metadata; None for a path of neither kind."""
    moe = tiny.ensure("tiny-qwen3-moe")  # 4 heads, 2 kv heads
    for path in (moe, moe / "model-q4_0.gguf"):
        assert [rank_heads(path, TensorParallel(r, 2)) for r in range(2)] == [
            ((0, 2), (0, 1)),
            ((2, 4), (1, 2)),
        ]
        assert [rank_heads(path, TensorParallel(r, 4))[1] for r in range(4)] == [
            (0, 1),
            (0, 1),
            (1, 2),
            (1, 2),
        ]
    c, _ = load_gguf(LLAMA / "qwen3moe-q4_0.gguf", progress=False)
    half = c.num_attention_heads // 2
    assert rank_heads(LLAMA / "qwen3moe-q4_0.gguf", TensorParallel(1, 2)) == (
        (half, 2 * half),
        (0, 1),
    )
    assert rank_heads(moe / "tokenizer.json", TensorParallel(0, 2)) is None
    with pytest.raises(ValueError, match=r"tp = 3 must divide num_attention_heads \(4\)"):
        rank_heads(moe, TensorParallel(0, 3))


SHARDS = [
    ("tiny-qwen3-moe", "hf", 2),
    ("tiny-qwen3-moe", "hf", 4),
    ("tiny-qwen3-moe-wide", "f32", 2),
    ("tiny-qwen3-moe", "q4_0", 2),
    ("tiny-qwen3-moe", "q4_0", 4),
    (LLAMA / "qwen3moe-q4_k_m.gguf", None, 2),
    (LLAMA / "qwen3moe-q4_0.gguf", None, 2),
]


@pytest.mark.parametrize(
    "name, quant, world", SHARDS, ids=lambda s: s.name if isinstance(s, Path) else str(s)
)
def test_shard_of_a_load_of_the_heads(name, quant, world):
    """Loaded with the rank's experts, vocabulary rows and heads (rank_ranges, rank_heads), the
    shard equals the shard of a full load, the projections loaded cut kept as they are (a packed
    o_proj read whole because its cut falls inside a block: made dense in both)."""
    path = (
        name
        if quant is None
        else tiny.ensure(name)
        if quant == "hf"
        else tiny.ensure(name) / f"model-{quant}.gguf"
    )
    tp, cpu = TensorParallel(rank=world - 1, world=world), torch.device("cpu")
    experts, vocab = rank_ranges(path, tp)
    heads = rank_heads(path, tp)

    def load(**kw):
        if path.is_dir():
            return load_hf(path, dtype=torch.float32, progress=False, **kw)
        return quiet(load_gguf_model, path, dtype=torch.float32, progress=False, **kw)[:2]

    (c, full), (_, part) = load(), load(experts=experts, vocab=vocab, heads=heads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShardDequantizedWarning)
        want, got = shard_qwen3_moe(c, full, tp, cpu), shard_qwen3_moe(c, part, tp, cpu)
    same_tree(got, want)
    hd = c.head_dim
    for lp, lg in zip(part.layers, got.layers, strict=True):
        assert (
            kept(lg.q_proj, lp.q_proj)
            and kept(lg.v_proj, lp.v_proj)
            or heads[1] == (0, c.num_key_value_heads)
        )
        assert kept(lg.o_proj, lp.o_proj) == whole_blocks(
            lp.o_proj, heads[0][0] * hd, heads[0][1] * hd
        )


def test_shard_refuses_a_projection_of_neither_size():
    """A q_proj of neither all the heads' rows nor the rank's: the error names the layer and
    tensor."""
    c, w = load_hf(tiny.ensure("tiny-qwen3-moe"), dtype=torch.float32, progress=False)
    lw = w.layers[0]
    for field, bad, what in (
        ("q_proj", lw.q_proj[:-1], "layer 0 q_proj of 63 rows"),
        ("o_proj", lw.o_proj[:, :-1], "layer 0 o_proj of 63 columns"),
    ):
        broken = dataclasses.replace(
            w, layers=[dataclasses.replace(lw, **{field: bad}), *w.layers[1:]]
        )
        with pytest.raises(ValueError, match=f"{what} is neither all 64 nor this rank's 32"):
            shard_qwen3_moe(c, broken, TensorParallel(0, 2), torch.device("cpu"))

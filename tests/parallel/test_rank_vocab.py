"""A tensor-parallel rank reads only its vocabulary rows of the embedding and of an untied lm_head:
every loader takes ``vocab=(start, stop)`` (GGUF, Qwen3-MoE and Qwen3-Next / Qwen3.5-MoE alike:
``token_embd`` / ``output`` cut from the mapped file as read, packed or float, before the embedding
is dequantized or anything cast; HF: a safetensors slice of the rows, copied), ``rank_ranges``
gives the range from the config, and the shard keeps such an embedding and lm_head as they are (a
tied one tied), giving the shard of a full load. Everything else loads as without a range."""

import dataclasses
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gguf import GGMLQuantizationType as QT
from safetensors import safe_open
from safetensors.torch import save_file

from ftlab import ops
from ftlab.formats import CheckpointError, DequantizedWarning
from ftlab.formats.hf import SafetensorsShards
from ftlab.models import tiny
from ftlab.models.loader import load_gguf_model, load_hf
from ftlab.models.pipeline import rank_experts, rank_ranges
from ftlab.models.qwen3_moe import load_gguf, save_gguf
from ftlab.models.qwen3_next import read_gguf_hf
from ftlab.models.qwen3_next.hf import HFTensors
from ftlab.models.tensor_parallel import (
    ShardDequantizedWarning,
    TensorParallel,
    rows,
    shard_qwen3_moe,
    shard_qwen3_next,
    vocab_rows,
)
from ftlab.quant import QuantWeight
from tests.parallel.test_rank_experts import same
from tests.parallel.test_rank_experts_next import owns_its_memory, refused_by_every_loader

# the vocabulary of the tiny models, tests/data/llama_cpp's and tests/data/gguf_qwen3_next's files
V = 384
SPAN = (V // 4, V // 2)  # rows inside the vocabulary: both ends cut
LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_cpp"
DATA = Path(__file__).resolve().parents[1] / "data" / "gguf_qwen3_next"
pytestmark = pytest.mark.usefixtures("module_cache_dir")


def same_tree(a, b) -> None:
    """Two weight trees (dataclasses, lists, tensors, packed weights) equal leaf by leaf."""
    if isinstance(a, torch.Tensor | QuantWeight):
        same(a, b)
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same_tree(x, y)
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b)
        for f in dataclasses.fields(a):
            same_tree(getattr(a, f.name), getattr(b, f.name))
    else:
        assert a == b


def same_but_vocab(full, part, v0: int, v1: int) -> None:
    """``part`` (ModelWeights or NextWeights) is ``full`` with the embedding and lm_head cut to
    rows v0..v1 (a tied lm_head the embedding still), its dense embedding of its own memory."""
    same(part.embed, full.embed[v0:v1])
    assert owns_its_memory(part.embed)
    if full.lm_head is full.embed:
        assert part.lm_head is part.embed
    else:
        same(part.lm_head, rows(full.lm_head, v0, v1))
    same_tree(
        dataclasses.replace(part, embed=None, lm_head=None),
        dataclasses.replace(full, embed=None, lm_head=None),
    )


@pytest.fixture
def dequantized(monkeypatch) -> list:
    """The shapes of the packed weights ops dequantizes while the test runs."""
    seen = []

    def recorded(op):
        def record(w, *args, **kw):
            seen.append(tuple(w.shape))
            return op(w, *args, **kw)

        return record

    for name in ("dequantize", "dequantize_q4_0"):
        monkeypatch.setattr(ops, name, recorded(getattr(ops, name)))
    return seen


def kept(got, loaded) -> bool:
    """``got`` is ``loaded`` (a packed weight: its bytes), not a copy."""
    data = lambda w: w.data if isinstance(w, QuantWeight) else w
    return data(got) is data(loaded)


def quiet(load, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DequantizedWarning)  # llama-quantize's Q4_K_M: Q5_0 tensors
        return load(*args, **kw)


GGUF_MOE = [
    LLAMA / "qwen3moe-q4_0.gguf",
    LLAMA / "qwen3moe-q4_k_m.gguf",
    LLAMA / "qwen3moe-q8_0.gguf",
    ("tiny-qwen3-moe", "model-f32.gguf"),
    ("tiny-qwen3-moe", "model-q4_0.gguf"),
    ("tiny-qwen3-moe-wide", "model-f32.gguf"),
]


def gguf_path(spec) -> Path:
    return spec if isinstance(spec, Path) else tiny.ensure(spec[0]) / spec[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "spec", GGUF_MOE, ids=lambda s: s.name if isinstance(s, Path) else "/".join(s)
)
def test_gguf_rows_of_the_vocabulary(spec, dtype, dequantized):
    """llama.cpp's files (packed Q4_0 / Q4_K / Q8_0 embedding, Q6_K / Q8_0 lm_head) and the tiny
    ones (F32, a Q4_0 lm_head; wide: tied): the rows of the full load; a packed embedding is
    dequantized for the rows only, never whole."""
    path = gguf_path(spec)
    c, full = load_gguf(path, dtype=dtype, progress=False)
    dequantized.clear()
    c2, part = load_gguf(path, dtype=dtype, progress=False, vocab=SPAN)
    assert c2 == c and c.vocab_size == V
    same_but_vocab(full, part, *SPAN)
    assert (V, c.hidden_size) not in dequantized
    if isinstance(spec, Path):  # llama.cpp's token_embd is packed: the rows dequantized
        assert (SPAN[1] - SPAN[0], c.hidden_size) in dequantized


def tied_gguf(tmp_path: Path, qtype) -> Path:
    """tiny-qwen3-moe as a tied file, its token_embd of ``qtype`` (the lm_head too, then)."""
    c, w = load_gguf(
        tiny.ensure("tiny-qwen3-moe") / "model-f32.gguf", dtype=torch.float32, progress=False
    )
    c = dataclasses.replace(c, tie_word_embeddings=True)
    w = dataclasses.replace(w, lm_head=w.embed)
    return save_gguf(tmp_path / f"tied-{qtype.name}.gguf", c, w, types={"token_embd.weight": qtype})


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q8_0])
def test_gguf_tied_packed_embedding(qtype, tmp_path, dequantized):
    """A tied file with a packed token_embd: the embedding its rows dequantized, the lm_head its
    packed rows; the shard of that load is the shard of a full one, the lm_head kept as loaded."""
    path = tied_gguf(tmp_path, qtype)
    c, full = load_gguf(path, progress=False, dtype=torch.float32)
    assert (
        c.tie_word_embeddings
        and isinstance(full.lm_head, QuantWeight)
        and full.lm_head.qtype == qtype.name
    )
    dequantized.clear()
    _, part = load_gguf(path, progress=False, dtype=torch.float32, vocab=SPAN)
    same_but_vocab(full, part, *SPAN)
    assert set(dequantized) == {(SPAN[1] - SPAN[0], c.hidden_size)}
    tp = TensorParallel(1, 2)
    experts, vocab = rank_ranges(path, tp)
    _, cut = load_gguf(path, progress=False, dtype=torch.float32, experts=experts, vocab=vocab)
    got = shard_qwen3_moe(c, cut, tp, torch.device("cpu"))
    same_tree(got, shard_qwen3_moe(c, full, tp, torch.device("cpu")))
    assert kept(got.lm_head, cut.lm_head) and kept(got.embed, cut.embed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "name", ["tiny-qwen3-moe", "tiny-qwen3-moe-wide", "tiny-qwen35-moe", "tiny-qwen3-next"]
)
def test_hf_rows_of_the_vocabulary(name, dtype):
    """HF directories of every model class, untied and tied (wide, qwen3-next), kept fp32 or
    cast to bf16: the rows of the full load, of their own memory."""
    root = tiny.ensure(name)
    c, full = load_hf(root, dtype=dtype, progress=False)
    c2, part = load_hf(root, dtype=dtype, progress=False, vocab=SPAN)
    assert c2 == c and c.vocab_size == V and part.embed.dtype == dtype
    assert (part.lm_head is part.embed) == c.tie_word_embeddings
    same_but_vocab(full, part, *SPAN)
    if part.lm_head is not part.embed:
        assert owns_its_memory(part.lm_head)


@pytest.mark.parametrize("name", ["tiny-qwen35-moe", "tiny-qwen3-next"])
def test_hf_quantized_at_load_rows_of_the_vocabulary(name):
    """quantize=True: an untied lm_head's rows quantized to Q4_0 are the rows of the quantized
    one."""
    _, full = load_hf(tiny.ensure(name), progress=False, quantize=True)
    _, part = load_hf(tiny.ensure(name), progress=False, quantize=True, vocab=SPAN)
    same_but_vocab(full, part, *SPAN)


def rewritten(root: Path, tmp_path: Path, change) -> Path:
    """A copy of the HF directory ``root`` with its tensors ``change(name, tensor)``, in
    ``tmp_path``."""
    tmp_path.mkdir(exist_ok=True)
    (file,) = root.glob("*.safetensors")
    with safe_open(str(file), "pt") as f:
        state = {k: change(k, f.get_tensor(k)) for k in f.keys()}
    save_file(state, str(tmp_path / file.name))
    for other in ("config.json", "tokenizer.json"):
        shutil.copy(root / other, tmp_path / other)
    return tmp_path


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-qwen35-moe"])
def test_hf_stored_bf16_rows_own_their_memory(name, tmp_path):
    """Stored bf16 and loaded in the stored dtype (no cast to copy it): the slices are copied,
    not views of the mapped file's tensor; so are HFTensors' rows, in the stored dtype."""
    path = rewritten(tiny.ensure(name), tmp_path, lambda k, t: t.bfloat16())
    _, full = load_hf(path, dtype=torch.bfloat16, progress=False)
    _, part = load_hf(path, dtype=torch.bfloat16, progress=False, vocab=SPAN)
    same_but_vocab(full, part, *SPAN)
    assert part.embed.dtype == torch.bfloat16 and owns_its_memory(part.lm_head)
    tensors = HFTensors(SafetensorsShards(path), vocab=SPAN, vocab_size=V)
    whole = HFTensors(SafetensorsShards(path))["lm_head.weight"]
    got = tensors["lm_head.weight"]
    assert (
        torch.equal(got, whole[SPAN[0] : SPAN[1]])
        and got.dtype == torch.bfloat16
        and owns_its_memory(got)
    )


def test_hf_embedding_of_the_wrong_size_is_refused(tmp_path):
    """Read with a range too: the stored shape is checked, not the slice's."""
    extra = lambda k, t: torch.cat([t, t[:1]]) if "embed_tokens" in k else t
    moe = rewritten(tiny.ensure("tiny-qwen3-moe"), tmp_path / "moe", extra)
    nxt = rewritten(tiny.ensure("tiny-qwen35-moe"), tmp_path / "next", extra)
    for vocab in (None, (0, 192)):
        with pytest.raises(
            CheckpointError,
            match=r"embed_tokens\.weight' has shape \(385, 64\), expected \(384, 64\)",
        ):
            load_hf(moe, progress=False, vocab=vocab)
    with pytest.raises(
        CheckpointError, match=r"has shape \(385, 256\), expected 384 rows \(the vocabulary\)"
    ):
        load_hf(nxt, progress=False, vocab=(0, 192))
    with pytest.raises(CheckpointError, match=r"has shape \(385, 256\), expected \(384, 256\)"):
        load_hf(nxt, progress=False)


@pytest.mark.parametrize(
    "file",
    [
        "qwen35moe-hv2.gguf",
        "qwen35moe-hv1.gguf",
        "qwen3next-hv2.gguf",
        "qwen35moe-hv2-q4_0.gguf",
        "qwen35moe-hv2-q4_k_m.gguf",
    ],
)
def test_gguf_hf_tensors_of_the_vocabulary(file, dequantized):
    """The converter's files (F32; hv1: tied, an MTP block; Q4_0 embedding, Q8_0 lm_head; Q4_K_M's
    Q5_0 embedding, which the reader dequantizes whole): the embedding and lm_head are the full
    read's rows (a packed embedding dequantized for those only), every other tensor as read
    without a range."""
    config, full, perms = quiet(read_gguf_hf, DATA / file, dtype=torch.float32)
    dequantized.clear()
    config2, part, perms2 = quiet(read_gguf_hf, DATA / file, dtype=torch.float32, vocab=SPAN)
    assert config2 == config and config["vocab_size"] == V and part.keys() == full.keys()
    assert perms2.keys() == perms.keys()
    cut = ["model.embed_tokens.weight", "lm_head.weight"]
    for name, value in full.items():
        same(part[name], rows(value, *SPAN) if name in cut else value)
    assert owns_its_memory(part["model.embed_tokens.weight"])
    assert (V, config["hidden_size"]) not in dequantized


@pytest.mark.parametrize("name", ["tiny-qwen35-moe", "tiny-qwen3-next"])
@pytest.mark.parametrize(
    "quant, dtype",
    [
        ("f32", torch.float32),
        ("f32", torch.bfloat16),
        ("q4_0", torch.float32),
        ("q4_0", torch.bfloat16),
    ],
)
def test_gguf_next_model_of_the_vocabulary(name, quant, dtype):
    """The tiny hybrid models' GGUF files through load_gguf_model (qwen3-next tied): the rows."""
    path = tiny.ensure(name) / f"model-{quant}.gguf"
    c, full, _ = load_gguf_model(path, dtype=dtype, progress=False)
    c2, part, _ = load_gguf_model(path, dtype=dtype, progress=False, vocab=SPAN)
    assert c2 == c and (part.lm_head is part.embed) == c.tie_word_embeddings
    same_but_vocab(full, part, *SPAN)


BAD = [(2, 1), (0, 0), (-1, 2), (0, V + 1), [0, 1], (0.0, 1), (True, 2), (0, 1, 2), (1,)]


@pytest.mark.parametrize("bad", BAD)
def test_hostile_ranges_are_refused(bad):
    """Of the tiny models' vocabulary of 384, by every loader (the experts' test's)."""
    refused_by_every_loader("vocab", bad, V)


def test_rank_ranges_from_the_config():
    """The experts rank_experts gives and the rank's equal share of the vocabulary, for every model
    class from config.json or the GGUF metadata; None for a path of neither kind."""
    tp = TensorParallel(rank=1, world=2)
    paths = [
        tiny.ensure("tiny-qwen3-moe"),
        tiny.ensure("tiny-qwen3-moe") / "model-q4_0.gguf",
        LLAMA / "qwen3moe-q4_k_m.gguf",
        tiny.ensure("tiny-qwen35-moe"),
        tiny.ensure("tiny-qwen3-next") / "model-f32.gguf",
    ]
    for path in paths:
        experts, vocab = rank_ranges(path, tp)
        assert (
            experts == rank_experts(path, tp) and experts[1] > experts[0] and vocab == (V // 2, V)
        )
    assert rank_ranges(paths[0], TensorParallel(rank=0, world=4))[1] == (0, V // 4)
    assert rank_ranges(paths[0] / "tokenizer.json", tp) is None
    with pytest.raises(ValueError, match=r"tp = 3 must divide num_experts \(8\)"):
        rank_ranges(paths[0], TensorParallel(rank=0, world=3))


SHARDS = [
    ("tiny-qwen3-moe", "hf"),
    ("tiny-qwen3-moe-wide", "f32"),
    ("tiny-qwen3-moe", "q4_0"),
    (LLAMA / "qwen3moe-q4_k_m.gguf", None),
    ("tiny-qwen35-moe", "q4_0"),
    ("tiny-qwen3-next", "hf"),
    ("tiny-qwen35-moe", "hf"),
]


@pytest.mark.parametrize("name, quant", SHARDS, ids=lambda s: s.name if isinstance(s, Path) else s)
def test_shard_of_a_cut_load(name, quant):
    """Loaded with the rank's experts and vocabulary rows (rank_ranges), the shard equals the
    shard of a full load; the embedding and lm_head loaded as they are, a tied lm_head the
    embedding."""
    path = (
        name
        if quant is None
        else tiny.ensure(name)
        if quant == "hf"
        else tiny.ensure(name) / f"model-{quant}.gguf"
    )
    tp, cpu = TensorParallel(rank=1, world=2), torch.device("cpu")
    experts, vocab = rank_ranges(path, tp)

    def load(**kw):
        if path.is_dir():
            return load_hf(path, dtype=torch.float32, progress=False, **kw)
        return load_gguf_model(path, dtype=torch.float32, progress=False, **kw)[:2]

    (c, full), (_, part) = load(), load(experts=experts, vocab=vocab)
    assert part.embed.shape[0] == V // 2
    shard = shard_qwen3_moe if hasattr(full.layers[0], "router") else shard_qwen3_next
    with warnings.catch_warnings():
        # the K-quant o_proj cut inside its blocks
        warnings.simplefilter("ignore", ShardDequantizedWarning)
        want, got = shard(c, full, tp, cpu), shard(c, part, tp, cpu)
    same_tree(got, want)
    assert kept(got.embed, part.embed) and (got.lm_head is got.embed) == c.tie_word_embeddings
    assert kept(got.lm_head, part.lm_head)


def test_shard_refuses_an_embedding_of_neither_size():
    config = SimpleNamespace(vocab_size=8)
    embed = torch.zeros(3, 2)
    with pytest.raises(
        ValueError, match="the embedding of 3 rows is neither all 8 nor this rank's 4"
    ):
        vocab_rows(
            config,
            SimpleNamespace(embed=embed, lm_head=embed),
            TensorParallel(0, 2),
            torch.device("cpu"),
        )
    with pytest.raises(ValueError, match="lm_head of 3 rows is neither all 8 nor this rank's 4"):
        vocab_rows(
            config,
            SimpleNamespace(embed=torch.zeros(8, 2), lm_head=embed),
            TensorParallel(0, 2),
            torch.device("cpu"),
        )

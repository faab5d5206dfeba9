"""GGUF meaning: structurally sound files whose metadata ftlab cannot use -- a value of the
wrong type, a count out of range or inconsistent with the tensors, a tokenizer that is not
one -- are refused by load_gguf / Tokenizer.from_gguf with a GGUFError naming the file and
the key (or tensor), instead of a ZeroDivisionError, a torch reshape error or NaN logits."""

import math
import struct

import gguf
import pytest
import torch

from ftlab.formats.gguf import GGUFError, field_value, open_gguf
from ftlab.models import tiny
from ftlab.models.loader import load_gguf
from ftlab.models.qwen3_moe import Qwen3Moe
from ftlab.models.tokenizer import Tokenizer
from ftlab.testing.checkpoint_fuzz import encode_value, read_layout_of, splice, with_metadata

VT = gguf.GGUFValueType
A = "qwen3moe."


@pytest.fixture(scope="module")
def raw():
    return (tiny.ensure("tiny-qwen3-moe") / "model-f32.gguf").read_bytes()


@pytest.fixture(scope="module")
def tokens(raw, tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "model.gguf"
    path.write_bytes(raw)
    return field_value(open_gguf(path), "tokenizer.ggml.tokens", "str[]")


def refusal(path, load) -> str:
    with pytest.raises(GGUFError) as refused:
        load(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: "), message
    return message


# key -> (type, value, substrings the message must hold)
METADATA = {
    "block_count 0": (
        A + "block_count",
        VT.UINT32,
        0,
        ["num_hidden_layers must be an int >= 1, got 0", f"'{A}block_count'"],
    ),
    "block_count beyond the blocks": (
        A + "block_count",
        VT.UINT32,
        3,
        [f"'{A}block_count' is 3", "no tensors of blk.2"],
    ),
    "block_count short of the blocks": (
        A + "block_count",
        VT.UINT32,
        1,
        ["tensors of blk.1", f"'{A}block_count' (1)"],
    ),
    "block_count huge": (
        A + "block_count",
        VT.UINT32,
        2**32 - 1,
        [
            "num_hidden_layers must be an int <= 2^24 = 16777216, got 4294967295",
            f"'{A}block_count'",
        ],
    ),
    "block_count as a string": (
        A + "block_count",
        VT.STRING,
        "2",
        [f"'{A}block_count' must be an integer, got STRING"],
    ),
    "block_count as a float array": (
        A + "block_count",
        VT.ARRAY,
        (VT.FLOAT32, [2.0]),
        [f"'{A}block_count' must be an integer, got an array of FLOAT32"],
    ),
    "head_count 0": (
        A + "attention.head_count",
        VT.UINT32,
        0,
        ["num_attention_heads must be an int >= 1, got 0", f"'{A}attention.head_count'"],
    ),
    "head_count negative": (A + "attention.head_count", VT.INT32, -4, ["got -4"]),
    "kv heads do not divide": (
        A + "attention.head_count_kv",
        VT.UINT32,
        3,
        [f"'{A}attention.head_count'", f"'{A}attention.head_count_kv'"],
    ),
    "experts used > experts": (
        A + "expert_used_count",
        VT.UINT32,
        9,
        [
            "num_experts_per_tok must be <= num_experts (8), got 9",
            f"'{A}expert_used_count'",
            f"'{A}expert_count'",
        ],
    ),
    "experts used 0": (A + "expert_used_count", VT.UINT32, 0, [f"'{A}expert_used_count'"]),
    "rope base 0": (
        A + "rope.freq_base",
        VT.FLOAT32,
        0.0,
        ["rope_theta must be a finite number > 1, got 0.0", f"'{A}rope.freq_base'"],
    ),
    "rope base subnormal": (A + "rope.freq_base", VT.FLOAT32, 1e-45, [f"'{A}rope.freq_base'"]),
    "rope base inf": (A + "rope.freq_base", VT.FLOAT32, math.inf, [f"'{A}rope.freq_base'"]),
    "rope base as an int": (
        A + "rope.freq_base",
        VT.UINT32,
        10000,
        [f"'{A}rope.freq_base' must be a float, got UINT32"],
    ),
    "eps missing": (
        A + "attention.layer_norm_rms_epsilon",
        None,
        None,
        [f"missing metadata key '{A}attention.layer_norm_rms_epsilon'"],
    ),
    "eps NaN": (
        A + "attention.layer_norm_rms_epsilon",
        VT.FLOAT32,
        math.nan,
        [
            "rms_norm_eps must be a finite number > 0, got nan",
            f"'{A}attention.layer_norm_rms_epsilon'",
        ],
    ),
    "eps negative": (A + "attention.layer_norm_rms_epsilon", VT.FLOAT32, -1e-6, ["rms_norm_eps"]),
    "head_dim against attn_q": (
        A + "attention.key_length",
        VT.UINT32,
        8,
        ["tensor 'blk.0.attn_q.weight' has shape (64, 64), expected (32, 64)"],
    ),
    "value_length != key_length": (
        A + "attention.value_length",
        VT.UINT32,
        8,
        [
            f"'{A}attention.value_length' (8) must equal the key head dim (16, from metadata "
            f"'{A}attention.key_length')"
        ],
    ),
    "architecture": (
        "general.architecture",
        VT.STRING,
        "llama",
        ["general.architecture must be 'qwen3moe', got 'llama'"],
    ),
    "architecture not UTF-8": (
        "general.architecture",
        VT.STRING,
        b"qwen\xff",
        ["'general.architecture': the string is not valid UTF-8"],
    ),
    "fewer tokens than rows": (
        "tokenizer.ggml.tokens",
        VT.ARRAY,
        (VT.STRING, ["a", "b"]),
        ["tensor 'token_embd.weight' has 384 rows", "'tokenizer.ggml.tokens' has 2 tokens"],
    ),
    "tokens not strings": (
        "tokenizer.ggml.tokens",
        VT.ARRAY,
        (VT.INT32, list(range(384))),
        ["'tokenizer.ggml.tokens' must be an array of strings, got an array of INT32"],
    ),
    "tokens an array of arrays": (
        "tokenizer.ggml.tokens",
        VT.ARRAY,
        (VT.ARRAY, [(VT.STRING, ["a"])] * 384),
        ["got an array of ARRAY"],
    ),
}


@pytest.mark.parametrize("name", list(METADATA))
def test_metadata_is_refused_naming_the_key(raw, tmp_path, name):
    key, vtype, value, expected = METADATA[name]
    path = tmp_path / "model.gguf"
    path.write_bytes(with_metadata(raw, key, vtype, value))
    message = refusal(path, lambda p: load_gguf(p, progress=False))
    for part in expected:
        assert part in message, message


def test_a_missing_rope_base_is_llama_cpps_default(raw, tmp_path):
    """llama.cpp's qwen3moe loader reads rope.freq_base as optional, with 10000 for a missing
    key."""
    path = tmp_path / "model.gguf"
    path.write_bytes(with_metadata(raw, A + "rope.freq_base", None, None))
    config, _ = load_gguf(path, progress=False)
    assert config.rope_theta == 10000.0


def renamed(raw: bytes, old: str, new: str) -> bytes:
    layout = read_layout_of(raw)
    t = next(t for t in layout.tensors if t.name == old)
    return splice(raw, layout, t.start, t.n_dims_at, encode_value(VT.STRING, new))


@pytest.mark.parametrize(
    "old, new, expected",
    [
        (
            "output.weight",
            "outpuX.weight",
            "tensor 'outpuX.weight' is not part of a qwen3moe model",
        ),
        (
            "blk.0.attn_q.weight",
            "blk.0.attn_r.weight",
            "tensor 'blk.0.attn_r.weight' is not part of",
        ),
        (
            "blk.1.attn_q.weight",
            "blk.7.attn_q.weight",
            "tensors of blk.7, beyond metadata 'qwen3moe.block_count' (2)",
        ),
        (
            "token_embd.weight",
            "token_embd",
            "tensor 'token_embd.weight' must be [vocab, hidden], got none",
        ),
    ],
)
def test_tensor_table_against_the_model(raw, tmp_path, old, new, expected):
    path = tmp_path / "model.gguf"
    path.write_bytes(renamed(raw, old, new))
    assert expected in refusal(path, lambda p: load_gguf(p, progress=False))


def test_a_type_ftlab_cannot_use_of_the_right_size(raw, tmp_path):
    data = bytearray(raw)
    t = next(t for t in read_layout_of(raw).tensors if t.name == "token_embd.weight")
    struct.pack_into("<I", data, t.type_at, int(gguf.GGMLQuantizationType.I32))  # 4 bytes too
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(data))
    message = refusal(path, lambda p: load_gguf(p, progress=False))
    assert (
        "tensor 'token_embd.weight' has type I32, which neither ftlab nor gguf-py can dequantize"
        in message
    )


def tokenizer(path):
    return Tokenizer.from_gguf(open_gguf(path))


def test_tokenizer_fields_are_checked(raw, tokens, tmp_path):
    path = tmp_path / "model.gguf"
    bad_utf8 = [*tokens[:5], b"\xc3\x28", *tokens[6:]]
    twice = [*tokens[:5], tokens[7], *tokens[6:]]
    cases = [
        (
            "tokenizer.ggml.tokens",
            (VT.ARRAY, (VT.STRING, bad_utf8)),
            "'tokenizer.ggml.tokens': item 5 is not valid UTF-8",
        ),
        (
            "tokenizer.ggml.tokens",
            (VT.ARRAY, (VT.STRING, twice)),
            f"'tokenizer.ggml.tokens': token {tokens[7]!r} appears twice (ids 5 and 7)",
        ),
        ("tokenizer.ggml.tokens", (VT.ARRAY, (VT.UINT8, [1, 2])), "must be an array of strings"),
        (
            "tokenizer.ggml.merges",
            (VT.ARRAY, (VT.STRING, ["Ġt"])),
            "'tokenizer.ggml.merges': merge 0 'Ġt' must be 'a b'",
        ),
        ("tokenizer.ggml.merges", (VT.ARRAY, (VT.STRING, ["Ġ t h"])), "merge 0 'Ġ t h'"),
        ("tokenizer.ggml.merges", (VT.ARRAY, (VT.STRING, ["q ~"])), "merge 0 'q ~'"),
        ("tokenizer.ggml.merges", None, "'tokenizer.ggml.merges' is missing"),
        (
            "tokenizer.ggml.eos_token_id",
            (VT.UINT32, 384),
            "'tokenizer.ggml.eos_token_id' must be in [0, 384), got 384",
        ),
        ("tokenizer.ggml.eos_token_id", (VT.INT32, -1), "got -1"),
        ("tokenizer.ggml.eos_token_id", (VT.STRING, "0"), "must be an integer, got STRING"),
        ("tokenizer.ggml.model", (VT.STRING, "llama"), "'tokenizer.ggml.model' 'llama' is not"),
        ("tokenizer.ggml.model", None, "no tokenizer (metadata 'tokenizer.ggml.model')"),
    ]
    for key, change, expected in cases:
        vtype, value = change or (None, None)
        path.write_bytes(with_metadata(raw, key, vtype, value))
        assert expected in refusal(path, tokenizer), (key, change)


def test_valid_file_loads_and_its_tokenizer_round_trips(raw, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(raw)
    config, weights = load_gguf(path, dtype=torch.float32, progress=False)
    tok = tokenizer(path)
    ids = tok.encode("Hello world")
    assert tok.decode(ids) == "Hello world" and tok.eos_token_id == 0
    logits = Qwen3Moe(config, weights).forward(torch.tensor([ids]), torch.arange(len(ids))[None])
    assert torch.isfinite(logits).all()

"""HF directories: the shards load_hf reads (the index honoured, stale or duplicated shards
refused or ignored, never silently winning), and config.json values of the wrong type or
range refused with a CheckpointError naming the file and the key or tensor."""

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from ftlab.formats import CheckpointError
from ftlab.formats.gguf import GGUFError
from ftlab.models import tiny
from ftlab.models.loader import load_hf
from ftlab.models.qwen3_moe import Qwen3Moe, Qwen3MoeConfig

INDEX = "model.safetensors.index.json"
A, B = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def source():
    return tiny.ensure("tiny-qwen3-moe")


@pytest.fixture(scope="module")
def tensors(source):
    return load_file(source / "model.safetensors")


@pytest.fixture(scope="module")
def reference(source):
    return logits(source)


def logits(path) -> torch.Tensor:
    config, weights = load_hf(path, dtype=torch.float32, progress=False)
    return Qwen3Moe(config, weights).forward(torch.tensor([[1, 2, 3]]), torch.arange(3)[None])


def refusal(path) -> str:
    with pytest.raises(CheckpointError) as refused:
        load_hf(path, progress=False)
    assert not isinstance(refused.value, GGUFError)
    return str(refused.value)


def sharded(tmp_path, source, tensors, index=True, split="model.layers.1.") -> dict:
    """The tiny model in two shards (layer 1 and after in the second), with an index."""
    shutil.copy(source / "config.json", tmp_path / "config.json")
    shards = {
        A: {n: t for n, t in tensors.items() if not n.startswith(split)},
        B: {n: t for n, t in tensors.items() if n.startswith(split)},
    }
    for name, part in shards.items():
        save_file(part, str(tmp_path / name), {"format": "pt"})
    weight_map = {n: s for s, part in shards.items() for n in part}
    if index:
        (tmp_path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def test_shards_with_and_without_index_load_as_one_file(tmp_path, source, tensors, reference):
    sharded(tmp_path, source, tensors)
    torch.testing.assert_close(logits(tmp_path), reference, rtol=0, atol=0)
    (tmp_path / INDEX).unlink()
    torch.testing.assert_close(logits(tmp_path), reference, rtol=0, atol=0)


def test_a_stale_shard_is_ignored_with_an_index_and_refused_without(
    tmp_path, source, tensors, reference
):
    sharded(tmp_path, source, tensors)
    stale = {"model.norm.weight": tensors["model.norm.weight"] * 2}
    save_file(stale, str(tmp_path / "model-00003-of-00003.safetensors"), {"format": "pt"})
    torch.testing.assert_close(logits(tmp_path), reference, rtol=0, atol=0)  # not read
    (tmp_path / INDEX).unlink()
    message = refusal(tmp_path)
    assert (
        f"{tmp_path}: tensor 'model.norm.weight' is in two shards, {A} and model-00003" in message
    )


def test_a_tensor_in_two_shards_the_index_names_is_refused(tmp_path, source, tensors):
    sharded(tmp_path, source, tensors)
    save_file(
        {**load_file(tmp_path / B), "model.norm.weight": tensors["model.norm.weight"]},
        str(tmp_path / B),
        {"format": "pt"},
    )
    assert f"tensor 'model.norm.weight' is in two shards, {A} and {B}" in refusal(tmp_path)


def test_the_index_must_match_the_shards(tmp_path, source, tensors):
    weight_map = sharded(tmp_path, source, tensors)
    index = tmp_path / INDEX

    def with_map(m):
        index.write_text(json.dumps({"weight_map": m}))
        return refusal(tmp_path)

    assert (
        f"{index}: tensor 'model.norm.weight' is mapped to {B}, which does not hold it "
        f"(it is in {A})" in with_map({**weight_map, "model.norm.weight": B})
    )
    assert (
        f"{index}: tensor 'model.layers.9.mlp.gate.weight' is mapped to {A}, which does not "
        "hold it (no shard has it)" in with_map({**weight_map, "model.layers.9.mlp.gate.weight": A})
    )
    unlisted = {k: v for k, v in weight_map.items() if k != "model.norm.weight"}
    assert f"{index}: tensor 'model.norm.weight' of {A} is not in 'weight_map'" in with_map(
        unlisted
    )
    assert (
        f"{index}: weight_map['model.norm.weight'] must be a file name in the directory, got "
        f"'../{A}'" in with_map({**weight_map, "model.norm.weight": "../" + A})
    )
    (tmp_path / B).unlink()
    assert f"{index}: shard '{B}' is missing" in with_map(weight_map)


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"weight_map": {', "not valid JSON"),
        ('{"metadata": {}}', "'weight_map' must be a non-empty object"),
        ('{"weight_map": []}', "'weight_map' must be a non-empty object"),
        ("[1, 2]", "'weight_map' must be a non-empty object"),
    ],
)
def test_a_broken_index_is_refused(tmp_path, source, tensors, text, expected):
    sharded(tmp_path, source, tensors)
    (tmp_path / INDEX).write_text(text)
    assert f"{tmp_path / INDEX}: " in (message := refusal(tmp_path)) and expected in message


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.uint8])
def test_stored_weights_must_be_float(tmp_path, source, tensors, dtype):
    shutil.copy(source / "config.json", tmp_path / "config.json")
    save_file(
        {**tensors, "model.norm.weight": tensors["model.norm.weight"].to(dtype)},
        str(tmp_path / "model.safetensors"),
    )
    assert (
        f"{tmp_path / 'model.safetensors'}: tensor 'model.norm.weight' has dtype {dtype}, "
        "expected a floating-point dtype" in refusal(tmp_path)
    )


# (config.json key, its new value or REMOVED, a substring of the message)
REMOVED = object()
CONFIG = [
    ("tie_word_embeddings", "false", "tie_word_embeddings must be a bool, got 'false'"),
    ("norm_topk_prob", 1, "norm_topk_prob must be a bool, got 1"),
    ("num_hidden_layers", "2", "num_hidden_layers must be an int >= 1, got '2'"),
    ("hidden_size", 64.0, "hidden_size must be an int >= 1, got 64.0"),
    ("head_dim", True, "head_dim must be an int >= 1, got True"),
    ("vocab_size", 0, "vocab_size must be an int >= 1, got 0"),
    ("num_experts", -8, "num_experts must be an int >= 1, got -8"),
    ("moe_intermediate_size", None, "moe_intermediate_size must be an int >= 1, got None"),
    ("moe_intermediate_size", REMOVED, "missing key"),
    ("num_attention_heads", 0, "num_attention_heads must be an int >= 1, got 0"),
    (
        "num_key_value_heads",
        3,
        "num_attention_heads (4) must be a multiple of num_key_value_heads (3)",
    ),
    ("num_experts_per_tok", 9, "num_experts_per_tok must be <= num_experts (8), got 9"),
    ("num_experts_per_tok", 0, "num_experts_per_tok must be an int >= 1, got 0"),
    ("rms_norm_eps", "1e-6", "rms_norm_eps must be a finite number > 0, got '1e-6'"),
    ("rms_norm_eps", 0.0, "rms_norm_eps must be a finite number > 0, got 0.0"),
    ("rms_norm_eps", math.nan, "rms_norm_eps must be a finite number > 0, got nan"),
    ("rope_theta", math.inf, "rope_theta must be a finite number > 1, got inf"),
    ("rope_theta", 0, "rope_theta must be a finite number > 1, got 0"),
    ("rope_theta", -10000.0, "rope_theta must be a finite number > 1, got -10000.0"),
    ("max_position_embeddings", 1024.5, "max_position_embeddings must be an int >= 1"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope type 'yarn' is not supported"),
    ("rope_scaling", "none", "rope_scaling must be an object or null, got 'none'"),
    ("attention_bias", "false", "attention_bias must be a bool, got 'false'"),
    ("mlp_only_layers", "[]", "mlp_only_layers must be a list"),
    (
        "torch_dtype",
        "int8",
        "torch_dtype must be one of ['bfloat16', 'float16', 'float32'] (or pass dtype=), "
        "got 'int8'",
    ),
    ("torch_dtype", ["float32"], "torch_dtype must be one of"),
    (
        "model_type",
        "llama",
        "model_type must be one of ['qwen3_5_moe', 'qwen3_5_moe_text', 'qwen3_moe', 'qwen3_next'], "
        "got 'llama'",
    ),
    (
        "num_hidden_layers",
        2**63,
        "num_hidden_layers must be an int <= 2^24 = 16777216, got 9223372036854775808",
    ),
]


@pytest.mark.parametrize("key, value, expected", CONFIG)
def test_config_values_are_refused_naming_the_key(tmp_path, source, key, value, expected):
    config = json.loads((source / "config.json").read_text())
    config[key] = value
    if value is REMOVED:
        del config[key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(source / "model.safetensors", tmp_path / "model.safetensors")
    message = refusal(tmp_path)
    assert message.startswith(f"{tmp_path / 'config.json'}: ") and expected in message, message


def test_an_explicit_dtype_does_not_need_the_stored_one(tmp_path, source):
    """A config whose torch_dtype ftlab does not load (float64) loads when the caller names the
    dtype: the stored one is not used then."""
    import torch

    config = json.loads((source / "config.json").read_text())
    config["torch_dtype"] = "float64"
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(source / "model.safetensors", tmp_path / "model.safetensors")
    assert "float64" in refusal(tmp_path)
    _, weights = load_hf(tmp_path, dtype=torch.float32, progress=False)
    assert weights.embed.dtype == torch.float32


def test_config_counts_must_match_the_shards(tmp_path, source):
    config = json.loads((source / "config.json").read_text())
    shutil.copy(source / "model.safetensors", tmp_path / "model.safetensors")
    for key, value, expected in [
        ("num_hidden_layers", 1, "hold layers 0..1 (2)"),
        ("num_hidden_layers", 2**24, "hold layers 0..1 (2)"),
        ("num_experts", 4, "hold experts 0..7 (8)"),
    ]:
        (tmp_path / "config.json").write_text(json.dumps({**config, key: value}))
        assert f"config.json: {key} is {value}, but the shards" in (m := refusal(tmp_path)), m
        assert expected in m


def test_config_json_must_be_a_json_object(tmp_path, source):
    shutil.copy(source / "model.safetensors", tmp_path / "model.safetensors")
    for text in ['{"model_type": "qwen3_moe",', "[1]", "\xff", "[" * 100_000]:
        (tmp_path / "config.json").write_text(text, encoding="latin-1")
        assert refusal(tmp_path).startswith(f"{tmp_path / 'config.json'}: ")


def test_config_checks_are_shared_by_direct_construction():
    fields = dict(
        vocab_size=8,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=8,
    )
    Qwen3MoeConfig(**fields)
    with pytest.raises(ValueError, match="rms_norm_eps must be a finite number > 0, got nan"):
        Qwen3MoeConfig(**fields, rms_norm_eps=math.nan)
    with pytest.raises(ValueError, match="num_experts_per_tok must be <= num_experts"):
        Qwen3MoeConfig(**{**fields, "num_experts_per_tok": 3})


def test_keys_config_json_lacks_mean_what_transformers_reads(tmp_path, source):
    """Not this dataclass's defaults (Qwen3-30B-A3B's rope base 1e6, renormalized top-k):
    transformers' Qwen3MoeConfig reads a missing rope_theta as 10000, norm_topk_prob as false."""
    config = json.loads((source / "config.json").read_text())
    del config["rope_theta"], config["norm_topk_prob"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(source / "model.safetensors", tmp_path / "model.safetensors")
    loaded, _ = load_hf(tmp_path, progress=False)
    assert loaded.rope_theta == 10_000.0 and loaded.norm_topk_prob is False

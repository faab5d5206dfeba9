"""HF directories of all three model families (Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE) that ask for
what ftlab does not compute -- sliding-window attention, attention biases, a count no model has,
another model type -- refused at once with a CheckpointError naming the file and the key or
tensor, the same way in every family (one shared check: ftlab.models.hf_config)."""

import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from ftlab.formats import CheckpointError
from ftlab.models import tiny
from ftlab.models.loader import load_hf
from ftlab.models.qwen3_moe import Qwen3MoeConfig
from ftlab.models.qwen3_next import Qwen3NextConfig

FAMILIES = ["tiny-qwen3-moe", "tiny-qwen3-next", "tiny-qwen35-moe"]


@pytest.fixture(scope="module", params=FAMILIES)
def source(request, tmp_path_factory):
    return tiny.ensure(request.param, tmp_path_factory.mktemp("tiny"))


def with_config(source, tmp_path, change: dict):
    """A copy of ``source`` whose config.json (its text model's part, for Qwen3.5) has
    ``change``."""
    config = json.loads((source / "config.json").read_text())
    (config.get("text_config") or config).update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(source / "model.safetensors", tmp_path / "model.safetensors")
    return tmp_path


def refusal(path) -> str:
    start = time.perf_counter()
    with pytest.raises(CheckpointError) as refused:
        load_hf(path, progress=False)
    assert time.perf_counter() - start < 5, "refused at once, before anything is built per count"
    return str(refused.value)


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"num_experts": 2**40},
            "num_experts must be an int <= 2^24 = 16777216, got 1099511627776",
        ),
        ({"num_hidden_layers": 2**63}, "num_hidden_layers must be an int <= 2^24"),
        ({"vocab_size": 2**24 + 1}, "vocab_size must be an int <= 2^24 = 16777216, got 16777217"),
        (
            {"use_sliding_window": True, "sliding_window": 8},
            "use_sliding_window = true is not supported",
        ),
        ({"use_sliding_window": "false"}, "use_sliding_window must be a bool, got 'false'"),
        ({"hidden_act": "gelu"}, "hidden_act must be 'silu', got 'gelu'"),
        ({"attention_bias": True}, "attention_bias = true is not supported"),
    ],
)
def test_config_values_are_refused_in_every_family(source, tmp_path, change, expected):
    message = refusal(with_config(source, tmp_path, change))
    assert message.startswith(f"{tmp_path / 'config.json'}: ") and expected in message, message


@pytest.mark.parametrize("key", ["num_experts", "num_hidden_layers"])
def test_the_largest_count_is_checked_against_the_shards_at_once(source, tmp_path, key):
    """2^24 experts or layers pass the config's checks; the shards' count refuses them without
    building anything per count."""
    message = refusal(with_config(source, tmp_path, {key: 2**24, "layer_types": None}))
    assert f"config.json: {key} is {2**24}, but the shards in {tmp_path} hold " in message, message


def test_a_false_sliding_window_loads(source, tmp_path):
    """What released configs say (Qwen3-30B-A3B: use_sliding_window false, a window size beside)."""
    load_hf(
        with_config(source, tmp_path, {"use_sliding_window": False, "sliding_window": 4096}),
        progress=False,
    )


@pytest.mark.parametrize("attention_bias", [False, None])
def test_an_attention_bias_tensor_is_refused(source, tmp_path, attention_bias):
    """A bias tensor beside a config without attention biases (attention_bias false or absent)
    is refused naming the tensor, for each projection (and conv) of either attention a family
    has (a Qwen3.5 checkpoint's under model.language_model.)."""
    tensors = load_file(source / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    text = config.get("text_config") or config
    text.pop("attention_bias", None)
    if attention_bias is not None:
        text["attention_bias"] = attention_bias
    (tmp_path / "config.json").write_text(json.dumps(config))
    modules = (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.o_proj",
        "linear_attn.out_proj",
        "linear_attn.conv1d",
    )
    weights = [n for n in tensors if n.endswith(tuple(f".{m}.weight" for m in modules))]
    assert weights
    for weight in weights[:: max(1, len(weights) // 6)]:
        name = weight.removesuffix(".weight") + ".bias"
        save_file({**tensors, name: torch.zeros(4)}, str(tmp_path / "model.safetensors"))
        assert (
            f"{tmp_path}: tensor '{name}' is an attention bias, which ftlab does not apply"
            in refusal(tmp_path)
        )


def test_another_model_type_is_told_every_type_ftlab_loads(tmp_path):
    source = tiny.ensure("tiny-qwen3-moe", tmp_path / "tiny")
    message = refusal(with_config(source, tmp_path, {"model_type": "llama"}))
    assert message == (
        f"{tmp_path / 'config.json'}: model_type must be one of ['qwen3_5_moe', "
        "'qwen3_5_moe_text', 'qwen3_moe', 'qwen3_next'], got 'llama'"
    )


def test_both_configs_refuse_with_the_same_words():
    """The checks are one function: a feature refused by one family is refused by the other."""
    moe = {
        "model_type": "qwen3_moe",
        "vocab_size": 64,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    }
    nxt = {
        **moe,
        "model_type": "qwen3_next",
        "shared_expert_intermediate_size": 32,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
    }
    Qwen3MoeConfig.from_hf(moe), Qwen3NextConfig.from_hf(nxt)
    for change in (
        {"hidden_act": "relu"},
        {"use_sliding_window": True},
        {"rope_scaling": {"type": "yarn"}},
        {"mlp_only_layers": [0]},
        {"num_experts": 2**40},
        {"moe_intermediate_size": 2**25},
    ):
        messages = []
        for cls, values in ((Qwen3MoeConfig, moe), (Qwen3NextConfig, nxt)):
            with pytest.raises(ValueError) as refused:
                cls.from_hf({**values, **change})
            messages.append(str(refused.value))
        assert messages[0] == messages[1], (change, messages)

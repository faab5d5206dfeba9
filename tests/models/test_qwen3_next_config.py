"""Qwen3NextConfig.from_hf on the config.json forms of the released models and on what it
refuses."""

import pytest

from ftlab.models.qwen3_next import Qwen3NextConfig

# the shape of Qwen3-Next-80B-A3B's config.json: RoPE keys at the top level, layer pattern by
# interval
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "rope_theta": 10000000,
    "partial_rotary_factor": 0.25,
    "full_attention_interval": 4,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# the shape of Qwen3.5-35B-A3B's: the text model under text_config, mrope sections in
# rope_parameters
TEXT = {
    k: v
    for k, v in QWEN3_NEXT.items()
    if k
    not in (
        "architectures",
        "model_type",
        "rope_theta",
        "partial_rotary_factor",
        "full_attention_interval",
        "decoder_sparse_step",
        "mlp_only_layers",
        "norm_topk_prob",
    )
}
QWEN35 = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "tie_word_embeddings": False,
    "vision_config": {"depth": 27},
    "text_config": {
        **TEXT,
        "model_type": "qwen3_5_moe_text",
        "num_hidden_layers": 40,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "vocab_size": 248320,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
        },
    },
}


def test_the_released_forms():
    nxt = Qwen3NextConfig.from_hf(QWEN3_NEXT)
    assert nxt.arch == "qwen3_next" and nxt.rope_theta == 1e7 and nxt.rotary_dim == 64
    assert nxt.attention_layers == list(range(3, 48, 4)) and len(nxt.linear_layers) == 36
    assert nxt.conv_dim == 2 * 16 * 128 + 32 * 128
    q35 = Qwen3NextConfig.from_hf(QWEN35)
    assert q35.arch == "qwen3_5_moe" and q35.num_hidden_layers == 40 and q35.num_experts == 256
    assert q35.rotary_dim == 64 and q35.rope_theta == 1e7 and q35.norm_topk_prob
    assert q35.attention_layers == list(range(3, 40, 4))
    flat = Qwen3NextConfig.from_hf(QWEN35["text_config"])  # Qwen3_5MoeForCausalLM's config.json
    assert flat == q35


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(model_type="llama"), "model_type must be one of"),
        (dict(model_type=["qwen3_next"]), "model_type must be one of"),
        (dict(mlp_only_layers=[3]), "dense (mlp_only) layers are not supported"),
        (dict(partial_rotary_factor=0.0), "partial_rotary_factor must be a number in (0, 1]"),
        (
            dict(partial_rotary_factor=0.302),
            "the rotary dim head_dim * partial_rotary_factor = 256 * 0.302 must be an",
        ),
        (
            dict(linear_num_value_heads=24),
            "linear_num_value_heads (24) must be a multiple of linear_num_key_heads (16)",
        ),
        (dict(layer_types=["linear_attention", "mamba"] * 24), "layer_types must be a list of"),
        (dict(full_attention_interval=0), "full_attention_interval must be an int >= 1"),
        (
            dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
            "rope type 'yarn' is not supported",
        ),
        (dict(num_experts_per_tok=600), "num_experts_per_tok must be <= num_experts (512)"),
        (dict(hidden_size=None), "hidden_size must be an int >= 1"),
    ],
)
def test_refusals_name_the_key(change, message):
    with pytest.raises(
        ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")
    ):
        Qwen3NextConfig.from_hf({**QWEN3_NEXT, **change})
    with pytest.raises(ValueError, match="text_config must be an object"):
        Qwen3NextConfig.from_hf({**QWEN35, "text_config": None})

"""The built-in tiny hybrid models (Qwen3.5-MoE and Qwen3-Next): their HF configs and
deterministic random weights under the checkpoints' own names (:mod:`ftlab.models.tiny` writes
them). Dims are small but K-quant friendly where cheap (hidden 256); the layer patterns hold both
linear and full attention; value heads are twice the key heads; partial rotary; a shared expert.

``tiny-qwen35-moe`` is written as a ``Qwen3_5MoeForConditionalGeneration`` checkpoint (the text
config under ``text_config``, tensors under ``model.language_model.``, no vision tower), as the
Qwen3.5 / Qwen3.6 releases are; ``tiny-qwen3-next`` as a ``Qwen3NextForCausalLM`` one (its
``in_proj_qkvz`` / ``in_proj_ba`` packed per key-head group).
"""

from __future__ import annotations

import torch

TEXT_PREFIX = "model.language_model."
HYBRID_MODELS: dict[str, dict] = {
    "tiny-qwen35-moe": dict(
        arch="qwen3_5_moe",
        hidden_size=256,
        num_hidden_layers=4,
        full_attention_interval=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        partial_rotary_factor=0.25,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=128,
        tie_word_embeddings=False,
        seed=2,
    ),
    "tiny-qwen3-next": dict(
        arch="qwen3_next",
        hidden_size=256,
        num_hidden_layers=4,
        full_attention_interval=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        partial_rotary_factor=0.25,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        norm_topk_prob=True,
        tie_word_embeddings=True,
        seed=3,
    ),
}


def hybrid_config(name: str, vocab_size: int, spec: dict | None = None) -> dict:
    """The HF ``config.json`` dict of tiny hybrid model ``name`` (or of ``spec``, a dict of
    :data:`HYBRID_MODELS`' fields)."""
    full = spec or HYBRID_MODELS[name]
    spec = {k: v for k, v in full.items() if k not in ("arch", "seed", "partial_rotary_factor")}
    n, interval = spec["num_hidden_layers"], spec.pop("full_attention_interval")
    text = {
        "vocab_size": vocab_size,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "float32",
        "layer_types": [
            "linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)
        ],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": full["partial_rotary_factor"],
        },
        **spec,
    }
    if full["arch"] == "qwen3_next":
        return {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "intermediate_size": 4 * spec["hidden_size"],
            **text,
        }
    text["model_type"] = "qwen3_5_moe_text"
    text["rope_parameters"] |= {"mrope_section": [11, 11, 10], "mrope_interleaved": True}
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": spec["tie_word_embeddings"],
        "torch_dtype": "float32",
        "text_config": text,
    }


def hybrid_weights(name: str, vocab_size: int, spec: dict | None = None) -> dict[str, torch.Tensor]:
    """Deterministic weights in the checkpoint's names (of ``spec`` when given, a dict of
    :data:`HYBRID_MODELS`' fields). Scales keep activations O(1)."""
    spec = spec or HYBRID_MODELS[name]
    g = torch.Generator().manual_seed(2000 + spec["seed"])
    h, hd, e = spec["hidden_size"], spec["head_dim"], spec["num_experts"]
    inter, shared = spec["moe_intermediate_size"], spec["shared_expert_intermediate_size"]
    hk, hv = spec["linear_num_key_heads"], spec["linear_num_value_heads"]
    kd, vd = hk * spec["linear_key_head_dim"], hv * spec["linear_value_head_dim"]
    n, interval = spec["num_hidden_layers"], spec["full_attention_interval"]
    nq, nkv = spec["num_attention_heads"] * hd, spec["num_key_value_heads"] * hd
    next_arch = spec["arch"] == "qwen3_next"
    model = "model." if next_arch else TEXT_PREFIX

    def w(*shape: int, scale: float | None = None) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * (
            scale if scale is not None else shape[-1] ** -0.5
        )

    def centred(size: int) -> torch.Tensor:  # w of a (1 + w) norm
        return 0.1 * torch.randn(size, generator=g)

    out = {
        model + "embed_tokens.weight": w(vocab_size, h, scale=1.0),
        model + "norm.weight": centred(h),
    }
    if not spec["tie_word_embeddings"]:
        out["lm_head.weight"] = w(vocab_size, h)
    for i in range(n):
        p = f"{model}layers.{i}."
        out |= {
            p + "input_layernorm.weight": centred(h),
            p + "post_attention_layernorm.weight": centred(h),
        }
        if (i + 1) % interval:
            a = p + "linear_attn."
            if next_arch:
                out |= {
                    a + "in_proj_qkvz.weight": w(2 * kd + 2 * vd, h),
                    a + "in_proj_ba.weight": w(2 * hv, h),
                }
            else:
                out |= {
                    a + "in_proj_qkv.weight": w(2 * kd + vd, h),
                    a + "in_proj_z.weight": w(vd, h),
                    a + "in_proj_b.weight": w(hv, h),
                    a + "in_proj_a.weight": w(hv, h),
                }
            width = spec["linear_conv_kernel_dim"]
            out |= {
                a + "conv1d.weight": w(2 * kd + vd, 1, width),
                a + "dt_bias": 1 + 0.1 * torch.randn(hv, generator=g),
                a + "A_log": torch.empty(hv).uniform_(0.0, 2.0, generator=g),
                a + "norm.weight": 1
                + 0.1 * torch.randn(spec["linear_value_head_dim"], generator=g),
                a + "out_proj.weight": w(h, vd),
            }
        else:
            s = p + "self_attn."
            out |= {
                s + "q_proj.weight": w(2 * nq, h),
                s + "k_proj.weight": w(nkv, h),
                s + "v_proj.weight": w(nkv, h),
                s + "o_proj.weight": w(h, nq),
                s + "q_norm.weight": centred(hd),
                s + "k_norm.weight": centred(hd),
            }
        m = p + "mlp."
        out |= {
            m + "gate.weight": w(e, h, scale=1.0),
            m + "shared_expert_gate.weight": w(1, h),
            m + "shared_expert.gate_proj.weight": w(shared, h),
            m + "shared_expert.up_proj.weight": w(shared, h),
            m + "shared_expert.down_proj.weight": w(h, shared),
        }
        for j in range(e):
            x = f"{m}experts.{j}."
            out |= {
                x + "gate_proj.weight": w(inter, h),
                x + "up_proj.weight": w(inter, h),
                x + "down_proj.weight": w(h, inter),
            }
    return {k: v.contiguous() for k, v in out.items()}


def causal_lm_config(config: dict) -> dict:
    """The text model's ``*ForCausalLM`` config dict of a tiny hybrid model's ``config.json`` (a
    ``Qwen3_5MoeForConditionalGeneration`` one's ``text_config``), with its
    ``full_attention_interval``: what the GGUF writer reads."""
    if config["model_type"] == "qwen3_5_moe":
        config = {"architectures": ["Qwen3_5MoeForCausalLM"], **config["text_config"]}
    types = config["layer_types"]
    return {**config, "full_attention_interval": types.index("full_attention") + 1}


def fused_state(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint-named state dict in transformers' in-memory names: the text model's tensors
    under ``model.`` (not ``model.language_model.``), each layer's per-expert
    ``mlp.experts.{j}.{gate,up,down}_proj.weight`` fused into ``mlp.experts.gate_up_proj``
    ``[E, 2I, H]`` (gate rows, then up rows) and ``mlp.experts.down_proj`` ``[E, H, I]``."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in weights.items():
        name = "model." + name.removeprefix(TEXT_PREFIX) if name.startswith(TEXT_PREFIX) else name
        bank, sep, rest = name.partition(".experts.")
        if sep and bank.endswith(".mlp"):
            j, proj, _ = rest.split(".")
            experts.setdefault(bank, {}).setdefault(int(j), {})[proj] = t
        else:
            out[name] = t
    for bank, by_expert in experts.items():
        order = [by_expert[j] for j in range(len(by_expert))]
        out[bank + ".experts.gate_up_proj"] = torch.stack(
            [torch.cat([e["gate_proj"], e["up_proj"]]) for e in order]
        )
        out[bank + ".experts.down_proj"] = torch.stack([e["down_proj"] for e in order])
    return out


def write_hybrid_gguf(
    path, config: dict, weights: dict[str, torch.Tensor], tokenizer, qtype
) -> None:
    """A tiny hybrid model (its HF ``config.json`` dict and checkpoint-named ``weights``) as the
    GGUF file llama.cpp's converter would make of the checkpoint, its matmul weights of ``qtype``
    (a ``gguf.GGMLQuantizationType``; F32: all float), ``tokenizer`` in the metadata."""
    from ftlab.models.qwen3_next.gguf_write import write_gguf_hf

    write_gguf_hf(
        path, causal_lm_config(config), fused_state(weights), tokenizer=tokenizer, types=qtype
    )

"""The config of Qwen3-MoE (the ``qwen3_moe`` architecture of Qwen3-30B-A3B) and its reading from a
HF ``config.json`` dict."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ftlab.models import hf_config
from ftlab.models.layers import check_field


@dataclass
class Qwen3MoeConfig:
    """The shape and constants of a Qwen3-MoE model. Checked on construction (ValueError
    naming the field): counts are ints >= 1, eps and rope_theta finite and > 0 (rope_theta
    > 1), the flags bools, heads a multiple of kv heads, 1 <= experts per token <= experts."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    norm_topk_prob: bool = True
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        for f in fields(self):
            check_field(f.name, getattr(self, f.name))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok must be <= num_experts ({self.num_experts}), "
                f"got {self.num_experts_per_tok}"
            )

    @classmethod
    def from_hf(cls, hf: dict) -> Qwen3MoeConfig:
        """From a HF ``config.json`` dict (model_type ``qwen3_moe``); ValueError naming the key
        for a missing key, a value of the wrong type or range, or a feature ftlab lacks
        (:func:`ftlab.models.hf_config.refuse_unsupported`, RoPE scaling)."""
        if hf.get("model_type") != "qwen3_moe":
            raise ValueError(f"model_type must be 'qwen3_moe', got {hf.get('model_type')!r}")
        values = dict(hf)
        rope = hf_config.rope(values)
        # a key config.json lacks means what transformers' Qwen3MoeConfig defaults to, not what
        # this dataclass defaults to (Qwen3-30B-A3B's values): the two differ on these
        values.setdefault("rope_theta", rope.get("rope_theta", 10_000.0))
        values.setdefault("norm_topk_prob", False)
        # newer transformers' name
        if "num_experts" not in values and "num_local_experts" in values:
            values["num_experts"] = values["num_local_experts"]
        if "head_dim" not in values and "hidden_size" in values and "num_attention_heads" in values:
            check_field("hidden_size", values["hidden_size"])
            check_field("num_attention_heads", values["num_attention_heads"])
            values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
        hf_config.refuse_unsupported(values)
        return hf_config.build(cls, values)

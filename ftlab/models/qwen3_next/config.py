"""The config of the hybrid Qwen MoE models -- Qwen3-Next (``qwen3_next``) and Qwen3.5-MoE /
Qwen3.6 (``qwen3_5_moe``, its text model ``qwen3_5_moe_text``) -- and its reading from a HF
``config.json`` dict (the Qwen3.5 form nests the text model's config under ``text_config``)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ftlab.models import hf_config
from ftlab.models.layers import check_field

ARCHS = ("qwen3_next", "qwen3_5_moe")
LAYER_TYPES = ("linear_attention", "full_attention")
#: HF ``model_type`` -> arch.
MODEL_TYPES = {
    "qwen3_next": "qwen3_next",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
}
#: What transformers' configs default to for a key config.json lacks.
HF_DEFAULTS = {
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "norm_topk_prob": True,
}


@dataclass
class Qwen3NextConfig:
    """The shape and constants of a Qwen3-Next or Qwen3.5-MoE text model (``arch``). Checked on
    construction (ValueError naming the field): counts are ints >= 1, eps and rope_theta finite
    and > 0 (rope_theta > 1), flags bools, ``layer_types`` one of :data:`LAYER_TYPES` a layer,
    heads a multiple of kv heads (and linear value heads of linear key heads), 1 <= experts per
    token <= experts, the rotary dim ``head_dim * partial_rotary_factor`` even and in [2,
    head_dim]."""

    arch: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_conv_kernel_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    partial_rotary_factor: float = 0.25
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    norm_topk_prob: bool = True
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if not isinstance(self.layer_types, (list, tuple)) or not all(
            t in LAYER_TYPES for t in self.layer_types
        ):
            raise ValueError(
                f"layer_types must be a list of {LAYER_TYPES}, got {self.layer_types!r}"
            )
        self.layer_types = tuple(self.layer_types)
        factor = self.partial_rotary_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise ValueError(f"partial_rotary_factor must be a number in (0, 1], got {factor!r}")
        for f in fields(self):
            if f.name not in ("arch", "layer_types", "partial_rotary_factor"):
                check_field(f.name, getattr(self, f.name))
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types must name num_hidden_layers = {self.num_hidden_layers} layers, got "
                f"{len(self.layer_types)}"
            )
        for heads, kv in (
            ("num_attention_heads", "num_key_value_heads"),
            ("linear_num_value_heads", "linear_num_key_heads"),
        ):
            if getattr(self, heads) % getattr(self, kv):
                raise ValueError(
                    f"{heads} ({getattr(self, heads)}) must be a multiple of {kv} "
                    f"({getattr(self, kv)})"
                )
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok must be <= num_experts ({self.num_experts}), "
                f"got {self.num_experts_per_tok}"
            )
        rot = self.rotary_dim
        if rot < 2 or rot % 2:
            raise ValueError(
                f"the rotary dim head_dim * partial_rotary_factor = {self.head_dim} * {factor} "
                f"must be an even int >= 2, got {rot}"
            )

    @property
    def rotary_dim(self) -> int:
        """The rotated part of each q / k head (transformers' ``int(head_dim * factor)``)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """The conv's channels: q, k and v of the linear attention."""
        return 2 * self.key_dim + self.value_dim

    @classmethod
    def from_hf(cls, hf: dict) -> Qwen3NextConfig:
        """From a HF ``config.json`` dict (model_type ``qwen3_next``, ``qwen3_5_moe`` with the text
        model's config under ``text_config``, or ``qwen3_5_moe_text``); ValueError naming the key
        for a missing key, a value of the wrong type or range, or a feature ftlab lacks
        (:func:`ftlab.models.hf_config.refuse_unsupported`, RoPE scaling)."""
        model_type = hf.get("model_type")
        if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {sorted(MODEL_TYPES)}, got {model_type!r}")
        values = dict(hf)
        if model_type == "qwen3_5_moe":
            text = hf.get("text_config")
            if not isinstance(text, dict):
                raise ValueError(f"text_config must be an object, got {text!r:.80}")
            values = {"tie_word_embeddings": hf.get("tie_word_embeddings", False), **text}
        values["arch"] = MODEL_TYPES[model_type]
        for key, default in HF_DEFAULTS.items():
            values.setdefault(key, default)
        if values["arch"] == "qwen3_5_moe":
            values["norm_topk_prob"] = True  # Qwen3.5's router always renormalizes its top k
        _rope(values)
        _layer_types(values)
        hf_config.refuse_unsupported(values)
        return hf_config.build(cls, values)


def _rope(values: dict) -> None:
    """rope_theta and partial_rotary_factor from ``rope_parameters`` (or ``rope_scaling``, or the
    top level); default RoPE only (Qwen3.5's mrope sections are plain RoPE for text)."""
    rope = hf_config.rope(values)
    values["rope_theta"] = rope.get("rope_theta", values.get("rope_theta", 10_000.0))
    values["partial_rotary_factor"] = rope.get(
        "partial_rotary_factor", values.get("partial_rotary_factor", 0.25)
    )


def _layer_types(values: dict) -> None:
    """``layer_types`` as given, else every ``full_attention_interval``-th layer (default 4) full
    attention and the others linear, as transformers builds it."""
    if values.get("layer_types") is not None:
        return
    n, interval = values.get("num_hidden_layers"), values.get("full_attention_interval", 4)
    check_field("num_hidden_layers", n)
    check_field("full_attention_interval", interval)
    values["layer_types"] = [
        "linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)
    ]

"""What both readers of a HF ``config.json`` check -- ``Qwen3MoeConfig.from_hf``
(:mod:`ftlab.models.qwen3_moe.config`) and ``Qwen3NextConfig.from_hf``
(:mod:`ftlab.models.qwen3_next.config`) -- in one place, so that the two model families refuse
the same things with the same words: the RoPE keys, the features ftlab's models lack, and the
config dataclass built from the keys (its own checks: ``layers.check_field``)."""

from __future__ import annotations

from dataclasses import fields


def rope(values: dict) -> dict:
    """The RoPE parameters of a config dict: ``rope_parameters``, else ``rope_scaling``, else
    ``{}``; ValueError naming the key unless each is an object or null and the RoPE type is the
    default one."""
    for key in ("rope_parameters", "rope_scaling"):
        if not isinstance(values.get(key) or {}, dict):
            raise ValueError(f"{key} must be an object or null, got {values[key]!r}")
    params = values.get("rope_parameters") or values.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"rope type {rope_type!r} is not supported (default RoPE only)")
    return params


def refuse_unsupported(values: dict) -> None:
    """ValueError naming the key for what ftlab's models do not compute: attention biases
    (``attention_bias``), sliding-window attention (``use_sliding_window``), an activation other
    than SiLU (``hidden_act``), dense (non-MoE) layers (``mlp_only_layers``,
    ``decoder_sparse_step``). A model that ignored one would load and compute another model."""
    for key in ("attention_bias", "use_sliding_window"):
        if not isinstance(values.get(key, False), bool):
            raise ValueError(f"{key} must be a bool, got {values[key]!r}")
        if values.get(key):
            raise ValueError(f"{key} = true is not supported")
    if values.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act must be 'silu', got {values['hidden_act']!r}")
    dense, step = values.get("mlp_only_layers"), values.get("decoder_sparse_step", 1)
    dense = [] if dense is None else dense
    if not isinstance(dense, list) or isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(
            f"mlp_only_layers must be a list and decoder_sparse_step an int, got {dense!r} and "
            f"{step!r}"
        )
    if dense or step != 1:
        raise ValueError(
            "dense (mlp_only) layers are not supported: mlp_only_layers must be [] and "
            "decoder_sparse_step 1, every layer MoE"
        )


def build(cls: type, values: dict) -> object:
    """The config dataclass ``cls`` from those keys of ``values`` that are its fields (the
    constructor checks them); ValueError naming a required field that is missing."""
    names = {f.name for f in fields(cls)}
    try:
        return cls(**{k: values[k] for k in names if k in values})
    except TypeError as e:  # a required field absent: the constructor names it
        raise ValueError(f"missing key ({e})") from e

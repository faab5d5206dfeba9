"""Load a HF Qwen3-MoE directory into :class:`~ftlab.models.qwen3_moe.model_weights.ModelWeights`.

``config.json`` + safetensors shards (:class:`~ftlab.formats.hf.SafetensorsShards`: which
shards, memory-mapped), per-expert tensors ``mlp.experts.{e}.{gate,up,down}_proj.weight``
stacked into banks ``w_gate_up [E, 2I, H]`` (gate rows, then up rows) and ``w_down [E, H, I]``.
Every refusal is a :class:`~ftlab.formats.CheckpointError` naming the file and the key or
tensor: a config value of the wrong type or range, layers or experts stored other than the
config counts, an attention bias, a missing, misshapen or non-float tensor, an unreadable file.

Stored values are not scanned (that would read every byte of a checkpoint that is otherwise
memory-mapped lazily): a NaN or inf weight loads, and shows as non-finite logits.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from tqdm import tqdm

from ftlab.formats import CheckpointError
from ftlab.formats.hf import SafetensorsShards, read_hf_config, stored_dtype
from ftlab.models.checkpoint_checks import (
    check_count,
    expert_range,
    head_ranges,
    refuse_attention_biases,
    row_range,
)
from ftlab.models.qwen3_moe.config import Qwen3MoeConfig
from ftlab.models.qwen3_moe.model_weights import LayerWeights, ModelWeights
from ftlab.models.qwen3_next.config import MODEL_TYPES as NEXT_MODEL_TYPES

_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_EXPERT = re.compile(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\.")
#: The HF ``model_type`` values ftlab loads: this module's, and those of
#: :mod:`ftlab.models.qwen3_next.hf`.
MODEL_TYPES = ("qwen3_moe", *NEXT_MODEL_TYPES)


def check_counts(shards: SafetensorsShards, config: Qwen3MoeConfig, config_file: Path) -> None:
    """The layers (``model.layers.N``) and experts (``mlp.experts.J``) ``shards`` hold are those
    the config counts: a config that counts fewer would silently drop some, one that counts
    more fails on the first missing tensor only after loading all before it."""
    layers = {int(m[1]) for t in shards.where if (m := _LAYER.match(t))}
    experts = {int(m[1]) for t in shards.where if (m := _EXPERT.match(t))}
    path, n = shards.path, config.num_hidden_layers
    check_count(config_file, path, "num_hidden_layers", n, layers, "layers")
    check_count(config_file, path, "num_experts", config.num_experts, experts, "experts")


def read_config(path: Path, dtype: torch.dtype | None = None) -> tuple[Qwen3MoeConfig, torch.dtype]:
    """The model config of ``path/config.json`` and its stored dtype (``torch_dtype`` or
    ``dtype``; bf16 when it names none)."""
    config_file = path / "config.json"
    hf = read_hf_config(path)
    model_type = hf.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:  # no loader reads it
        raise CheckpointError(
            f"{config_file}: model_type must be one of {sorted(MODEL_TYPES)}, got {model_type!r}"
        )
    try:
        config = Qwen3MoeConfig.from_hf(hf)
    except ValueError as e:
        raise CheckpointError(f"{config_file}: {e}") from e
    if dtype is not None:  # the caller's dtype: the stored one is not used
        return config, dtype
    return config, stored_dtype(hf, config_file)


def load_hf(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    progress: bool = True,
    experts: tuple[int, int] | None = None,
    vocab: tuple[int, int] | None = None,
    heads: tuple[tuple[int, int], tuple[int, int]] | None = None,
) -> tuple[Qwen3MoeConfig, ModelWeights]:
    """Config and weights of a HF Qwen3-MoE directory, on ``device`` in ``dtype`` (default:
    the config's ``torch_dtype``/``dtype``, else bf16). ``experts``: ``(start, stop)`` -- only
    those experts' tensors are read into the banks (a tensor-parallel rank's share; the router
    still scores all of them). ``vocab``: ``(start, stop)`` -- the embedding and an untied
    lm_head ``[stop - start, H]`` hold only those vocabulary rows, a safetensors slice of them
    read and copied (a tensor-parallel rank's vocabulary shard; a tied lm_head is the embedding).
    ``heads``: ``((q_start, q_stop), (kv_start, kv_stop))`` -- q_proj holds only those query
    heads' rows, k_proj / v_proj those key/value heads' rows and o_proj those query heads'
    columns, safetensors slices of them read and copied (a tensor-parallel rank's attention
    shard; q_norm / k_norm, per head dim, stay whole). None: all, for any; ValueError naming
    ``experts``, ``vocab`` or ``heads`` for a range that is not ``0 <= start < stop <= count``.
    CheckpointError naming the file and the key or tensor for anything ftlab cannot load."""
    path = Path(path)
    config, dtype = read_config(path, dtype)
    e0, e1 = expert_range(experts, config.num_experts)
    vocab = None if vocab is None else row_range(vocab, config.vocab_size, "vocab")
    heads = head_ranges(heads, config.num_attention_heads, config.num_key_value_heads)
    device = torch.device(device)
    tensors = SafetensorsShards(path)
    check_counts(tensors, config, path / "config.json")
    refuse_attention_biases(tensors.where, path)
    c = config
    h, hd, e, inter = c.hidden_size, c.head_dim, c.num_experts, c.moe_intermediate_size
    q_out, kv_out = c.num_attention_heads * hd, c.num_key_value_heads * hd

    def get(name: str, *shape: int) -> torch.Tensor:
        return tensors.get(name, shape, dtype, device)

    # heads=: the rank's rows of q_proj and of k_proj / v_proj (o_proj: q_rows' columns)
    q_rows = kv_rows = None
    if heads is not None:
        q_rows, kv_rows = ((a * hd, b * hd) for a, b in heads)

    def attn(name: str, shape: tuple[int, int], rows=None, columns=None) -> torch.Tensor:
        return tensors.get(f"{name}.weight", shape, dtype, device, rows, columns)

    layers = []
    for i in tqdm(
        range(c.num_hidden_layers), desc=f"loading {path.name}", disable=not progress, unit="layer"
    ):
        p = f"model.layers.{i}."
        experts_of = p + "mlp.experts."
        gate = torch.stack(
            [get(f"{experts_of}{j}.gate_proj.weight", inter, h) for j in range(e0, e1)]
        )
        up = torch.stack([get(f"{experts_of}{j}.up_proj.weight", inter, h) for j in range(e0, e1)])
        layers.append(
            LayerWeights(
                q_proj=attn(p + "self_attn.q_proj", (q_out, h), q_rows),
                k_proj=attn(p + "self_attn.k_proj", (kv_out, h), kv_rows),
                v_proj=attn(p + "self_attn.v_proj", (kv_out, h), kv_rows),
                o_proj=attn(p + "self_attn.o_proj", (h, q_out), columns=q_rows),
                q_norm=get(p + "self_attn.q_norm.weight", hd),
                k_norm=get(p + "self_attn.k_norm.weight", hd),
                input_norm=get(p + "input_layernorm.weight", h),
                post_attention_norm=get(p + "post_attention_layernorm.weight", h),
                router=get(p + "mlp.gate.weight", e, h),
                w_gate_up=torch.cat([gate, up], dim=1),  # [E, 2I, H]
                w_down=torch.stack(
                    [get(f"{experts_of}{j}.down_proj.weight", h, inter) for j in range(e0, e1)]
                ),
            )
        )
    embed = tensors.get("model.embed_tokens.weight", (c.vocab_size, h), dtype, device, vocab)
    lm_head = (
        embed
        if c.tie_word_embeddings
        else tensors.get("lm_head.weight", (c.vocab_size, h), dtype, device, vocab)
    )
    return config, ModelWeights(embed, layers, get("model.norm.weight", h), lm_head)

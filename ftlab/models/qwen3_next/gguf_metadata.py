"""What a Qwen3.6 (``qwen35moe``) or Qwen3-Next (``qwen3next``) GGUF file's metadata says, as
llama.cpp's converter writes it: the HF config (``config.json`` fields, from the ``<arch>.*``
keys and the tensor table's vocabulary) and the tokenizer (``tokenizer.ggml.*``). Every value is
checked: of its type, the counts consistent with each other; a refusal is a
:class:`~ftlab.formats.gguf.GGUFError` naming the file and the key. The tensors are
:mod:`~ftlab.models.qwen3_next.gguf`'s.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken

from ftlab.formats.gguf import GGUFError, as_gguf, field_value
from ftlab.formats.gguf_read import GGUFFile
from ftlab.models.qwen3_next.gguf_layout import ARCHS, DEFAULTS, FLOAT_KEYS, INT_KEYS
from ftlab.models.tokenizer import Tokenizer

__all__ = ["read_config", "read_gguf_tokenizer"]

_CONTROL = 3  # gguf.TokenType.CONTROL


def read_config(reader, path: Path) -> dict:
    """The HF config dict of a ``qwen35moe`` / ``qwen3next`` GGUF file's metadata and tensor
    table (``config.json`` fields), every value checked; GGUFError naming the key."""
    arch = field_value(reader, "general.architecture", "str")
    if arch not in ARCHS:
        raise GGUFError(
            f"{path}: metadata 'general.architecture' must be one of {sorted(ARCHS)}, got {arch!r}"
        )

    def get(key: str, kind: str = "int", required: bool = True):
        v = field_value(reader, f"{arch}.{key}", kind)
        if v is None:
            if required and key not in DEFAULTS:
                raise GGUFError(f"{path}: missing metadata key '{arch}.{key}'")
            return DEFAULTS.get(key)
        if kind == "int" and v < (0 if key == "nextn_predict_layers" else 1):
            raise GGUFError(f"{path}: metadata '{arch}.{key}' must be >= 1, got {v}")
        return v

    c = {f: get(k) for f, k in INT_KEYS.items()}
    c |= {f: get(k, "float") for f, k in FLOAT_KEYS.items()}
    nextn = get("nextn_predict_layers")
    if nextn >= c["num_hidden_layers"]:
        raise GGUFError(
            f"{path}: metadata '{arch}.nextn_predict_layers' ({nextn}) must be less than "
            f"'{arch}.block_count' ({c['num_hidden_layers']})"
        )
    block_count, c["num_hidden_layers"] = c["num_hidden_layers"], c["num_hidden_layers"] - nextn
    _check_heads(c, get, arch, path)
    c["layer_types"], interval = _layer_types(
        reader, arch, c["num_hidden_layers"], block_count, get, path
    )
    rope_dims = get("rope.dimension_count")
    if rope_dims > c["head_dim"] or rope_dims % 2:
        raise GGUFError(
            f"{path}: metadata '{arch}.rope.dimension_count' ({rope_dims}) must be even and at "
            f"most '{arch}.attention.key_length' ({c['head_dim']})"
        )
    rope = {
        "rope_type": "default",
        "rope_theta": c.pop("rope_theta"),
        "partial_rotary_factor": rope_dims / c["head_dim"],
    }
    if arch == "qwen35moe":
        sections = get("rope.dimension_sections", "int[]")
        # the converter writes [11, 11, 10, 0] for any head dim
        if len(sections) != 4 or min(sections) < 0:
            raise GGUFError(
                f"{path}: metadata '{arch}.rope.dimension_sections' must be 4 sizes >= 0, got "
                f"{sections}"
            )
        rope |= {"mrope_section": sections[:3], "mrope_interleaved": True}
    cls, model_type = ARCHS[arch]
    config = {
        "architectures": [cls],
        "model_type": model_type,
        **c,
        "rope_parameters": rope,
        "full_attention_interval": interval,
        "hidden_act": "silu",
        "attention_bias": False,
    }
    if arch == "qwen3next":
        config |= {"norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
        if (ff := get("feed_forward_length", required=False)) is not None:
            config["intermediate_size"] = ff
    if nextn:
        config["mtp_num_hidden_layers"] = nextn
    tensors = {t.name: t for t in reader.tensors}
    embd = tensors.get("token_embd.weight")
    if embd is None or len(embd.shape) != 2 or int(embd.shape[0]) != c["hidden_size"]:
        got = "none" if embd is None else f"shape {list(reversed(embd.shape.tolist()))}"
        raise GGUFError(
            f"{path}: tensor 'token_embd.weight' must be [vocab, {c['hidden_size']}], got {got}"
        )
    config["vocab_size"] = int(embd.shape[-1])
    config["tie_word_embeddings"] = "output.weight" not in tensors
    tokens = field_value(reader, "tokenizer.ggml.tokens", "str[]")
    if tokens is not None and len(tokens) != config["vocab_size"]:
        raise GGUFError(
            f"{path}: tensor 'token_embd.weight' has {config['vocab_size']} rows but "
            f"metadata 'tokenizer.ggml.tokens' has {len(tokens)} tokens"
        )
    for which in ("eos", "bos"):
        tid = field_value(reader, f"tokenizer.ggml.{which}_token_id", "int")
        if tid is not None:
            if not 0 <= tid < config["vocab_size"]:
                raise GGUFError(
                    f"{path}: metadata 'tokenizer.ggml.{which}_token_id' must be in "
                    f"[0, {config['vocab_size']}), got {tid}"
                )
            config[f"{which}_token_id"] = tid
    return config


def _check_heads(c: dict, get, arch: str, path: Path) -> None:
    """Head counts that divide, the value length equal to the key length, and the linear
    attention's value head dim from ``ssm.inner_size``."""
    value_length = get("attention.value_length", required=False)
    if value_length not in (None, c["head_dim"]):
        raise GGUFError(
            f"{path}: metadata '{arch}.attention.value_length' ({value_length}) must equal "
            f"'{arch}.attention.key_length' ({c['head_dim']})"
        )
    for big, small in (
        ("num_attention_heads", "num_key_value_heads"),
        ("linear_num_value_heads", "linear_num_key_heads"),
    ):
        if c[big] % c[small]:
            raise GGUFError(
                f"{path}: metadata '{arch}.{INT_KEYS[big]}' ({c[big]}) must be a multiple of "
                f"'{arch}.{INT_KEYS[small]}' ({c[small]})"
            )
    if c["num_experts_per_tok"] > c["num_experts"]:
        raise GGUFError(
            f"{path}: metadata '{arch}.expert_used_count' ({c['num_experts_per_tok']}) exceeds "
            f"'{arch}.expert_count' ({c['num_experts']})"
        )
    inner, hv = get("ssm.inner_size"), c["linear_num_value_heads"]
    if inner % hv:
        raise GGUFError(
            f"{path}: metadata '{arch}.ssm.inner_size' ({inner}) must be a multiple of "
            f"'{arch}.ssm.time_step_rank' ({hv})"
        )
    c["linear_value_head_dim"] = inner // hv


def _layer_types(
    reader, arch: str, layers: int, block_count: int, get, path: Path
) -> tuple[list[str], int]:
    """``layer_types`` from ``attention.recurrent_layers`` (BOOL per block) or, without it,
    ``full_attention_interval`` as llama.cpp derives them; and the interval."""
    interval = get("full_attention_interval")
    key = f"{arch}.attention.recurrent_layers"
    recurrent = field_value(reader, key, "bool[]")
    if recurrent is None:
        recurrent = [(i + 1) % interval != 0 for i in range(layers)]
    else:
        if len(recurrent) != block_count:
            raise GGUFError(
                f"{path}: metadata '{key}' has {len(recurrent)} entries, '{arch}.block_count' is "
                f"{block_count}"
            )
        if any(recurrent[layers:]):
            raise GGUFError(
                f"{path}: metadata '{key}': the multi-token-prediction blocks must not be recurrent"
            )
        recurrent = recurrent[:layers]
    return ["linear_attention" if r else "full_attention" for r in recurrent], interval


def read_gguf_tokenizer(path: str | Path | GGUFFile) -> Tokenizer:
    """The byte-level BPE tokenizer of the file's ``tokenizer.ggml.*`` metadata (``path``, or
    the :class:`~ftlab.formats.gguf_read.GGUFFile` already open); its CONTROL tokens
    (``tokenizer.ggml.token_type`` 3, e.g. ``<|endoftext|>``) are special tokens, matched whole in
    text as llama.cpp does."""
    reader = as_gguf(path)
    path = reader.path
    tok = Tokenizer.from_gguf(reader)
    if "tokenizer.ggml.token_type" in reader:
        tokens = field_value(reader, "tokenizer.ggml.tokens", "str[]")
        types = field_value(reader, "tokenizer.ggml.token_type", "int[]")
        if len(types) != len(tokens):
            raise GGUFError(
                f"{path}: metadata 'tokenizer.ggml.token_type' has {len(types)} entries for "
                f"{len(tokens)} tokens"
            )
        special = [t for t, k in zip(tokens, types, strict=True) if k == _CONTROL]
        tok.backend.add_special_tokens([AddedToken(t, special=True) for t in special])
    return tok

"""Load a Qwen3-MoE checkpoint into :class:`~ftlab.models.qwen3_moe.ModelWeights`.

HF format: ``config.json`` + ``*.safetensors`` (memory-mapped through safetensors'
``safe_open``), per-expert tensors ``mlp.experts.{e}.{gate,up,down}_proj.weight`` stacked into
banks ``w_gate_up [E, 2I, H]`` (gate rows, then up rows) and ``w_down [E, H, I]``. A missing
tensor, a tensor of the wrong shape or an unknown architecture raises a ValueError naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from tqdm import tqdm

from ftlab.models.qwen3_moe import LayerWeights, ModelWeights, Qwen3MoeConfig


class CheckpointError(ValueError):
    """A checkpoint ftlab cannot load; the message names the file and the tensor or key."""


class _Tensors:
    """Name -> tensor over every safetensors file of a directory, read lazily."""

    def __init__(self, path: Path):
        self.path = path
        self.files = {}
        self.where: dict[str, object] = {}
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{path}: no *.safetensors files")
        for f in files:
            try:
                handle = safe_open(str(f), framework="pt", device="cpu")
            except Exception as e:  # truncated or corrupt header
                raise CheckpointError(f"{f}: not a readable safetensors file: {e}") from e
            self.files[f] = handle
            for name in handle.keys():
                self.where[name] = handle

    def get(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        handle = self.where.get(name)
        if handle is None:
            raise CheckpointError(f"{self.path}: missing tensor {name!r}")
        try:
            t = handle.get_tensor(name)
        except Exception as e:
            raise CheckpointError(
                f"{self.path}: tensor {name!r} cannot be read (truncated file?): {e}"
            ) from e
        if tuple(t.shape) != tuple(shape):
            raise CheckpointError(
                f"{self.path}: tensor {name!r} has shape {tuple(t.shape)}, expected {tuple(shape)}"
            )
        return t.to(device=device, dtype=dtype)


def load_hf(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
            progress: bool = True) -> tuple[Qwen3MoeConfig, ModelWeights]:  # fmt: skip
    """Config and weights of a HF Qwen3-MoE directory, on ``device`` in ``dtype`` (default:
    the config's ``torch_dtype``/``dtype``, else bf16)."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{path}: no config.json")
    hf = json.loads(config_file.read_text())
    try:
        config = Qwen3MoeConfig.from_hf(hf)
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{config_file}: {e}") from e
    if dtype is None:
        dtype = getattr(torch, str(hf.get("torch_dtype") or hf.get("dtype") or "bfloat16"))
    device = torch.device(device)
    tensors = _Tensors(path)
    c = config
    h, hd, e, inter = c.hidden_size, c.head_dim, c.num_experts, c.moe_intermediate_size
    q_out, kv_out = c.num_attention_heads * hd, c.num_key_value_heads * hd

    def get(name: str, *shape: int) -> torch.Tensor:
        return tensors.get(name, shape, dtype, device)

    layers = []
    for i in tqdm(
        range(c.num_hidden_layers), desc=f"loading {path.name}", disable=not progress, unit="layer"
    ):
        p = f"model.layers.{i}."
        experts = p + "mlp.experts."
        gate = torch.stack([get(f"{experts}{j}.gate_proj.weight", inter, h) for j in range(e)])
        up = torch.stack([get(f"{experts}{j}.up_proj.weight", inter, h) for j in range(e)])
        layers.append(LayerWeights(
            q_proj=get(p + "self_attn.q_proj.weight", q_out, h),
            k_proj=get(p + "self_attn.k_proj.weight", kv_out, h),
            v_proj=get(p + "self_attn.v_proj.weight", kv_out, h),
            o_proj=get(p + "self_attn.o_proj.weight", h, q_out),
            q_norm=get(p + "self_attn.q_norm.weight", hd),
            k_norm=get(p + "self_attn.k_norm.weight", hd),
            input_norm=get(p + "input_layernorm.weight", h),
            post_attention_norm=get(p + "post_attention_layernorm.weight", h),
            router=get(p + "mlp.gate.weight", e, h),
            w_gate_up=torch.cat([gate, up], dim=1),  # [E, 2I, H]
            w_down=torch.stack([get(f"{experts}{j}.down_proj.weight", h, inter) for j in range(e)]),
        ))  # fmt: skip
    embed = get("model.embed_tokens.weight", c.vocab_size, h)
    lm_head = embed if c.tie_word_embeddings else get("lm_head.weight", c.vocab_size, h)
    return config, ModelWeights(embed, layers, get("model.norm.weight", h), lm_head)


# ------------------------------------------------------------------ GGUF (llama.cpp names)

GGUF_ARCH = "qwen3moe"
_GGUF_KEYS = {  # Qwen3MoeConfig field -> qwen3moe.* metadata key
    "num_hidden_layers": "block_count",
    "hidden_size": "embedding_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "num_experts": "expert_count",
    "num_experts_per_tok": "expert_used_count",
    "moe_intermediate_size": "expert_feed_forward_length",
    "rope_theta": "rope.freq_base",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "max_position_embeddings": "context_length",
}
_LAYER_NAMES = {  # LayerWeights field -> blk.N.* tensor (the banks are handled apart)
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "input_norm": "attn_norm",
    "post_attention_norm": "ffn_norm", "router": "ffn_gate_inp",
}  # fmt: skip


def _field_value(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    if value.dtype == np.float32 and len(value) == 1:
        # GGUF keeps floats as float32: take the shortest decimal that rounds to it (1e-06,
        # not 9.99999997e-07), which is what the original config said
        return float(str(value[0]))
    return value.tolist()[0] if len(value) == 1 else value.tolist()


def load_gguf(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
              progress: bool = True) -> tuple[Qwen3MoeConfig, ModelWeights]:  # fmt: skip
    """Config (``qwen3moe.*`` metadata) and weights (``blk.N.*`` tensors) of a llama.cpp GGUF
    file. Q4_0 tensors stay packed (:class:`~ftlab.quant.Q4_0Weight`, expert banks included);
    F32/F16/BF16 tensors are cast to ``dtype``; norms and the router are kept dense."""
    from ftlab import ops
    from ftlab.formats.gguf import GGUFError, open_reader, tensor_from_reader
    from ftlab.quant import Q4_0Weight

    path = Path(path)
    reader = open_reader(path)
    arch = _field_value(reader, "general.architecture")
    arch = bytes(arch).decode() if isinstance(arch, list) else arch
    if arch != GGUF_ARCH:
        raise CheckpointError(f"{path}: general.architecture must be '{GGUF_ARCH}', got {arch!r}")
    values = {}
    for name, key in _GGUF_KEYS.items():
        v = _field_value(reader, f"{GGUF_ARCH}.{key}")
        if v is None and name not in (
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_theta",
            "head_dim",
        ):
            raise CheckpointError(f"{path}: missing metadata key '{GGUF_ARCH}.{key}'")
        if v is not None:
            values[name] = v
    by_name = {t.name: t for t in reader.tensors}
    device = torch.device(device)

    def get(name: str, shape: tuple[int, ...], dense: bool = False):
        t = by_name.get(name)
        if t is None:
            raise CheckpointError(f"{path}: missing tensor {name!r}")
        try:
            value = tensor_from_reader(t, path)
        except GGUFError as e:
            raise CheckpointError(str(e)) from e
        if tuple(value.shape) != tuple(shape):
            raise CheckpointError(
                f"{path}: tensor {name!r} has shape {tuple(value.shape)}, expected {tuple(shape)}"
            )
        if isinstance(value, Q4_0Weight):
            return ops.dequantize_q4_0(value, dtype).to(device) if dense else value.to(device)
        return value.to(device=device, dtype=dtype)

    embd = by_name.get("token_embd.weight")
    if embd is None:
        raise CheckpointError(f"{path}: missing tensor 'token_embd.weight'")
    values["vocab_size"] = int(embd.shape[-1])
    values.setdefault("head_dim", values["hidden_size"] // values["num_attention_heads"])
    values["tie_word_embeddings"] = "output.weight" not in by_name
    values["norm_topk_prob"] = True  # llama.cpp's qwen3moe always renormalizes the top-k weights
    config = Qwen3MoeConfig(**values)
    c = config
    h, hd, e, inter = c.hidden_size, c.head_dim, c.num_experts, c.moe_intermediate_size
    shapes = {"q_proj": (c.num_attention_heads * hd, h), "k_proj": (c.num_key_value_heads * hd, h),
              "v_proj": (c.num_key_value_heads * hd, h), "o_proj": (h, c.num_attention_heads * hd),
              "q_norm": (hd,), "k_norm": (hd,), "input_norm": (h,), "post_attention_norm": (h,), "router": (e, h)}  # fmt: skip
    dense = {"q_norm", "k_norm", "input_norm", "post_attention_norm", "router"}
    layers = []
    for i in tqdm(
        range(c.num_hidden_layers), desc=f"loading {path.name}", disable=not progress, unit="layer"
    ):
        p = f"blk.{i}."
        parts = {f: get(p + n + ".weight", shapes[f], f in dense) for f, n in _LAYER_NAMES.items()}
        gate = get(p + "ffn_gate_exps.weight", (e, inter, h))
        up = get(p + "ffn_up_exps.weight", (e, inter, h))
        if isinstance(gate, Q4_0Weight) != isinstance(up, Q4_0Weight):
            raise CheckpointError(
                f"{path}: {p}ffn_gate_exps and {p}ffn_up_exps must share one type"
            )
        if isinstance(
            gate, Q4_0Weight
        ):  # rows are independent: stacking gate and up rows keeps the blocks
            w_gate_up = Q4_0Weight(torch.cat([gate.data, up.data], dim=1), (e, 2 * inter, h))
        else:
            w_gate_up = torch.cat([gate, up], dim=1)
        layers.append(
            LayerWeights(
                **parts, w_gate_up=w_gate_up, w_down=get(p + "ffn_down_exps.weight", (e, h, inter))
            )
        )
    embed = get("token_embd.weight", (c.vocab_size, h), dense=True)
    lm_head = embed if c.tie_word_embeddings else get("output.weight", (c.vocab_size, h))
    return config, ModelWeights(embed, layers, get("output_norm.weight", (h,), dense=True), lm_head)


def save_gguf(path: str | Path, config: Qwen3MoeConfig, weights: ModelWeights, quantize: bool = False,
              metadata: dict | None = None) -> Path:  # fmt: skip
    """Write a llama.cpp-style ``qwen3moe`` GGUF file. ``quantize``: the projections, expert
    banks and lm_head as Q4_0 (norms, router and embedding stay F32), as a Q4_0 llama.cpp
    file keeps small tensors in float."""
    from ftlab import ops
    from ftlab.formats.gguf import write_tensors
    from ftlab.quant import Q4_0Weight

    def out(t, q: bool):
        if isinstance(t, Q4_0Weight):
            return t
        if q and t.shape[-1] % 32 == 0:  # rows of whole blocks only, as llama.cpp falls back to F32
            return ops.quantize_q4_0(t.float(), backend="reference")
        return t.float()

    c = config
    tensors = {
        "token_embd.weight": weights.embed.float(),
        "output_norm.weight": weights.norm.float(),
    }
    if not c.tie_word_embeddings:
        tensors["output.weight"] = out(weights.lm_head, quantize)
    for i, lw in enumerate(weights.layers):
        p = f"blk.{i}."
        for field, name in _LAYER_NAMES.items():
            value = getattr(lw, field)
            tensors[p + name + ".weight"] = out(value, quantize and field.endswith("_proj"))
        inter = c.moe_intermediate_size
        gu = lw.w_gate_up
        if isinstance(gu, Q4_0Weight):
            tensors[p + "ffn_gate_exps.weight"] = Q4_0Weight(
                gu.data[:, :inter].contiguous(), (c.num_experts, inter, c.hidden_size)
            )
            tensors[p + "ffn_up_exps.weight"] = Q4_0Weight(
                gu.data[:, inter:].contiguous(), (c.num_experts, inter, c.hidden_size)
            )
        else:
            tensors[p + "ffn_gate_exps.weight"] = out(gu[:, :inter], quantize)
            tensors[p + "ffn_up_exps.weight"] = out(gu[:, inter:], quantize)
        tensors[p + "ffn_down_exps.weight"] = out(lw.w_down, quantize)
    meta = {f"{GGUF_ARCH}.{key}": getattr(c, name) for name, key in _GGUF_KEYS.items()}
    meta.update(metadata or {})
    return write_tensors(path, tensors, arch=GGUF_ARCH, metadata=meta)

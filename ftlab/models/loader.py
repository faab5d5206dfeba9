"""Load a Qwen3-MoE checkpoint into :class:`~ftlab.models.qwen3_moe.ModelWeights`.

HF format: ``config.json`` + ``*.safetensors`` (memory-mapped through safetensors'
``safe_open``), per-expert tensors ``mlp.experts.{e}.{gate,up,down}_proj.weight`` stacked into
banks ``w_gate_up [E, 2I, H]`` (gate rows, then up rows) and ``w_down [E, H, I]``. A missing
tensor, a tensor of the wrong shape or an unknown architecture raises a ValueError naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

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

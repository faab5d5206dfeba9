"""Load a HF Qwen3-MoE directory into :class:`~ftlab.models.qwen3_moe.ModelWeights`.

``config.json`` + safetensors shards (memory-mapped through safetensors' ``safe_open``),
per-expert tensors ``mlp.experts.{e}.{gate,up,down}_proj.weight`` stacked into banks
``w_gate_up [E, 2I, H]`` (gate rows, then up rows) and ``w_down [E, H, I]``.

Which shards: with ``model.safetensors.index.json``, only those its ``weight_map`` names, and
each tensor must be in the shard the index says (a stale extra shard in the folder is not
read); without an index, every ``*.safetensors``. Either way a tensor found in two shards is
refused instead of one copy silently winning. Every refusal is a
:class:`~ftlab.formats.CheckpointError` naming the file and the key or tensor: a config value
of the wrong type or range, a missing, misshapen or non-float tensor, an unreadable file.

Stored values are not scanned (that would read every byte of a checkpoint that is otherwise
memory-mapped lazily): a NaN or inf weight loads, and shows as non-finite logits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from ftlab.formats import CheckpointError
from ftlab.models.qwen3_moe import LayerWeights, ModelWeights, Qwen3MoeConfig
from ftlab.models.qwen3_next_config import MODEL_TYPES as NEXT_MODEL_TYPES

INDEX = "model.safetensors.index.json"
_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_EXPERT = re.compile(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\.")
# a bias of a layer's attention (a Qwen3.5 checkpoint's text model under model.language_model.)
_ATTENTION_BIAS = re.compile(r"model\.(language_model\.)?layers\.\d+\.(self|linear)_attn\..+\.bias")
#: The HF ``model_type`` values ftlab loads: this module's, and those of ``hf_next_loader``.
MODEL_TYPES = ("qwen3_moe", *NEXT_MODEL_TYPES)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _read_json(file: Path) -> object:
    try:
        return json.loads(file.read_bytes())
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise CheckpointError(f"{file}: not valid JSON: {e}") from e


def _weight_map(index_file: Path) -> dict[str, str]:
    """``tensor -> shard file name`` of an index, each shard a plain file name."""
    index = _read_json(index_file)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_file}: 'weight_map' must be a non-empty object "
                              f"{{tensor: shard file}}, got {weight_map!r:.80}")  # fmt: skip
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or shard in ("", ".", "..") or Path(shard).name != shard:
            raise CheckpointError(f"{index_file}: weight_map['{tensor}'] must be a file name in "
                                  f"the directory, got {shard!r}")  # fmt: skip
    return weight_map


class SafetensorsShards:
    """Name -> tensor over a directory's safetensors shards (module docstring: which shards),
    read lazily."""

    def __init__(self, path: Path):
        self.path = path
        index_file = path / INDEX
        weight_map = _weight_map(index_file) if index_file.is_file() else None
        if weight_map is not None:
            names = sorted(set(weight_map.values()))
        else:
            names = sorted(f.name for f in path.glob("*.safetensors"))
            if not names:
                raise CheckpointError(f"{path}: no *.safetensors files")
        self.handles = {}
        for name in names:
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"{index_file}: shard '{name}' is missing")
            try:
                self.handles[name] = safe_open(str(file), framework="pt", device="cpu")
            except Exception as e:  # SafetensorError on a truncated or corrupt header
                raise CheckpointError(f"{file}: not a readable safetensors file: {e}") from e
        self.where: dict[str, str] = {}  # tensor -> shard name
        for name, handle in self.handles.items():
            for tensor in handle.keys():
                if tensor in self.where:
                    raise CheckpointError(f"{path}: tensor '{tensor}' is in two shards, "
                                          f"{self.where[tensor]} and {name}")  # fmt: skip
                self.where[tensor] = name
        if weight_map is not None:
            self._check_index(index_file, weight_map)

    def _check_index(self, index_file: Path, weight_map: dict[str, str]) -> None:
        """The index and the shards agree, tensor by tensor."""
        for tensor, shard in weight_map.items():
            if self.where.get(tensor) != shard:
                found = f"it is in {self.where[tensor]}" if tensor in self.where else "no shard has it"
                raise CheckpointError(f"{index_file}: tensor '{tensor}' is mapped to {shard}, which "
                                      f"does not hold it ({found})")  # fmt: skip
        for tensor, shard in self.where.items():
            if tensor not in weight_map:
                raise CheckpointError(f"{index_file}: tensor '{tensor}' of {shard} is not in "
                                      f"'weight_map' (a stale index or shard?)")  # fmt: skip

    def check_counts(self, config: Qwen3MoeConfig, config_file: Path) -> None:
        """The layers (``model.layers.N``) and experts (``mlp.experts.J``) stored are those the
        config counts: a config that counts fewer would silently drop some, one that counts
        more fails on the first missing tensor only after loading all before it."""
        layers = {int(m[1]) for t in self.where if (m := _LAYER.match(t))}
        experts = {int(m[1]) for t in self.where if (m := _EXPERT.match(t))}
        path, n = self.path, config.num_hidden_layers
        check_count(config_file, path, "num_hidden_layers", n, layers, "layers")
        check_count(config_file, path, "num_experts", config.num_experts, experts, "experts")

    def read(self, name: str, rows: tuple[int, int] | None = None, columns: tuple[int, int] | None = None,
             ) -> tuple[torch.Tensor, tuple[int, ...], Path]:  # fmt: skip
        """Tensor ``name`` as stored (its dtype, on the host), its stored shape and its file.
        ``rows``: ``(start, stop)`` -- only those rows along dim 0 (``[stop - start, ...]``; fewer
        when the tensor has fewer: check the stored shape), a safetensors slice that reads only
        their bytes, copied into memory of its own (a slice may be a view of the memory-mapped
        file, which it then does not keep). ``columns``: ``(start, stop)`` -- only those columns of
        a 2-D tensor (``[:, start:stop]``), likewise. CheckpointError naming the file for a tensor
        missing or unreadable."""
        shard = self.where.get(name)
        if shard is None:
            raise CheckpointError(f"{self.path}: missing tensor {name!r}")
        file = self.path / shard
        try:
            if rows is None and columns is None:
                t = self.handles[shard].get_tensor(name)
                return t, tuple(t.shape), file
            part = self.handles[shard].get_slice(name)
            got = part[rows[0] : rows[1]] if columns is None else part[:, columns[0] : columns[1]]
            return got.clone(), tuple(part.get_shape()), file
        except Exception as e:  # SafetensorError
            raise CheckpointError(f"{file}: tensor {name!r} cannot be read: {e}") from e

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
            rows: tuple[int, int] | None = None, columns: tuple[int, int] | None = None) -> torch.Tensor:  # fmt: skip
        """Tensor ``name``, checked to be a float tensor of ``shape``, in ``dtype`` on
        ``device``; ``rows``: ``(start, stop)``, only those rows read (:meth:`read`), ``[stop -
        start, *shape[1:]]``; ``columns`` likewise, ``[shape[0], stop - start]``."""
        t, stored, file = self.read(name, rows, columns)
        if not t.dtype.is_floating_point:
            raise CheckpointError(f"{file}: tensor {name!r} has dtype {t.dtype}, expected a "
                                  "floating-point dtype")  # fmt: skip
        if stored != tuple(shape):
            raise CheckpointError(f"{file}: tensor {name!r} has shape {stored}, expected {tuple(shape)}")
        return t.to(device=device, dtype=dtype)


def check_count(
    config_file: Path, path: Path, key: str, count: int, stored: set[int], what: str
) -> None:
    """CheckpointError naming config key ``key`` unless the indices ``stored`` (ints >= 0: of
    the layers or experts that the shards in ``path`` hold) are ``0 .. count - 1``, checked
    without building that range."""
    if len(stored) != count or max(stored) != count - 1:  # i.e. stored != {0..count-1}
        have = f"{what} {min(stored)}..{max(stored)} ({len(stored)})" if stored else f"no {what}"
        raise CheckpointError(
            f"{config_file}: {key} is {count}, but the shards in {path} hold {have}"
        )


def refuse_attention_biases(stored: Iterable[str], path: Path) -> None:
    """CheckpointError naming the first of the tensors ``stored`` (in the shards in ``path``) that
    is a bias of a layer's attention (``self_attn.q_proj.bias``, any ``.bias`` under
    ``self_attn.`` or ``linear_attn.``): ftlab's attention has none (a config's
    ``attention_bias`` must be false), and a bias left unread would compute another model."""
    for name in stored:
        if _ATTENTION_BIAS.fullmatch(name):
            raise CheckpointError(
                f"{path}: tensor {name!r} is an attention bias, which ftlab does not apply (its "
                "attention projections have no bias)"
            )


def read_hf_config(path: Path) -> dict:
    """The dict of ``path/config.json`` (CheckpointError when absent, not JSON or not an object)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{path}: no config.json")
    hf = _read_json(config_file)
    if not isinstance(hf, dict):
        raise CheckpointError(f"{config_file}: must hold a JSON object, got {type(hf).__name__}")
    return hf


def stored_dtype(hf: dict, config_file: Path) -> torch.dtype:
    """The dtype a config names (``torch_dtype`` or ``dtype``; bf16 when it names none)."""
    key = "torch_dtype" if hf.get("torch_dtype") is not None else "dtype"
    stored = "bfloat16" if hf.get(key) is None else hf[key]
    if not isinstance(stored, str) or stored not in DTYPES:
        raise CheckpointError(f"{config_file}: {key} must be one of {sorted(DTYPES)} (or pass dtype=), got "
                              f"{stored!r}")  # fmt: skip
    return DTYPES[stored]


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


def load_hf(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
            progress: bool = True, experts: tuple[int, int] | None = None, vocab: tuple[int, int] | None = None,
            heads: tuple[tuple[int, int], tuple[int, int]] | None = None,
            ) -> tuple[Qwen3MoeConfig, ModelWeights]:  # fmt: skip
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
    from ftlab.models.gguf_loader import expert_range, head_ranges, row_range

    path = Path(path)
    config, dtype = read_config(path, dtype)
    e0, e1 = expert_range(experts, config.num_experts)
    vocab = None if vocab is None else row_range(vocab, config.vocab_size, "vocab")
    heads = head_ranges(heads, config.num_attention_heads, config.num_key_value_heads)
    device = torch.device(device)
    tensors = SafetensorsShards(path)
    tensors.check_counts(config, path / "config.json")
    refuse_attention_biases(tensors.where, path)
    c = config
    h, hd, e, inter = c.hidden_size, c.head_dim, c.num_experts, c.moe_intermediate_size
    q_out, kv_out = c.num_attention_heads * hd, c.num_key_value_heads * hd

    def get(name: str, *shape: int) -> torch.Tensor:
        return tensors.get(name, shape, dtype, device)

    q_rows = kv_rows = None  # heads=: the rank's rows of q_proj and of k_proj / v_proj (o_proj: q_rows' columns)
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
        gate = torch.stack([get(f"{experts_of}{j}.gate_proj.weight", inter, h) for j in range(e0, e1)])
        up = torch.stack([get(f"{experts_of}{j}.up_proj.weight", inter, h) for j in range(e0, e1)])
        layers.append(LayerWeights(
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
            w_down=torch.stack([get(f"{experts_of}{j}.down_proj.weight", h, inter) for j in range(e0, e1)]),
        ))  # fmt: skip
    embed = tensors.get("model.embed_tokens.weight", (c.vocab_size, h), dtype, device, vocab)
    lm_head = embed if c.tie_word_embeddings else tensors.get("lm_head.weight", (c.vocab_size, h), dtype, device, vocab)
    return config, ModelWeights(embed, layers, get("model.norm.weight", h), lm_head)

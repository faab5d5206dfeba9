"""Qwen3-MoE <-> llama.cpp GGUF files (``qwen3moe.*`` metadata, ``blk.N.*`` tensors).

Loading checks the file in two steps. Structure first, before anything is allocated:
:func:`ftlab.formats.gguf.open_gguf` validates every count, length, type and tensor extent
of the header, then reads through the ``gguf`` package. Then meaning, here: every metadata
value of the type ftlab expects, the config's ranges (:class:`Qwen3MoeConfig` checks them),
``block_count`` equal to the ``blk.N`` groups present, every tensor of the shape the config
implies, the vocabulary of ``token_embd`` equal to the tokenizer's token count. Every refusal
is a :class:`~ftlab.formats.gguf.GGUFError` naming the file and the key or tensor.

Stored values are not scanned (a Q4_0 file would be read whole to check its block scales):
a NaN or inf weight loads, and shows as non-finite logits.

Q4_0, Q8_0 and the K-quants (Q4_K, Q5_K, Q6_K: what llama.cpp's Q4_0, Q4_K_M, Q5_K_M, Q6_K and
Q8_0 files hold) stay packed, zero-copy, moved to the device: the model multiplies them through
``ops.q4_0_matmul``, ``ops.quant_matmul`` and ``ops.moe_experts``; the embedding is dequantized
(``ops.index`` gathers dense rows). A file never fails for its quantization mix alone: tensors of
a type without an ftlab matmul kernel (Q4_1, Q5_0, the IQ types, ..., dequantized by gguf-py)
run dense in ``dtype``, with one :class:`~ftlab.formats.DequantizedWarning` a file naming them;
a layer whose expert banks mix packed and dequantized ones, or whose gate and up banks differ in
type (their rows are stacked into one gate_up bank), runs them all dense, named in the same
warning.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch
from gguf import quants as gguf_quants
from tqdm import tqdm

from ftlab import ops
from ftlab.formats import DequantizedWarning
from ftlab.formats.gguf import (
    GGUFError,
    as_gguf,
    cut,
    dequantized_types,
    field_value,
    tensor_from_file,
)
from ftlab.formats.gguf_read import GGUFFile
from ftlab.formats.gguf_write import Blocks, write_tensors
from ftlab.models.checkpoint_checks import expert_range, head_ranges, row_range
from ftlab.models.qwen3_moe.config import Qwen3MoeConfig
from ftlab.models.qwen3_moe.model_weights import LayerWeights, ModelWeights
from ftlab.quant import Q4_0Weight, QuantWeight, quant_weight

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
# head_dim defaults to hidden / heads and the rope base to 10000, as in llama.cpp (whose
# qwen3moe loader requires the eps); a missing context length is the config's default
_OPTIONAL = ("max_position_embeddings", "head_dim", "rope_theta")
_ROPE_BASE_DEFAULT = 10000.0
_FLOAT_FIELDS = ("rope_theta", "rms_norm_eps")
_LAYER_NAMES = {  # LayerWeights field -> blk.N.* tensor (the banks are handled apart)
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "q_norm": "attn_q_norm",
    "k_norm": "attn_k_norm",
    "input_norm": "attn_norm",
    "post_attention_norm": "ffn_norm",
    "router": "ffn_gate_inp",
}
_BLOCK_TENSORS = (*_LAYER_NAMES.values(), "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_BLOCK = re.compile(r"blk\.(\d+)\.")


def read_config(reader, path: Path) -> Qwen3MoeConfig:
    """The model config of a GGUF file's ``qwen3moe.*`` metadata and tensor table, checked
    against the tensors the file holds and its tokenizer's token count."""
    arch = field_value(reader, "general.architecture", "str")
    if arch != GGUF_ARCH:
        raise GGUFError(f"{path}: general.architecture must be '{GGUF_ARCH}', got {arch!r}")
    values = {}
    for name, key in _GGUF_KEYS.items():
        v = field_value(reader, f"{GGUF_ARCH}.{key}", "float" if name in _FLOAT_FIELDS else "int")
        if v is None and name not in _OPTIONAL:
            raise GGUFError(f"{path}: missing metadata key '{GGUF_ARCH}.{key}'")
        if v is not None:
            values[name] = v
    values.setdefault("rope_theta", _ROPE_BASE_DEFAULT)
    tensors = {t.name: t for t in reader.tensors}
    embd = tensors.get("token_embd.weight")
    if embd is None or len(embd.shape) != 2:
        got = "none" if embd is None else f"shape {list(reversed(embd.shape.tolist()))}"
        raise GGUFError(f"{path}: tensor 'token_embd.weight' must be [vocab, hidden], got {got}")
    values["vocab_size"] = int(embd.shape[-1])
    source = {f: f"metadata '{GGUF_ARCH}.{k}'" for f, k in _GGUF_KEYS.items()}
    source["vocab_size"] = "the rows of tensor 'token_embd.weight'"
    if "head_dim" not in values:
        source["head_dim"] = f"{source['hidden_size']} / {source['num_attention_heads']}"
        # a head count < 1 is the config's to report, by name, not a ZeroDivisionError here
        values["head_dim"] = values["hidden_size"] // max(values["num_attention_heads"], 1)
    values["tie_word_embeddings"] = "output.weight" not in tensors
    values["norm_topk_prob"] = True  # llama.cpp's qwen3moe always renormalizes the top-k weights
    try:
        config = Qwen3MoeConfig(**values)
    except ValueError as e:  # the message names the field: say where in the file it came from
        named = [k for f, k in source.items() if re.search(rf"\b{f}\b", str(e))]
        raise GGUFError(f"{path}: {e} (from {' and '.join(named)})") from e
    value_length = field_value(reader, f"{GGUF_ARCH}.attention.value_length", "int")
    if value_length not in (None, config.head_dim):  # ftlab's attention has one head dim
        raise GGUFError(
            f"{path}: metadata '{GGUF_ARCH}.attention.value_length' ({value_length}) must equal "
            f"the key head dim ({config.head_dim}, from {source['head_dim']})"
        )
    tokens = field_value(reader, "tokenizer.ggml.tokens", "str[]")
    if tokens is not None and len(tokens) != config.vocab_size:
        raise GGUFError(
            f"{path}: tensor 'token_embd.weight' has {config.vocab_size} rows but "
            f"metadata 'tokenizer.ggml.tokens' has {len(tokens)} tokens"
        )
    _check_tensor_names(set(tensors), config, path)
    return config


def _check_tensor_names(names: set[str], config: Qwen3MoeConfig, path: Path) -> None:
    """``blk.N`` groups for exactly N < block_count, and no tensor the model does not use."""
    layers = config.num_hidden_layers
    blocks = {int(m[1]) for n in names if (m := _BLOCK.match(n))}
    beyond = sorted(n for n in blocks if n >= layers)
    if beyond:
        raise GGUFError(
            f"{path}: there are tensors of blk.{beyond[0]}, beyond metadata "
            f"'{GGUF_ARCH}.block_count' ({layers})"
        )
    if len(blocks) < layers:  # the first absent block: at most len + 1 probes
        absent = next(n for n in range(len(blocks) + 1) if n not in blocks)
        raise GGUFError(
            f"{path}: metadata '{GGUF_ARCH}.block_count' is {layers}, but there are "
            f"no tensors of blk.{absent}"
        )
    wanted = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{n}.weight" for i in range(layers) for n in _BLOCK_TENSORS
    }
    extra = sorted(names - wanted)
    if extra:  # llama.cpp refuses these too ("wrong number of tensors")
        raise GGUFError(
            f"{path}: tensor '{extra[0]}' is not part of a {GGUF_ARCH} model "
            f"({len(extra)} such tensors)"
        )


def cut_columns(w, start: int, stop: int):
    """Columns ``start .. stop`` (along the last dim) of a ``[N, K]`` tensor as read from the file
    (o_proj's of a rank's heads), copied; a packed one whole blocks of each row (only their bytes
    read). The tensor itself when that is all of it, or when the cut falls inside a packed block
    (read whole: the shard keeps its share dense, :func:`~ftlab.models.tensor_parallel.columns`)."""
    from ftlab.models.tensor_parallel import columns, whole_blocks

    if (start == 0 and stop == w.shape[-1]) or not whole_blocks(w, start, stop):
        return w
    return columns(w, start, stop, "")


def load_gguf(
    path: str | Path | GGUFFile,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
    experts: tuple[int, int] | None = None,
    vocab: tuple[int, int] | None = None,
    heads: tuple[tuple[int, int], tuple[int, int]] | None = None,
) -> tuple[Qwen3MoeConfig, ModelWeights]:
    """Config (``qwen3moe.*`` metadata) and weights (``blk.N.*`` tensors) of a llama.cpp GGUF
    file (``path``, or the :class:`~ftlab.formats.gguf_read.GGUFFile` already open: parsed
    once). Q4_0, Q8_0 and K-quant tensors stay packed (:class:`~ftlab.quant.Q4_0Weight`,
    :class:`~ftlab.quant.QuantWeight`, expert banks and lm_head included; the embedding dense);
    F32/F16/BF16 tensors are cast to ``dtype``; norms and the router are kept dense.
    ``experts``: ``(start, stop)`` -- the expert banks hold only those experts (a tensor-parallel
    rank's share: the file is memory-mapped, so the other experts' bytes are never read -- but
    for banks of a type ftlab has no kernel for, which the reader dequantizes whole; float banks
    are cast for the range only; the router still scores every expert). ``vocab``: ``(start,
    stop)`` -- the embedding ``[stop - start, H]`` (dense in ``dtype``) and an untied lm_head
    (packed as stored, or in ``dtype``) hold only those vocabulary rows: ``token_embd.weight`` /
    ``output.weight`` are sliced as read, before the embedding is dequantized or anything cast (a
    tensor-parallel rank's vocabulary shard; a type ftlab has no kernel for is dequantized whole
    by the reader first). ``heads``: ``((q_start, q_stop), (kv_start, kv_stop))`` -- ``attn_q``
    holds only those query heads' rows, ``attn_k`` / ``attn_v`` those key/value heads' rows and
    ``attn_output`` those query heads' columns (a tensor-parallel rank's attention shard), cut as
    read, before any cast (packed rows are views of the file; packed columns whole blocks of each
    row, or, where the cut falls inside a block, all of them: the shard keeps that share dense).
    None: all of them, for any. ValueError naming ``experts``, ``vocab`` or ``heads`` for a range
    that is not ``0 <= start < stop <= count``. GGUFError naming the file and the key or tensor
    for anything ftlab cannot load (module docstring)."""
    reader = as_gguf(path)
    path = reader.path
    c = read_config(reader, path)
    e0, e1 = expert_range(experts, c.num_experts)
    vocab = row_range(vocab, c.vocab_size, "vocab")
    heads = head_ranges(heads, c.num_attention_heads, c.num_key_value_heads)
    by_name = {t.name: t for t in reader.tensors}
    device = torch.device(device)

    def get(
        name: str,
        shape: tuple[int, ...],
        dense: bool = False,
        part: tuple[int, int] | None = None,
        cols: tuple[int, int] | None = None,
    ):
        t = by_name.get(name)
        if t is None:
            raise GGUFError(f"{path}: missing tensor {name!r}")
        value = tensor_from_file(t, path)
        if tuple(value.shape) != tuple(shape):
            raise GGUFError(
                f"{path}: tensor {name!r} has shape {tuple(value.shape)}, expected {tuple(shape)}"
            )
        if part is not None:  # the range's experts or rows, before any cast (cast for those only)
            value = cut(value, *part)
        if cols is not None:  # the range's columns, likewise
            value = cut_columns(value, *cols)
        if isinstance(value, Q4_0Weight):
            return ops.dequantize_q4_0(value, dtype).to(device) if dense else value.to(device)
        if isinstance(value, QuantWeight):  # Q8_0 and the K-quants: packed, as Q4_0
            return ops.dequantize(value.to(device), dtype) if dense else value.to(device)
        return value.to(device=device, dtype=dtype)

    def densify(w):
        if isinstance(w, Q4_0Weight):
            return ops.dequantize_q4_0(w, dtype)
        return ops.dequantize(w, dtype) if isinstance(w, QuantWeight) else w

    h, hd, e, inter = c.hidden_size, c.head_dim, c.num_experts, c.moe_intermediate_size
    shapes = {
        "q_proj": (c.num_attention_heads * hd, h),
        "k_proj": (c.num_key_value_heads * hd, h),
        "v_proj": (c.num_key_value_heads * hd, h),
        "o_proj": (h, c.num_attention_heads * hd),
        "q_norm": (hd,),
        "k_norm": (hd,),
        "input_norm": (h,),
        "post_attention_norm": (h,),
        "router": (e, h),
    }
    dense = {"q_norm", "k_norm", "input_norm", "post_attention_norm", "router"}
    rows_of, cols_of = {}, {}  # LayerWeights field -> the rank's rows / columns (heads=)
    if heads is not None:
        (q0, q1), (k0, k1) = heads
        rows_of = {
            "q_proj": (q0 * hd, q1 * hd),
            "k_proj": (k0 * hd, k1 * hd),
            "v_proj": (k0 * hd, k1 * hd),
        }
        cols_of = {"o_proj": (q0 * hd, q1 * hd)}
    layers, mixed = [], []
    for i in tqdm(
        range(c.num_hidden_layers), desc=f"loading {path.name}", disable=not progress, unit="layer"
    ):
        p = f"blk.{i}."
        parts = {
            f: get(p + n + ".weight", shapes[f], f in dense, rows_of.get(f), cols_of.get(f))
            for f, n in _LAYER_NAMES.items()
        }
        gate, up, down = (
            get(p + name, shape, part=(e0, e1))
            for name, shape in (
                ("ffn_gate_exps.weight", (e, inter, h)),
                ("ffn_up_exps.weight", (e, inter, h)),
                ("ffn_down_exps.weight", (e, h, inter)),
            )
        )
        banks = [gate, up, down]
        packed = [isinstance(b, QuantWeight) for b in banks]
        if any(packed) and (not all(packed) or gate.qtype != up.qtype):
            # gate and up rows concatenate within one type, and the expert kernels take packed or
            # dense banks, not a mix: such a layer runs its packed banks dense too
            names = (
                f"{p}ffn_gate_exps.weight",
                f"{p}ffn_up_exps.weight",
                f"{p}ffn_down_exps.weight",
            )
            mixed.extend(n for n, q in zip(names, packed, strict=True) if q)
            gate, up, down = (densify(b) for b in banks)
        # rows are independent: stacking gate and up rows keeps the blocks
        if isinstance(gate, QuantWeight):
            w_gate_up = quant_weight(
                torch.cat([gate.data, up.data], dim=1), (e1 - e0, 2 * inter, h), gate.qtype
            )
        else:
            w_gate_up = torch.cat([gate, up], dim=1)
        layers.append(LayerWeights(**parts, w_gate_up=w_gate_up, w_down=down))
    stored = get("token_embd.weight", (c.vocab_size, h), part=vocab)
    embed = densify(stored)  # ops.index gathers dense rows
    lm_head = (
        stored if c.tie_word_embeddings else get("output.weight", (c.vocab_size, h), part=vocab)
    )
    slow = dequantized_types(reader)
    if mixed:
        slow["banks beside another type"] = mixed
    if slow:
        listed = "; ".join(
            f"{kind}: "
            f"{', '.join(names[:3])}{f' and {len(names) - 3} more' if len(names) > 3 else ''}"
            for kind, names in sorted(slow.items())
        )
        warnings.warn(
            f"{path}: {sum(map(len, slow.values()))} tensors have a type ftlab has no matmul "
            "kernel for, or one the expert kernels cannot take beside the layer's other banks, "
            f"and run dense, dequantized ({listed})",
            DequantizedWarning,
            stacklevel=2,
        )
    return c, ModelWeights(embed, layers, get("output_norm.weight", (h,), dense=True), lm_head)


def save_gguf(
    path: str | Path,
    config: Qwen3MoeConfig,
    weights: ModelWeights,
    quantize: bool = False,
    metadata: dict | None = None,
    types: dict | None = None,
) -> Path:
    """Write a llama.cpp-style ``qwen3moe`` GGUF file. ``quantize``: the projections, expert
    banks and lm_head as Q4_0 (norms, router and embedding stay F32), as a Q4_0 llama.cpp
    file keeps small tensors in float. ``types``: ``{tensor name: gguf.GGMLQuantizationType}``,
    tensors written in another type, quantized by gguf-py from their float values (a quant
    mix, as llama.cpp's files have: ``{"output.weight": Q8_0}``)."""

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
    for name, qtype in (types or {}).items():
        if name not in tensors:
            raise ValueError(f"types names {name!r}, which is not a tensor of this model")
        value = tensors[name]
        value = ops.dequantize(value) if isinstance(value, QuantWeight) else value
        tensors[name] = Blocks(gguf_quants.quantize(value.float().cpu().numpy(), qtype), qtype)
    meta = {f"{GGUF_ARCH}.{key}": getattr(c, name) for name, key in _GGUF_KEYS.items()}
    meta.update(metadata or {})
    return write_tensors(path, tensors, arch=GGUF_ARCH, metadata=meta)

"""Qwen3.6 (``qwen35moe``) and Qwen3-Next (``qwen3next``) GGUF files, as llama.cpp's converter
writes them, read back into the HF state dict and config (transformers' names and
conventions: ``Qwen3_5MoeForCausalLM`` / ``Qwen3NextForCausalLM``). The metadata (the config,
the tokenizer): :mod:`~ftlab.models.qwen3_next.gguf_metadata`; writing:
:mod:`~ftlab.models.qwen3_next.gguf_write`.

The converter (``conversion/qwen.py``) changes these, and reading undoes each:

- the zero-centred RMSNorm weights (``input_layernorm``, ``post_attention_layernorm``,
  ``self_attn.q_norm`` / ``k_norm``, ``model.norm``) are stored as ``w + 1``; the gated norm of
  the linear attention (``linear_attn.norm``) as it is;
- ``linear_attn.A_log`` is stored as ``A = -exp(A_log)``, ``dt_bias`` as ``ssm_dt.bias``,
  ``conv1d.weight`` ``[C, 1, K]`` squeezed to ``[C, K]``;
- Qwen3.6 with more V heads than K heads: the V heads are reordered from grouped by K head to
  tiled (``v_perm``) along the rows of in_proj_qkv's V part, in_proj_z, in_proj_a, in_proj_b,
  A_log, dt_bias, conv1d's V channels, and along the columns (the input) of ``out_proj``;
- Qwen3-Next: ``in_proj_qkvz`` (per K head ``[q, k, v, z]``) is split into ``attn_qkv`` (all q,
  all k, all v) and ``attn_gate`` (all z); ``in_proj_ba`` is kept as it is (``ssm_ba``), and
  no V head is reordered;
- the fused expert bank ``gate_up_proj`` ``[E, 2I, H]`` is split into ``ffn_gate_exps`` and
  ``ffn_up_exps`` (kept whole, ``ffn_gate_up_exps``, with ``--fuse-gate-up-exps``; with
  ``--fuse-qkv`` the full-attention q, k, v projections are one ``attn_qkv``);
- the multi-token-prediction head (``mtp.*``, ``nextn_predict_layers`` > 0) becomes the last
  blocks: ``mtp.layers.i.*`` block ``num_hidden_layers + i``, ``mtp.fc`` /
  ``mtp.pre_fc_norm_embedding`` / ``mtp.pre_fc_norm_hidden`` / ``mtp.norm`` its
  ``nextn.eh_proj`` / ``enorm`` / ``hnorm`` / ``shared_head_norm`` (norms ``w + 1`` too).

The full-attention ``q_proj`` (query and output gate interleaved per head) and everything else
keep HF's layout. A FLOAT32 norm ``w + 1`` gives back ``w`` to within half an ulp of 1 (what
the addition rounded away; ``1 + w``, what the model computes, is exact), and ``A_log`` is
``log(-A)`` (exact to the f32 rounding of ``exp``): these two are the only values not
bit-identical to the checkpoint the file was made from.

Validation follows the Qwen3-MoE loader (:mod:`ftlab.models.qwen3_moe.gguf`): the structure by
:func:`~ftlab.formats.gguf.open_gguf`, then every metadata value of its type, the sizes
consistent (:func:`~ftlab.models.qwen3_next.gguf_metadata.read_config`), ``block_count`` equal
to the ``blk.N`` groups, every tensor present and of the shape the config implies, none extra.
Refusals are :class:`~ftlab.formats.gguf.GGUFError` naming the file and the key or tensor.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from ftlab import argcheck, ops
from ftlab.formats import DequantizedWarning
from ftlab.formats.gguf import (
    FLOAT_TYPES,
    PACKED_TYPES,
    GGUFError,
    as_gguf,
    cut,
    field_value,
    tensor_from_file,
)
from ftlab.formats.gguf_read import GGUFFile
from ftlab.models.checkpoint_checks import expert_range, row_range
from ftlab.models.qwen3_next.gguf_layout import (
    QKV,
    Dims,
    block_prefix,
    col_perm,
    gather_cols,
    gather_rows,
    gguf_name,
    gguf_shapes,
    hf_shapes,
    inverse,
    plus_one,
    qkvz_perm,
    row_perm,
    row_slice,
)
from ftlab.models.qwen3_next.gguf_metadata import read_config
from ftlab.quant import QuantWeight, quant_weight

_BLOCK = re.compile(r"blk\.(\d+)\.")
#: Tensors returned dense in ``dtype`` whatever their stored type (values changed, or not matmul
#: weights).
_DENSE = (
    "layernorm.weight",
    "norm.weight",
    "A_log",
    "dt_bias",
    "conv1d.weight",
    "mlp.gate.weight",
    "shared_expert_gate.weight",
    "model.embed_tokens.weight",
)
#: The routed expert banks (``[E, ...]``; not the router ``ffn_gate_inp`` nor the shared expert's
#: ``*_shexp``).
_BANKS = (
    "ffn_gate_exps.weight",
    "ffn_up_exps.weight",
    "ffn_down_exps.weight",
    "ffn_gate_up_exps.weight",
)
#: The vocabulary tensors (``[V, H]``), cut to a rank's rows.
_VOCAB = ("token_embd.weight", "output.weight")


def _check_names(names: set[str], shapes: dict, block_count: int, key: str, path: Path) -> None:
    """``blk.N`` groups for exactly N < ``block_count``, every tensor of ``shapes``, nothing
    else."""
    blocks = {int(m[1]) for n in names if (m := _BLOCK.match(n))}
    beyond = sorted(n for n in blocks if n >= block_count)
    if beyond:
        raise GGUFError(
            f"{path}: there are tensors of blk.{beyond[0]}, beyond the {block_count} blocks of "
            f"metadata '{key}'"
        )
    absent = sorted(set(range(block_count)) - blocks)
    if absent:
        raise GGUFError(
            f"{path}: metadata '{key}' is {block_count}, but there are no tensors of "
            f"blk.{absent[0]}"
        )
    missing = sorted(set(shapes) - names)
    if missing:
        raise GGUFError(f"{path}: missing tensor {missing[0]!r} ({len(missing)} missing)")
    extra = sorted(names - set(shapes))
    if extra:
        raise GGUFError(
            f"{path}: tensor '{extra[0]}' is not part of this model ({len(extra)} such tensors)"
        )


def read_gguf_hf(
    path: str | Path | GGUFFile,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    experts: tuple[int, int] | None = None,
    vocab: tuple[int, int] | None = None,
) -> tuple[dict, dict[str, torch.Tensor | QuantWeight], dict[str, torch.Tensor]]:
    """``(hf_config, tensors, input_perms)`` of a ``qwen35moe`` / ``qwen3next`` GGUF file
    (``path``, or the :class:`~ftlab.formats.gguf_read.GGUFFile` already open: parsed once).

    ``hf_config``: the ``config.json`` dict (:func:`read_config`). ``tensors``: ``{HF name:
    value}`` exactly as transformers names and lays them out (module docstring): on ``device``;
    float tensors in ``dtype``; the matmul weights (projections, expert banks, shared expert,
    ``lm_head``) of a type ftlab computes on (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) stay packed
    :class:`~ftlab.quant.QuantWeight` (whole rows move under the V-head reordering), those of other
    quantized types come dequantized in ``dtype`` with one :class:`DequantizedWarning`;
    norms, ``A_log``, ``dt_bias``, ``conv1d``, the routers and the embedding are always dense.

    ``input_perms``: ``{HF name: LongTensor [K]}`` for a packed ``linear_attn.out_proj.weight``
    whose columns the file holds in the converter's V-head order and which cannot be put back
    because the value head dim is not a multiple of its type's block: that weight is returned as
    stored, and the model must permute its activation before the matmul, ``F.linear(x[..., perm], W)
    == F.linear(x, W_hf)``.

    ``experts``: ``(start, stop)`` (None: all) -- the routed banks of every layer (the MTP's
    too), ``mlp.experts.gate_up_proj`` ``[stop - start, 2I, H]`` and ``down_proj`` ``[stop -
    start, H, I]``, hold only those experts (a tensor-parallel rank's share): each GGUF bank is cut
    by :func:`~ftlab.formats.gguf.cut` before it is joined, moved or cast (a packed bank's
    slice is a view of the memory-mapped file, so the other experts' bytes are never read; a float
    one is copied for the range; a bank of a type ftlab has no kernel for is dequantized whole by
    the reader first). The router (``mlp.gate`` ``[E, H]``) and the shared expert stay whole.

    ``vocab``: ``(start, stop)`` (None: all) -- ``model.embed_tokens.weight`` (dense in
    ``dtype``) and an untied ``lm_head.weight`` (packed as stored, or in ``dtype``) ``[stop -
    start, H]`` hold only those vocabulary rows (a rank's vocabulary shard): ``token_embd`` /
    ``output`` are cut as read, so only those rows are dequantized or cast.

    ValueError naming ``experts`` or ``vocab`` for a range that is not ``0 <= start < stop <=
    count``.
    """
    argcheck.float_dtype("dtype", dtype)
    device = torch.device(device)
    reader = as_gguf(path)
    path = reader.path
    config = read_config(reader, path)
    banks = expert_range(experts, config["num_experts"])
    vocab = row_range(vocab, config["vocab_size"], "vocab")
    arch = field_value(reader, "general.architecture", "str")
    block_count = config["num_hidden_layers"] + config.get("mtp_num_hidden_layers", 0)
    by_name = {t.name: t for t in reader.tensors}
    full = [i for i, kind in enumerate(config["layer_types"]) if kind == "full_attention"]
    full += range(config["num_hidden_layers"], block_count)
    fused = (
        any(t.name.endswith(".ffn_gate_up_exps.weight") for t in reader.tensors),
        any(f"blk.{i}.attn_qkv.weight" in by_name for i in full),
    )
    shapes = gguf_shapes(arch, config, *fused)
    _check_names(set(by_name), shapes, block_count, f"{arch}.block_count", path)
    d = Dims.of(config)
    dequantized = {}
    for name, shape in shapes.items():  # from the tensor table: nothing is read yet
        t = by_name[name]
        got = tuple(int(n) for n in reversed(t.shape.tolist()))
        if got != shape and not (name.endswith("ffn_gate_inp_shexp.weight") and got == shape[1:]):
            raise GGUFError(
                f"{path}: tensor {name!r} has shape {list(got)}, expected {list(shape)}"
            )
        if t.tensor_type in PACKED_TYPES and len(got) < 2:
            raise GGUFError(
                f"{path}: tensor {name!r} is a vector of {t.tensor_type.name} blocks (packed "
                "types are matrices)"
            )
        if t.tensor_type not in FLOAT_TYPES and t.tensor_type not in PACKED_TYPES:
            dequantized.setdefault(t.tensor_type.name, []).append(name)
    if dequantized:
        listed = "; ".join(
            f"{k}: {', '.join(v[:3])}{f' and {len(v) - 3} more' if len(v) > 3 else ''}"
            for k, v in sorted(dequantized.items())
        )
        warnings.warn(
            f"{path}: {sum(map(len, dequantized.values()))} tensors have a type ftlab has no "
            f"kernel for and are loaded dequantized ({listed})",
            DequantizedWarning,
            stacklevel=2,
        )
    loaded = _Lazy(by_name, shapes, path, device, banks, vocab)
    tensors, input_perms = {}, {}
    for name in hf_shapes(arch, config):
        value = _hf_value(arch, name, loaded, d, config)
        if (perm := row_perm(arch, name, d)) is not None:
            value = gather_rows(value, inverse(perm))
        if (perm := col_perm(arch, name, d)) is not None:
            moved = gather_cols(value, inverse(perm), d.v_dim)
            if moved is None:
                input_perms[name] = perm.to(device)
            else:
                value = moved
        tensors[name] = _finish(name, value, dtype)
    return config, tensors, input_perms


class _Lazy:
    """The file's tensors by GGUF name, each read (zero-copy) and moved to ``device`` when first
    asked for and dropped once used: a fused ``attn_qkv`` of a full-attention block serves three
    HF tensors, every other one a single one; peak memory stays about one tensor above the result.
    A routed bank (:data:`_BANKS`) is cut to experts ``banks = (start, stop)`` as read, before the
    move, the embedding and lm_head (:data:`_VOCAB`) to rows ``vocab = (start, stop)``."""

    def __init__(
        self,
        by_name: dict,
        shapes: dict,
        path: Path,
        device: torch.device,
        banks: tuple[int, int],
        vocab: tuple[int, int],
    ):
        self.by_name, self.shapes, self.path, self.device = by_name, shapes, path, device
        self.banks, self.vocab = banks, vocab
        self.cache: dict[str, tuple[object, int]] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.shapes

    def __getitem__(self, name: str):
        if name not in self.cache:
            uses = (
                3
                if name.endswith(".attn_qkv.weight")
                and name.replace("attn_qkv", "attn_q_norm") in self.shapes
                else 1
            )
            value = tensor_from_file(self.by_name[name], self.path)
            if name.endswith(_BANKS):
                value = cut(value, *self.banks)
            elif name in _VOCAB:
                value = cut(value, *self.vocab)
            self.cache[name] = (value.to(self.device), uses)
        value, uses = self.cache.pop(name)
        if uses > 1:
            self.cache[name] = (value, uses - 1)
        return value


def _hf_value(arch: str, name: str, loaded: _Lazy, d: Dims, config: dict):
    """The HF tensor ``name`` from the loaded GGUF tensors, its V heads still in file order."""
    if name.endswith("in_proj_qkvz.weight"):
        p = block_prefix(name, config["num_hidden_layers"])
        qkv, z = loaded[p + "attn_qkv.weight"], loaded[p + "attn_gate.weight"]
        if isinstance(qkv, QuantWeight) != isinstance(z, QuantWeight) or (
            isinstance(qkv, QuantWeight) and qkv.qtype != z.qtype
        ):
            qkv, z = _dense(qkv), _dense(z)
        if isinstance(qkv, QuantWeight):
            both = quant_weight(
                torch.cat([qkv.data, z.data]), (qkv.shape[0] + z.shape[0], qkv.shape[1]), qkv.qtype
            )
        else:
            both = torch.cat([qkv, z.to(qkv.dtype)])
        return gather_rows(both, qkvz_perm(d))
    p = block_prefix(name, config["num_hidden_layers"]) if "layers." in name else ""
    if p + "attn_qkv.weight" in loaded and name.endswith(QKV):
        qkv, q_rows, kv_rows = (
            loaded[p + "attn_qkv.weight"],
            2 * d.heads * d.head_dim,
            d.kv_heads * d.head_dim,
        )
        start = {"q": 0, "k": q_rows, "v": q_rows + kv_rows}[name.split(".")[-2][0]]
        return row_slice(
            qkv, start, start + (q_rows if name.endswith("q_proj.weight") else kv_rows)
        )
    if p + "ffn_gate_up_exps.weight" in loaded and name.endswith("experts.gate_up_proj"):
        return loaded[p + "ffn_gate_up_exps.weight"]
    if name.endswith("experts.gate_up_proj"):
        gate, up = loaded[p + "ffn_gate_exps.weight"], loaded[p + "ffn_up_exps.weight"]
        if isinstance(gate, QuantWeight) and isinstance(up, QuantWeight) and gate.qtype == up.qtype:
            e, i, h = gate.shape
            return quant_weight(torch.cat([gate.data, up.data], dim=1), (e, 2 * i, h), gate.qtype)
        return torch.cat([_dense(gate), _dense(up)], dim=1)
    value = loaded[gguf_name(name, config["num_hidden_layers"])]
    if name.endswith("conv1d.weight"):
        return _dense(value).unsqueeze(1)
    if name.endswith("shared_expert_gate.weight"):
        return _dense(value).reshape(1, d.hidden)
    return value


def _dense(t) -> torch.Tensor:
    return ops.dequantize(t, torch.float32) if isinstance(t, QuantWeight) else t


def _finish(name: str, value, dtype: torch.dtype):
    """Dense tensors in ``dtype`` with the stored values mapped back (norm ``w + 1`` -> ``w``,
    ``A = -exp(A_log)`` -> ``A_log``, in float64, rounded once); matmul weights as they are."""
    if isinstance(value, QuantWeight) and not name.endswith(_DENSE):
        return value
    value = _dense(value)
    if plus_one(name):
        return (value.double() - 1).to(dtype)
    if name.endswith("A_log"):
        return torch.log(-value.double()).to(dtype)
    return value.to(dtype)

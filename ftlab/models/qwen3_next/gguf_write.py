"""Qwen3.6 (``qwen35moe``) and Qwen3-Next (``qwen3next``) HF state dicts written as the GGUF
files llama.cpp's converter makes of them (every transformation of
:mod:`~ftlab.models.qwen3_next.gguf`'s module docstring, forward). Reading:
:mod:`~ftlab.models.qwen3_next.gguf`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer as HFTokenizer

from ftlab import ops
from ftlab.formats.gguf import QT
from ftlab.formats.gguf_write import Blocks, write_tensors
from ftlab.models.qwen3_next.gguf_layout import (
    ARCHS,
    FLOAT_KEYS,
    INT_KEYS,
    TOKENIZER_PRE,
    Dims,
    block_prefix,
    col_perm,
    gather_cols,
    gather_rows,
    gguf_name,
    hf_shapes,
    inverse,
    plus_one,
    qkvz_perm,
    row_perm,
)
from ftlab.models.tokenizer import Tokenizer, gguf_metadata
from ftlab.quant import QuantWeight, quant_weight

#: HF names (suffixes) of the matmul weights a single ``types`` entry quantizes.
MATMUL = (
    "in_proj_qkv.weight",
    "in_proj_z.weight",
    "in_proj_qkvz.weight",
    "in_proj_a.weight",
    "in_proj_b.weight",
    "in_proj_ba.weight",
    "out_proj.weight",
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "o_proj.weight",
    "experts.gate_up_proj",
    "experts.down_proj",
    "shared_expert.gate_proj.weight",
    "shared_expert.up_proj.weight",
    "shared_expert.down_proj.weight",
    "lm_head.weight",
    "mtp.fc.weight",
)
#: GGUF matrices a single ``types`` entry leaves in float: the embedding, routers, conv kernel.
_NOT_MATMUL = (
    "token_embd.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_inp_shexp.weight",
    "ssm_conv1d.weight",
)
_MROPE_DEFAULT = [11, 11, 10, 0]  # the converter's default for Qwen3.5 / 3.6


def arch_of(config: Mapping) -> str:
    """The GGUF architecture of an HF config (its ``architectures`` or ``model_type``)."""
    for arch, (cls, model_type) in ARCHS.items():
        if cls in (config.get("architectures") or []) or config.get("model_type") in (
            model_type,
            model_type.removesuffix("_text"),
        ):
            return arch
    raise ValueError(
        f"hf_config must describe one of {[c for c, _ in ARCHS.values()]} (architectures / "
        f"model_type), got {config.get('architectures')!r} / {config.get('model_type')!r}"
    )


def normalized_config(config: Mapping) -> dict:
    """``config`` with ``layer_types`` (from ``full_attention_interval`` when absent, as
    transformers derives it), every size the shapes need checked (ValueError naming the field)."""
    c = dict(config)
    for field in (*INT_KEYS, "linear_value_head_dim", "vocab_size"):
        v = c.get(field)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"hf_config[{field!r}] must be an int >= 1, got {v!r}")
    if c["linear_num_value_heads"] % c["linear_num_key_heads"]:
        raise ValueError(
            f"hf_config['linear_num_value_heads'] ({c['linear_num_value_heads']}) must be a "
            f"multiple of 'linear_num_key_heads' ({c['linear_num_key_heads']})"
        )
    interval = c.get("full_attention_interval", 4)
    if c.get("layer_types") is None:
        c["layer_types"] = [
            "linear_attention" if (i + 1) % interval else "full_attention"
            for i in range(c["num_hidden_layers"])
        ]
    if len(c["layer_types"]) != c["num_hidden_layers"] or set(c["layer_types"]) - {
        "linear_attention",
        "full_attention",
    }:
        raise ValueError(
            f"hf_config['layer_types'] must be {c['num_hidden_layers']} of 'linear_attention' / "
            f"'full_attention', got {c['layer_types']!r}"
        )
    return c


def gguf_metadata_of(arch: str, c: dict) -> dict:
    """The ``<arch>.*`` metadata the converter writes for config ``c``."""
    rope = c.get("rope_parameters") or {}
    theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    partial = rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))
    n_mtp = c.get("mtp_num_hidden_layers") or 0
    meta = {f"{arch}.{k}": c[f] for f, k in INT_KEYS.items()}
    meta[f"{arch}.block_count"] += n_mtp
    meta |= {
        f"{arch}.{FLOAT_KEYS['rms_norm_eps']}": float(c["rms_norm_eps"]),
        f"{arch}.{FLOAT_KEYS['rope_theta']}": float(theta),
    }
    meta |= {
        f"{arch}.attention.value_length": c["head_dim"],
        f"{arch}.ssm.inner_size": c["linear_value_head_dim"] * c["linear_num_value_heads"],
        f"{arch}.attention.recurrent_layers": [t == "linear_attention" for t in c["layer_types"]]
        + [False] * n_mtp,
        f"{arch}.full_attention_interval": c.get("full_attention_interval", 4),
        f"{arch}.rope.dimension_count": int(c["head_dim"] * partial),
    }
    if c.get("intermediate_size") is not None:
        meta[f"{arch}.feed_forward_length"] = c["intermediate_size"]
    if n_mtp:
        meta[f"{arch}.nextn_predict_layers"] = n_mtp
    if arch == "qwen35moe":
        sections = list(rope.get("mrope_section", _MROPE_DEFAULT))
        meta[f"{arch}.rope.dimension_sections"] = (sections + [0] * 4)[:4]
    return meta


def tokenizer_metadata(arch: str, tokenizer, vocab_size: int) -> dict:
    """``tokenizer.ggml.*`` of a byte-level BPE, padded to ``vocab_size`` with ``[PAD{i}]``
    tokens of type UNUSED as the converter does."""
    backend = tokenizer.backend if isinstance(tokenizer, Tokenizer) else tokenizer
    if not isinstance(backend, HFTokenizer):
        raise TypeError(
            "tokenizer must be a ftlab Tokenizer or a tokenizers.Tokenizer, got "
            f"{type(tokenizer).__name__}"
        )
    meta = gguf_metadata(backend)
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    if len(tokens) > vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokens)} tokens, more than hf_config['vocab_size'] "
            f"({vocab_size})"
        )
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab_size)]
    types += [int(gguf.TokenType.UNUSED)] * (vocab_size - len(types))
    meta["tokenizer.ggml.pre"] = TOKENIZER_PRE[arch]
    if isinstance(tokenizer, Tokenizer) and tokenizer.chat_template:
        meta["tokenizer.chat_template"] = tokenizer.chat_template
    return meta


def gguf_tensors(
    arch: str,
    c: dict,
    tensors: Mapping,
    input_perms: Mapping | None = None,
    fuse_gate_up_exps: bool = False,
    fuse_qkv: bool = False,
) -> dict:
    """``{GGUF name: tensor | QuantWeight}`` of the HF state dict ``tensors``, transformed as
    the converter does (float values in fp32; ``fuse_*``: its ``--fuse-gate-up-exps`` and
    ``--fuse-qkv``)."""
    d, shapes = Dims.of(c), hf_shapes(arch, c)
    missing = sorted(set(shapes) - set(tensors))
    extra = sorted(set(tensors) - set(shapes))
    if missing or extra:
        which = f"misses {missing[0]!r}" if missing else f"has {extra[0]!r}, which is not"
        raise ValueError(
            f"tensors {which} a tensor of this {arch} model ({len(missing)} missing, {len(extra)} "
            "extra)"
        )
    out = {}
    for name, shape in shapes.items():
        t = tensors[name]
        if not isinstance(t, QuantWeight) and not (
            isinstance(t, torch.Tensor) and t.is_floating_point()
        ):
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"tensors[{name!r}] must be a float tensor or a QuantWeight, got {got}")
        if tuple(t.shape) != shape:
            raise ValueError(
                f"tensors[{name!r}] must have shape {list(shape)}, got {list(t.shape)}"
            )
        if isinstance(t, QuantWeight):
            if not name.endswith(MATMUL):
                t = ops.dequantize(t.to("cpu"), torch.float32)
            else:
                t = t.to("cpu")
        if isinstance(t, torch.Tensor):
            t = t.detach().cpu()  # the converter computes in fp16 or fp32 (bf16 widened)
            t = t if t.dtype == torch.float16 else t.float()
            if plus_one(name):
                t = t + 1
            elif name.endswith("A_log"):
                t = -torch.exp(t)
            t = t.float()
        if (perm := row_perm(arch, name, d)) is not None:
            t = gather_rows(t, perm)
        if (perm := col_perm(arch, name, d)) is not None:
            given = (input_perms or {}).get(name)
            if given is not None and not torch.equal(given.cpu(), perm):
                raise ValueError(
                    f"input_perms[{name!r}] is not the converter's V-head order of this model"
                )
            moved = t if given is not None else gather_cols(t, perm, d.v_dim)
            if moved is None:
                raise ValueError(
                    f"tensors[{name!r}]: the columns of a {t.qtype} weight cannot be reordered "
                    f"(value head dim {d.v_dim} is not a multiple of its block): pass it with its "
                    "input_perms entry"
                )
            t = moved
        out |= _split(name, t, d, c["num_hidden_layers"], fuse_gate_up_exps)
    if fuse_qkv:
        for q in [n for n in out if n.endswith(".attn_q.weight")]:
            p = q.removesuffix("attn_q.weight")
            parts = [out.pop(p + f"attn_{x}.weight") for x in "qkv"]
            out[p + "attn_qkv.weight"] = _cat_rows(parts)
    return out


def _cat_rows(parts: list):
    """The rows of ``parts`` stacked: packed when all are QuantWeights of one type, else fp32."""
    if all(isinstance(t, QuantWeight) for t in parts) and len({t.qtype for t in parts}) == 1:
        rows = sum(t.shape[0] for t in parts)
        return quant_weight(
            torch.cat([t.data for t in parts]), (rows, parts[0].shape[1]), parts[0].qtype
        )
    return torch.cat(
        [ops.dequantize(t, torch.float32) if isinstance(t, QuantWeight) else t for t in parts]
    )


def _split(name: str, t, d: Dims, layers: int, fuse_gate_up_exps: bool) -> dict:
    """The GGUF tensors of HF tensor ``name`` (already transformed)."""
    p = block_prefix(name, layers) if "layers." in name else ""
    if fuse_gate_up_exps and name.endswith("experts.gate_up_proj"):
        return {p + "ffn_gate_up_exps.weight": t}
    if name.endswith("in_proj_qkvz.weight"):
        t = gather_rows(t, inverse(qkvz_perm(d)))
        n = d.qk_rows + d.value_rows
        return {
            p + "attn_qkv.weight": _rows(t, 0, n),
            p + "attn_gate.weight": _rows(t, n, n + d.value_rows),
        }
    if name.endswith("experts.gate_up_proj"):
        if isinstance(t, QuantWeight):
            e, _, h = t.shape
            halves = t.data[:, : d.inter], t.data[:, d.inter :]
            gate, up = (quant_weight(x.contiguous(), (e, d.inter, h), t.qtype) for x in halves)
        else:
            gate, up = t[:, : d.inter].contiguous(), t[:, d.inter :].contiguous()
        return {p + "ffn_gate_exps.weight": gate, p + "ffn_up_exps.weight": up}
    if name.endswith("conv1d.weight"):
        t = t.squeeze(1)
    return {gguf_name(name, layers): t.contiguous() if isinstance(t, torch.Tensor) else t}


def _rows(t, start: int, stop: int):
    if isinstance(t, QuantWeight):
        return quant_weight(t.data[start:stop].contiguous(), (stop - start, t.shape[1]), t.qtype)
    return t[start:stop].contiguous()


def _quantize(t, qtype: QT):
    """``t`` (tensor or QuantWeight) as ``qtype``: kept if it already is, else quantized by gguf-py
    from its fp32 values; fp32 when its rows are not whole blocks of ``qtype``."""
    if isinstance(t, QuantWeight) and t.qtype == qtype.name:
        return t
    values = ops.dequantize(t, torch.float32) if isinstance(t, QuantWeight) else t
    if qtype in (QT.F32, QT.F16, QT.BF16):
        return values.to(
            {QT.F32: torch.float32, QT.F16: torch.float16, QT.BF16: torch.bfloat16}[qtype]
        )
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if values.shape[-1] % block:
        return values
    return Blocks(gguf.quants.quantize(np.ascontiguousarray(values.float().numpy()), qtype), qtype)


def write_gguf_hf(
    path: str | Path,
    hf_config: Mapping,
    tensors: Mapping[str, torch.Tensor | QuantWeight],
    *,
    tokenizer=None,
    types: Mapping[str, QT] | QT | None = None,
    input_perms: Mapping[str, torch.Tensor] | None = None,
    metadata: Mapping[str, object] | None = None,
    fuse_gate_up_exps: bool = False,
    fuse_qkv: bool = False,
) -> Path:
    """Write the HF state dict ``tensors`` (what ``read_gguf_hf`` returns: transformers' names,
    float tensors or packed :class:`~ftlab.quant.QuantWeight` matmul weights) of the model
    ``hf_config`` describes as the ``qwen35moe`` / ``qwen3next`` GGUF file llama.cpp's converter
    makes: same tensor names, shapes and, for the same float checkpoint written
    as fp32, the same bytes. Float tensors are written fp32; a QuantWeight as its blocks.

    ``tokenizer``: a ftlab :class:`~ftlab.models.tokenizer.Tokenizer` or ``tokenizers.Tokenizer``
    (byte-level BPE) for ``tokenizer.ggml.*``, padded to the vocabulary. ``types``: one
    ``gguf.GGMLQuantizationType`` for every matmul weight (projections, expert banks, shared
    expert, ``lm_head``, the MTP ``eh_proj``) whose rows are whole blocks of it, or ``{GGUF tensor
    name:
    type}``; quantized by gguf-py after the transformations. ``input_perms``: as ``read_gguf_hf``
    returns them, for out_proj weights kept in the file's column order. ``metadata``: more keys.
    ``fuse_gate_up_exps`` / ``fuse_qkv``: as the converter's ``--fuse-gate-up-exps`` /
    ``--fuse-qkv`` (one expert bank ``ffn_gate_up_exps``; ``attn_qkv`` in full-attention blocks).
    A config with ``mtp_num_hidden_layers`` writes the ``mtp.*`` tensors as the ``nextn`` blocks.
    ValueError / TypeError naming the argument before anything is written."""
    arch = arch_of(hf_config)
    c = normalized_config(hf_config)
    out = gguf_tensors(arch, c, tensors, input_perms, fuse_gate_up_exps, fuse_qkv)
    if isinstance(types, QT):
        matmul = [n for n, t in out.items() if len(t.shape) >= 2 and not n.endswith(_NOT_MATMUL)]
        types = dict.fromkeys(matmul, types)
    for name, qtype in (types or {}).items():
        if name not in out:
            raise ValueError(
                f"types names {name!r}, which is not a tensor of this model's GGUF file"
            )
        if not isinstance(qtype, QT):
            raise TypeError(f"types[{name!r}] must be a gguf.GGMLQuantizationType, got {qtype!r}")
        try:
            out[name] = _quantize(out[name], qtype)
        except NotImplementedError as e:
            raise ValueError(f"types[{name!r}]: gguf-py cannot quantize to {qtype.name}") from e
    meta = gguf_metadata_of(arch, c)
    if tokenizer is not None:
        meta |= tokenizer_metadata(arch, tokenizer, c["vocab_size"])
    meta |= dict(metadata or {})
    return write_tensors(path, out, arch=arch, metadata=meta)

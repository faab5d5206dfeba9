"""Write a random ``qwen35moe`` model (:class:`~ftlab.bench.qwen35moe_random.RandomTensors`) as
the GGUF file llama.cpp's converter makes of such a checkpoint, one layer at a time: the tensor
table is declared from the config's shapes first, then each layer's tensors are made on their
device, transformed as the converter does (``qwen3_next.gguf_write.gguf_tensors``: V-head
reordering, ``w + 1`` norms, ``-exp(A_log)``, split expert banks) and appended, so host memory
holds one layer, not the ~20 GB model.

Matmul weights are Q4_0 (their blocks as made), the embedding BF16 (its values as made), norms,
conv, ``ssm_a``, ``ssm_dt``, routers and the shared-expert gate F32. The vocabulary is llama.cpp's
``none`` type with ``qwen35moe.vocab_size`` tokens: llama-bench and ``read_gguf_hf`` read it;
there is no text to tokenize.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import torch

from ftlab.formats.gguf import QT
from ftlab.models.qwen3_next.gguf_layout import GLOBAL_NAMES, gguf_shapes, plus_one
from ftlab.models.qwen3_next.gguf_write import gguf_metadata_of, gguf_tensors, normalized_config
from ftlab.quant import QK, QuantWeight

ARCH = "qwen35moe"
#: GGUF tensors written as float (everything else is a Q4_0 matmul weight).
_F32 = (
    "norm.weight",
    "ssm_a",
    "ssm_dt.bias",
    "ssm_conv1d.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_inp_shexp.weight",
)
_BLOCK = re.compile(r"^blk\.0\.")


def _kind(name: str) -> QT:
    if name == "token_embd.weight":
        return QT.BF16
    return QT.F32 if name.endswith(_F32) else QT.Q4_0


def _array(t) -> np.ndarray:
    """The bytes (packed types, bf16) or fp32 values of a tensor, on the host."""
    if isinstance(t, QuantWeight):
        return t.data.cpu().numpy()
    if t.dtype == torch.bfloat16:
        return t.detach().cpu().contiguous().view(torch.uint8).numpy()
    return t.detach().cpu().float().contiguous().numpy()


def _declare(writer: gguf.GGUFWriter, name: str, shape: tuple[int, ...]) -> None:
    kind = _kind(name)
    if kind == QT.Q4_0:
        *lead, k = shape
        byte_shape = (*lead, k // QK * 18)
        writer.add_tensor_info(
            name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=kind
        )
    elif kind == QT.BF16:
        byte_shape = (*shape[:-1], 2 * shape[-1])
        writer.add_tensor_info(
            name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=kind
        )
    else:
        writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))


def _metadata(writer: gguf.GGUFWriter, metadata: Mapping[str, object]) -> None:
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, list(value))


def _layer(c: dict, tensors: Mapping, i: int) -> dict:
    """The GGUF tensors of layer ``i`` (``blk.i.*``): the converter's transformations of a
    one-layer model holding it (its embedding a one-token stand-in)."""
    prefix = f"model.layers.{i}."
    one = {
        **c,
        "num_hidden_layers": 1,
        "layer_types": [c["layer_types"][i]],
        "vocab_size": 1,
        "tie_word_embeddings": True,
    }
    one.pop("mtp_num_hidden_layers", None)
    h = c["hidden_size"]
    sub = {"model.embed_tokens.weight": torch.zeros(1, h), "model.norm.weight": torch.zeros(h)}
    sub |= {
        "model.layers.0." + n[len(prefix) :]: tensors[n] for n in tensors if n.startswith(prefix)
    }
    out = gguf_tensors(ARCH, one, sub)
    return {_BLOCK.sub(f"blk.{i}.", n): t for n, t in out.items() if n.startswith("blk.0.")}


def _globals(tensors: Mapping) -> dict:
    out = {}
    for hf, name in GLOBAL_NAMES.items():
        if hf in tensors:
            t = tensors[hf]
            out[name] = t.float() + 1 if plus_one(hf) else t
    return out


def write_random_gguf(path: str | Path, config: dict, tensors: Mapping, progress=None) -> Path:
    """Write the ``qwen3_5_moe_text`` model ``config`` (an HF config dict) with weights
    ``tensors`` (HF name -> float tensor or Q4_0Weight, read once each, layer by layer) as a
    ``qwen35moe`` GGUF file at ``path`` (module docstring). ``progress``: wraps the range of
    layers (a tqdm), or None. RuntimeError if a tensor comes out of another type or size than
    the table declared (nothing else is checked: the tensors are this module's own)."""
    path = Path(path)
    c = normalized_config(config)
    shapes = gguf_shapes(ARCH, c)
    writer = gguf.GGUFWriter(str(path), ARCH)
    meta = gguf_metadata_of(ARCH, c)
    meta |= {
        "general.name": f"random Qwen3.6-35B-A3B-shaped ({c['num_hidden_layers']} layers, "
        f"{c['num_experts']} experts)",
        "tokenizer.ggml.model": "none",
        f"{ARCH}.vocab_size": c["vocab_size"],
    }
    _metadata(writer, meta)
    for name, shape in shapes.items():
        _declare(writer, name, shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    names = iter(shapes)

    def put(out: dict) -> None:
        for _ in range(len(out)):
            name = next(names)
            t = out.pop(name)
            packed = isinstance(t, QuantWeight) and t.qtype == "Q4_0"
            if packed != (_kind(name) == QT.Q4_0) or (
                not packed and (t.dtype == torch.bfloat16) != (_kind(name) == QT.BF16)
            ):
                raise RuntimeError(
                    f"tensor {name!r} is not of the type declared for it ({_kind(name).name})"
                )
            array = _array(t)
            if array.nbytes != writer.tensors[0][name].nbytes:
                raise RuntimeError(
                    f"tensor {name!r} has {array.nbytes} bytes, the table declared "
                    f"{writer.tensors[0][name].nbytes}"
                )
            writer.write_tensor_data(array)

    put(_globals(tensors))
    layers = range(c["num_hidden_layers"])
    for i in progress(layers) if progress else layers:
        put(_layer(c, tensors, i))
    writer.close()
    return path

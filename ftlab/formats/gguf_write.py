"""Writing GGUF files through the ``gguf`` package's GGUFWriter (reading:
``ftlab.formats.gguf``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from ftlab.formats.gguf import QT, GGUFError
from ftlab.quant import QuantWeight


@dataclass(frozen=True)
class Blocks:
    """A tensor already in a GGUF quantized type: ``data`` uint8 ``[..., N, row_bytes]`` of
    ``qtype``'s blocks (``gguf.quants.quantize(values, qtype)`` gives them)."""

    data: np.ndarray
    qtype: gguf.GGMLQuantizationType


def write_tensors(
    path: str | Path,
    tensors: Mapping[str, torch.Tensor | QuantWeight | Blocks],
    arch: str = "ftlab",
    metadata: Mapping[str, object] | None = None,
) -> Path:
    """Write ``tensors`` and string/int/float/list ``metadata`` to a GGUF file that llama.cpp and
    GGUFReader can read. A tensor is a QuantWeight (written byte for byte), an fp32/fp16/bf16
    tensor, or a :class:`Blocks` (the bytes of any GGUF quantized type, e.g. from
    ``gguf.quants.quantize``)."""
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (metadata or {}).items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value) if value >= 0 else writer.add_int32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, (list, tuple)):
            writer.add_array(key, list(value))
        else:
            raise TypeError(f"metadata {key!r}: unsupported type {type(value).__name__}")
    for name, t in tensors.items():
        if isinstance(t, QuantWeight):
            writer.add_tensor(name, t.data.cpu().numpy(), raw_dtype=QT[t.qtype])
        elif isinstance(t, Blocks):
            writer.add_tensor(name, np.ascontiguousarray(t.data, dtype=np.uint8), raw_dtype=t.qtype)
        elif isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16:
            raw = t.detach().cpu().contiguous().view(torch.uint8).numpy()
            writer.add_tensor(name, raw, raw_dtype=QT.BF16)
        elif isinstance(t, torch.Tensor) and t.dtype in (torch.float32, torch.float16):
            writer.add_tensor(name, t.detach().cpu().contiguous().numpy())
        else:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise GGUFError(
                f"{path}: tensor {name!r}: cannot write {got} (QuantWeight, Blocks, float32, "
                "float16, bfloat16)"
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

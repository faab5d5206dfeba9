"""GGUF tensors <-> ftlab, through the ``gguf`` package (GGUFReader / GGUFWriter).

Q4_0 tensors load as :class:`~ftlab.quant.Q4_0Weight` straight from the memory-mapped file
(copy-on-write: nothing is re-quantized and nothing is read until used); F32 / F16 / BF16
tensors load as torch tensors. Shapes are in PyTorch order (``[..., N, K]``); GGUF stores
dimensions innermost first, and the ``gguf`` package does the reversal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import torch

from ftlab.quant import QK, Q4_0Weight

try:
    import gguf
except ImportError as e:  # pragma: no cover - gguf is a runtime dependency
    raise ImportError("ftlab.formats.gguf needs the gguf package: pip install gguf") from e

QT = gguf.GGMLQuantizationType
SUPPORTED = (QT.F32, QT.F16, QT.BF16, QT.Q4_0)


class GGUFError(ValueError):
    """A GGUF file or tensor ftlab cannot use; the message names the file or tensor."""


def open_reader(path: str | Path) -> gguf.GGUFReader:
    """A GGUFReader over ``path`` (memory-mapped, copy-on-write); GGUFError if the file is
    missing, truncated or not GGUF."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such GGUF file")
    try:
        return gguf.GGUFReader(path, "c")
    except Exception as e:  # the reader raises ValueError/IndexError/... on bad bytes
        raise GGUFError(f"{path}: not a readable GGUF file (truncated or corrupt?): {e}") from e


def tensor_from_reader(t, path: Path | str = "") -> torch.Tensor | Q4_0Weight:
    """One ``ReaderTensor`` as a torch tensor or a Q4_0Weight (zero-copy)."""
    where = f"{path}: tensor {t.name!r}"
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    if t.tensor_type not in SUPPORTED:
        names = ", ".join(q.name for q in SUPPORTED)
        raise GGUFError(f"{where} has type {t.tensor_type.name}; supported: {names}")
    data = np.asarray(t.data)
    if t.tensor_type == QT.Q4_0:
        if shape[-1] % QK:
            raise GGUFError(f"{where}: Q4_0 row length {shape[-1]} is not a multiple of {QK}")
        return Q4_0Weight(torch.from_numpy(data).view(torch.uint8).reshape(*shape[:-1], -1), shape)
    if t.tensor_type == QT.BF16:
        return (
            torch.from_numpy(data).view(torch.uint8).reshape(-1).view(torch.bfloat16).reshape(shape)
        )
    return torch.from_numpy(data).reshape(shape)


def read_tensors(
    path: str | Path, names: Iterable[str] | None = None
) -> dict[str, torch.Tensor | Q4_0Weight]:
    """``{name: tensor}`` for every tensor of the file (or those in ``names``)."""
    reader = open_reader(path)
    by_name = {t.name: t for t in reader.tensors}
    wanted = list(by_name) if names is None else list(names)
    missing = [n for n in wanted if n not in by_name]
    if missing:
        raise GGUFError(
            f"{path}: no tensor named {missing[0]!r} (the file has {len(by_name)} tensors)"
        )
    return {n: tensor_from_reader(by_name[n], path) for n in wanted}


def write_tensors(
    path: str | Path,
    tensors: Mapping[str, torch.Tensor | Q4_0Weight],
    arch: str = "ftlab",
    metadata: Mapping[str, object] | None = None,
) -> Path:
    """Write ``tensors`` (Q4_0Weight, or fp32/fp16/bf16 tensors) and string/int/float
    ``metadata`` to a GGUF file that llama.cpp and GGUFReader can read."""
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
        if isinstance(t, Q4_0Weight):
            writer.add_tensor(name, t.data.cpu().numpy(), raw_dtype=QT.Q4_0)
        elif isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16:
            raw = t.detach().cpu().contiguous().view(torch.uint8).numpy()
            writer.add_tensor(name, raw, raw_dtype=QT.BF16)
        elif isinstance(t, torch.Tensor) and t.dtype in (torch.float32, torch.float16):
            writer.add_tensor(name, t.detach().cpu().contiguous().numpy())
        else:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise GGUFError(
                f"tensor {name!r}: cannot write {got} (Q4_0Weight, float32, float16, bfloat16)"
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

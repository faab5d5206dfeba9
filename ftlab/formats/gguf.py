"""GGUF tensors <-> ftlab: files read through :class:`~ftlab.formats.gguf_read.GGUFFile`, written
through the ``gguf`` package's GGUFWriter.

Tensors of the packed types ftlab knows (:data:`ftlab.quant.QTYPES`: Q4_0, Q8_0, Q4_K, Q5_K,
Q6_K) load as :class:`~ftlab.quant.QuantWeight` (Q4_0: :class:`~ftlab.quant.Q4_0Weight`)
straight from the memory-mapped file (copy-on-write: nothing is re-quantized and nothing is
read until used); F32 / F16 / BF16 tensors load as torch tensors; the other quantized types
(Q4_1, Q5_0, Q2_K, the IQ types, ...) load dequantized to fp32 by gguf-py.
:func:`dequantized_types` lists what a model runs dense (and a loader warns of with
:class:`~ftlab.formats.DequantizedWarning`); :func:`cut` takes a rank's rows of a tensor as read.
Writing: ``gguf_write``.
Shapes are in PyTorch order (``[..., N, K]``); GGUF stores dimensions innermost first.

A file is opened once (:func:`open_gguf`): :func:`~ftlab.formats.gguf_structure.read_layout`
checks its structure without trusting a count or length, then the header's values are read from
the places it found, and the tensors mapped (:mod:`ftlab.formats.gguf_read` says why not through
gguf-py's GGUFReader). Every refusal is a :class:`GGUFError` naming the file and the metadata key
or tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from ftlab.quant import QTYPES, QuantWeight, quant_weight

try:
    import gguf
except ImportError as e:  # pragma: no cover - gguf is a runtime dependency
    raise ImportError("ftlab.formats.gguf needs the gguf package: pip install gguf") from e

# after the check above, which names the missing package: gguf_structure imports it too
from ftlab.formats.gguf_read import GGUFFile
from ftlab.formats.gguf_structure import QT, VT, GGUFError

#: Types read as torch tensors.
FLOAT_TYPES = (QT.F32, QT.F16, QT.BF16)
#: Types read packed, as QuantWeight: those ftlab has kernels for (ftlab.quant.QTYPES).
PACKED_TYPES = tuple(QT[name] for name in QTYPES)
#: Types a model multiplies as they are stored (floats, Q4_0 through ``q4_0_matmul``, Q8_0 and the
#: K-quants through ``quant_matmul``); tensors of the others run dequantized
#: (:func:`dequantized_types`).
MATMUL_TYPES = (*FLOAT_TYPES, QT.Q4_0, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)
_INT_TYPES = {VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64}
_FLOAT_TYPES = {VT.FLOAT32, VT.FLOAT64}
_KINDS = {
    "int": (_INT_TYPES, "an integer"),
    "float": (_FLOAT_TYPES, "a float"),
    "str": ({VT.STRING}, "a string"),
    "bool": ({VT.BOOL}, "a BOOL"),
}


def open_gguf(path: str | Path) -> GGUFFile:
    """The GGUF file at ``path``, its structure checked and its header parsed once
    (:class:`~ftlab.formats.gguf_read.GGUFFile`: memory-mapped, copy-on-write); GGUFError if it
    is missing, truncated or corrupt."""
    return GGUFFile(path)


def as_gguf(source: str | Path | GGUFFile) -> GGUFFile:
    """``source`` itself if it is an open :class:`GGUFFile`, else the file at that path opened
    (:func:`open_gguf`): what the loaders take, so a file is parsed once however many of them
    read it."""
    return source if isinstance(source, GGUFFile) else open_gguf(source)


def field_value(file: GGUFFile, key: str, kind: str):
    """Metadata ``key`` as ``kind``: "int" (any integer type), "float" (FLOAT32 / FLOAT64),
    "str" (a UTF-8 string), "int[]", "str[]" or "bool[]" (arrays of those); None when the key is
    absent. GGUFError naming the key when it holds anything else. A FLOAT32 becomes the shortest
    decimal that rounds to it (1e-06, not 9.99999997e-07): what the original config said."""
    found = file.value(key)
    if found is None:
        return None
    vtype, item, value = found
    where = f"{file.path}: metadata '{key}'"
    scalar, array = kind.removesuffix("[]"), kind.endswith("[]")
    allowed, noun = _KINDS[scalar]
    if (item if array else vtype) not in allowed or (vtype == VT.ARRAY) != array:
        got = f"an array of {item.name}" if item is not None else vtype.name
        want = f"an array of {noun.split()[-1]}s" if array else noun
        raise GGUFError(f"{where} must be {want}, got {got}")
    values = []
    for v in value if array else [value]:
        if scalar == "str":
            try:
                values.append(v.decode("utf-8"))
            except UnicodeDecodeError as e:
                which = f"item {len(values)}" if array else "the string"
                raise GGUFError(f"{where}: {which} is not valid UTF-8 ({e.reason})") from e
        elif isinstance(v, np.float32):
            values.append(float(str(v)))
        else:
            values.append(v.item())
    return values if array else values[0]


def tensor_from_file(t, path: Path | str = "") -> torch.Tensor | QuantWeight:
    """One :class:`~ftlab.formats.gguf_read.GGUFTensor` (or gguf-py ``ReaderTensor``) as a torch
    tensor or a QuantWeight (zero-copy), or -- a type ftlab has no kernel for -- fp32 values
    dequantized by ``gguf.quants.dequantize``."""
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    data = np.asarray(t.data)
    if t.tensor_type in PACKED_TYPES:  # rows of whole blocks: read_layout checked
        blocks = torch.from_numpy(data).view(torch.uint8).reshape(*shape[:-1], -1)
        return quant_weight(blocks, shape, t.tensor_type.name)
    if t.tensor_type not in FLOAT_TYPES:
        try:
            values = gguf.quants.dequantize(data, t.tensor_type)
        except NotImplementedError as e:  # integer tensors (I8 ... I64), F64, Q8_1, Q8_K
            raise GGUFError(
                f"{path}: tensor {t.name!r} has type {t.tensor_type.name}, which neither ftlab nor "
                "gguf-py can dequantize"
            ) from e
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(shape)
    if t.tensor_type == QT.BF16:
        return (
            torch.from_numpy(data).view(torch.uint8).reshape(-1).view(torch.bfloat16).reshape(shape)
        )
    return torch.from_numpy(data).reshape(shape)


def cut(bank, start: int, stop: int):
    """Rows ``start .. stop`` (along dim 0) of a tensor as :func:`tensor_from_file` gives it:
    experts of a bank ``[E, ...]``, or vocabulary rows of an embedding or lm_head ``[V, H]`` (a
    packed type's rows are independent, whole blocks); the tensor itself when that is all of it.
    A packed slice is a view of the memory-mapped bytes (only what is used later is read: a packed
    embedding is dequantized for these rows only); a float one is copied (only its pages are
    read, and a tensor dequantized whole is not kept alive by the slice)."""
    if start == 0 and stop == bank.shape[0]:
        return bank
    if isinstance(bank, QuantWeight):
        return quant_weight(bank.data[start:stop], (stop - start, *bank.shape[1:]), bank.qtype)
    return bank[start:stop].clone()


def dequantized_types(file: GGUFFile) -> dict[str, list[str]]:
    """``{type name: [tensor names]}`` of the file's tensors a model runs dequantized: every
    type but those of :data:`MATMUL_TYPES` (no ftlab matmul kernel for it)."""
    out: dict[str, list[str]] = {}
    for t in file.tensors:
        if t.tensor_type not in MATMUL_TYPES:
            out.setdefault(t.tensor_type.name, []).append(t.name)
    return out


def read_tensors(
    path: str | Path, names: Iterable[str] | None = None
) -> dict[str, torch.Tensor | QuantWeight]:
    """``{name: tensor}`` for every tensor of the file (or those in ``names``)."""
    by_name = {t.name: t for t in open_gguf(path).tensors}
    wanted = list(by_name) if names is None else list(names)
    missing = [n for n in wanted if n not in by_name]
    if missing:
        raise GGUFError(
            f"{path}: no tensor named {missing[0]!r} (the file has {len(by_name)} tensors)"
        )
    return {n: tensor_from_file(by_name[n], path) for n in wanted}

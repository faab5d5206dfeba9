"""A checked GGUF file, its header parsed once: :class:`GGUFFile`.

:func:`~ftlab.formats.gguf_structure.read_layout` walks the header without trusting it and says
where every metadata value and tensor is; :class:`GGUFFile` reads the values from there, on
demand, and maps the tensors (copy-on-write, nothing read until used). gguf-py's ``GGUFReader``
does the same walk again and builds a numpy view for every item of every array -- a 151,936-token
vocabulary and its merges are three million views, about 17 s a parse on one core -- so a model
is loaded through this class, and gguf-py supplies what it does well: the type enums, the block
sizes, the dequantizers of the types ftlab has no kernel for, and the writer.
``tests/formats/test_gguf_read.py`` holds every value and tensor to ``GGUFReader``'s.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ftlab.formats.gguf_structure import QT, VT, GGUFLayout, MetadataEntry, read_layout

__all__ = ["GGUFFile", "GGUFTensor"]

_NUMBERS = {
    VT.UINT8: np.dtype("<u1"),
    VT.INT8: np.dtype("<i1"),
    VT.UINT16: np.dtype("<u2"),
    VT.INT16: np.dtype("<i2"),
    VT.UINT32: np.dtype("<u4"),
    VT.INT32: np.dtype("<i4"),
    VT.FLOAT32: np.dtype("<f4"),
    VT.BOOL: np.dtype("?"),
    VT.UINT64: np.dtype("<u8"),
    VT.INT64: np.dtype("<i8"),
    VT.FLOAT64: np.dtype("<f8"),
}
#: Tensor types whose data is a numpy array of their own numbers (the rest: uint8 rows of blocks).
_ELEMENTS = {
    QT.F16: np.float16,
    QT.F32: np.float32,
    QT.F64: np.float64,
    QT.I8: np.int8,
    QT.I16: np.int16,
    QT.I32: np.int32,
    QT.I64: np.int64,
}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a :class:`GGUFFile`, with the fields of gguf-py's ``ReaderTensor`` that
    ftlab reads: ``shape`` innermost first (GGUF order, uint64), ``data`` a copy-on-write view of
    the mapped file -- ``[..., N, K]`` of its numbers for F16 / F32 / F64 / I8..I64, else
    ``[..., N, bytes a row]`` uint8."""

    name: str
    tensor_type: QT
    shape: np.ndarray
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class GGUFFile:
    """A GGUF file whose structure :func:`read_layout` has checked: ``path``, ``layout``,
    ``tensors`` (:class:`GGUFTensor`, in file order), and the metadata through :meth:`value` (a
    key's type, its value decoded on first use and kept). ``key in file``: whether the header
    holds that key. The file stays memory-mapped while the object or a tensor's data lives."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.layout: GGUFLayout = read_layout(self.path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="c")
        self._entries = {e.key: e for e in self.layout.metadata}
        self._values: dict[str, tuple[VT, VT | None, object]] = {}
        self.tensors = tuple(self._tensor(t) for t in self.layout.tensors)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def keys(self) -> tuple[str, ...]:
        """The metadata keys, in file order."""
        return tuple(self._entries)

    def value(self, key: str) -> tuple[VT, VT | None, object] | None:
        """``(type, item type, value)`` of metadata ``key`` (None if absent): item type None but
        for an ARRAY; a number as a numpy scalar, a string as bytes, an array as a list of
        those (nested: lists of lists). Decoded once, on first use."""
        if key not in self._values:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._values[key] = _decode(self._map, entry)
        return self._values[key]

    def _tensor(self, t) -> GGUFTensor:
        start = self.layout.data_start + t.offset
        n = int(np.prod(t.dims))
        dims = tuple(reversed(t.dims))
        raw = self._map[start : start + t.nbytes]
        if t.type in _ELEMENTS:
            data = raw.view(_ELEMENTS[t.type]).reshape(dims)
        else:
            data = raw.reshape(gguf.quant_shape_to_byte_shape(dims, t.type))
        shape = np.array(t.dims, dtype=np.uint64)
        return GGUFTensor(t.name, t.type, shape, n, t.nbytes, start, data)


def _decode(buf: np.ndarray, entry: MetadataEntry) -> tuple[VT, VT | None, object]:
    """The value of ``entry`` (its extent checked by read_layout, so lengths are trusted)."""
    raw = bytes(buf[entry.value_start : entry.end])
    vtype = VT(entry.value_type)
    item = VT(struct.unpack_from("<I", raw, 0)[0]) if vtype == VT.ARRAY else None
    return vtype, item, _Values(raw).one(vtype)


class _Values:
    """Sequential little-endian decoding of one value's bytes."""

    def __init__(self, raw: bytes):
        self.raw, self.pos = raw, 0

    def u64(self) -> int:
        (n,) = struct.unpack_from("<Q", self.raw, self.pos)
        self.pos += 8
        return n

    def string(self) -> bytes:
        n = self.u64()
        self.pos += n
        return self.raw[self.pos - n : self.pos]

    def one(self, vtype: VT):
        if vtype == VT.STRING:
            return self.string()
        if vtype in _NUMBERS:
            dt = _NUMBERS[vtype]
            v = np.frombuffer(self.raw, dt, 1, self.pos)[0]
            self.pos += dt.itemsize
            return v
        (item,) = struct.unpack_from("<I", self.raw, self.pos)
        self.pos += 4
        item = VT(item)
        count = self.u64()
        if item in _NUMBERS:  # one numpy read for the whole array
            dt = _NUMBERS[item]
            values = list(np.frombuffer(self.raw, dt, count, self.pos))
            self.pos += count * dt.itemsize
            return values
        if item == VT.STRING:
            return [self.string() for _ in range(count)]
        return [self.one(item) for _ in range(count)]  # arrays of arrays: read_layout bounds them

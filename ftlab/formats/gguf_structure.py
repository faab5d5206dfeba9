"""The structure of a GGUF file, checked before anything of it is read.

A reader that trusts every count and length it reads (gguf-py's GGUFReader does) can be made to
fail in many ways: a string length or array count edited to 2^60 makes it loop and allocate until
memory runs out, a tensor offset past the end of the file gives an empty or short view, a tensor
whose type was edited from F32 to F16 reads half its bytes as other numbers. So
:func:`read_layout` walks the header first -- bounded: every count and length is checked against
the bytes left in the file before it is used, then every tensor's extent against the data
section -- and says where every value and tensor is; :class:`~ftlab.formats.gguf_read.GGUFFile`
(:func:`ftlab.formats.gguf.open_gguf`) reads them from there. Every refusal is a
:class:`GGUFError` naming the file and the metadata key or tensor.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import gguf

from ftlab.formats import CheckpointError

QT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp's tensors have at most four dimensions
# GGUFReader walks nested arrays recursively, one Python frame a level; no GGUF key needs more
# than an array of arrays, and a bound keeps a file of nested array headers from exhausting
# the interpreter's stack
MAX_ARRAY_NESTING = 4
_SCALAR_BYTES = {
    VT.UINT8: 1,
    VT.INT8: 1,
    VT.UINT16: 2,
    VT.INT16: 2,
    VT.UINT32: 4,
    VT.INT32: 4,
    VT.FLOAT32: 4,
    VT.BOOL: 1,
    VT.UINT64: 8,
    VT.INT64: 8,
    VT.FLOAT64: 8,
}


class GGUFError(CheckpointError):
    """A GGUF file or tensor ftlab cannot use; the message names the file and the metadata
    key or tensor."""


@dataclass(frozen=True)
class MetadataEntry:
    """One key/value pair of the header: ``start`` is the byte offset of its key length,
    ``value_start`` of its value, ``end`` one past its last byte."""

    key: str
    start: int
    value_type: int
    value_start: int
    end: int

    @property
    def type_at(self) -> int:
        """Offset of the uint32 value type."""
        return self.value_start - 4


@dataclass(frozen=True)
class TensorEntry:
    """One tensor-info entry: ``dims`` innermost first (GGUF order), ``offset`` relative to
    the data section, ``nbytes`` what its type and shape need; ``start`` is the byte offset
    of its name length in the file."""

    name: str
    start: int
    dims: tuple[int, ...]
    type: QT
    offset: int
    nbytes: int

    @property
    def n_dims_at(self) -> int:
        return self.start + 8 + len(self.name.encode())

    @property
    def type_at(self) -> int:
        return self.n_dims_at + 4 + 8 * len(self.dims)

    @property
    def offset_at(self) -> int:
        return self.type_at + 4


@dataclass(frozen=True)
class GGUFLayout:
    """Where everything of a checked GGUF file is: header entries, tensor entries, and the
    data section (``data_start``, aligned to ``alignment``)."""

    path: Path
    size: int
    version: int
    alignment: int
    metadata: tuple[MetadataEntry, ...]
    tensors: tuple[TensorEntry, ...]
    header_end: int
    data_start: int


class _Cursor:
    """Little-endian reads over the file's bytes, each bounded by the bytes left."""

    def __init__(self, buf, path: Path):
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}")

    def skip(self, n: int, what: str) -> int:
        if n > self.size - self.pos:
            raise self.fail(
                f"{what} needs {n} bytes at offset {self.pos}, but the file "
                f"({self.size} bytes) has {self.size - self.pos} left"
            )
        start, self.pos = self.pos, self.pos + n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.skip(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.skip(8, what))[0]

    def text(self, what: str) -> str:
        """A GGUF string (uint64 length, then UTF-8 bytes) that must decode."""
        n = self.u64(f"{what} (length)")
        start = self.skip(n, what)
        try:
            return bytes(self.buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} at offset {start} is not valid UTF-8 ({e.reason})") from e

    def name(self, what: str, seen: set[str], kind: str) -> str:
        """A key or tensor name: a string not in ``seen`` (then added to it)."""
        name = self.text(what)
        if name in seen:
            raise self.fail(f"{kind} '{name}' appears twice")
        seen.add(name)
        return name

    def value(self, value_type: int, where: str) -> None:
        """Step over one value of ``value_type``, arrays (of arrays) included, with an explicit
        stack of ``[type, values left, nesting]`` frames instead of recursion."""
        frames = [[_value_type(value_type, self, where), 1, 0]]
        while frames:
            frame = frames[-1]
            vtype, left, depth = frame
            if vtype in _SCALAR_BYTES:
                self.skip(left * _SCALAR_BYTES[vtype], f"{where}: {left} {vtype.name} values")
                frames.pop()
            elif vtype == VT.STRING:
                for _ in range(left):
                    self.skip(self.u64(f"{where}: string length"), f"{where}: string")
                frames.pop()
            elif left == 0:
                frames.pop()
            else:  # one more array: its header, then (on the next turns) its values
                frame[1] -= 1
                item = _value_type(self.u32(f"{where}: array item type"), self, where)
                count = self.u64(f"{where}: array length")
                if item == VT.ARRAY and depth + 1 >= MAX_ARRAY_NESTING:
                    raise self.fail(
                        f"{where}: arrays nested deeper than {MAX_ARRAY_NESTING} levels"
                    )
                least = _SCALAR_BYTES.get(item, 12 if item == VT.ARRAY else 8)
                if count > (self.size - self.pos) // least:
                    raise self.fail(
                        f"{where}: an array of {count} {item.name} values needs at least "
                        f"{count * least} bytes, the file has {self.size - self.pos} left"
                    )
                frames.append([item, count, depth + 1])


def _value_type(raw: int, cur: _Cursor, where: str) -> VT:
    try:
        return VT(raw)
    except ValueError:
        raise cur.fail(f"{where}: value type {raw} is not a GGUF type (0..12)") from None


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def read_layout(path: str | Path) -> GGUFLayout:
    """Check the structure of GGUF file ``path`` without trusting it, and say where
    everything is. Header: magic, version 2 or 3 (little-endian), tensor and key counts;
    each key/value entry: key length, UTF-8, no duplicate, value type known, string lengths,
    array item types and lengths, ``general.alignment`` a UINT32 power of two; each tensor
    entry: name, 1..4 dims each >= 1, type known, rows of whole blocks. Data: tensors packed in
    order as llama.cpp requires -- each at the offset where the one before ends, padded to
    the alignment -- so an extent past the end of the file, a misaligned or overlapping
    offset, or a type or shape that does not cover the bytes the tensor occupies is refused.
    Raises GGUFError naming the file and the field or tensor."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such GGUF file")
    size = path.stat().st_size
    if size < 24:
        raise GGUFError(f"{path}: {size} bytes is too short for a GGUF header (24 bytes)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _walk(_Cursor(buf, path))


def _walk(cur: _Cursor) -> GGUFLayout:
    version, n_tensors, n_kv = _header(cur)
    metadata, alignment = _metadata(cur, n_kv)
    names: set[str] = set()
    tensors = tuple(_tensor_entry(cur, i, names) for i in range(n_tensors))
    layout = GGUFLayout(
        cur.path,
        cur.size,
        version,
        alignment,
        metadata,
        tensors,
        cur.pos,
        _align(cur.pos, alignment),
    )
    _check_extents(layout)
    return layout


def _header(cur: _Cursor) -> tuple[int, int, int]:
    """Magic, version, tensor count, key/value count: (version, n_tensors, n_kv)."""
    at = cur.skip(4, "magic")
    magic = bytes(cur.buf[at : at + 4])
    if magic != b"GGUF":
        raise cur.fail(f"magic must be b'GGUF', got {magic!r} (not a GGUF file)")
    version = cur.u32("version")
    if version not in (2, 3):
        if version & 0xFFFF == 0 and (version >> 24) in (2, 3):
            raise cur.fail(
                f"big-endian GGUF files are not supported (the version reads {version:#x})"
            )
        raise cur.fail(f"GGUF version must be 2 or 3, got {version}")
    n_tensors = cur.u64("GGUF.tensor_count")
    n_kv = cur.u64("GGUF.kv_count")
    # the smallest key/value entry is 13 bytes (empty key, type, one byte), the smallest
    # tensor entry 32 (empty name, n_dims, one dim, type, offset)
    if n_kv * 13 + n_tensors * 32 > cur.size - cur.pos:
        raise cur.fail(
            f"GGUF.kv_count {n_kv} and GGUF.tensor_count {n_tensors} cannot fit in "
            f"the {cur.size - cur.pos} bytes after the header"
        )
    return version, n_tensors, n_kv


def _metadata(cur: _Cursor, n_kv: int) -> tuple[tuple[MetadataEntry, ...], int]:
    """The key/value entries and the alignment they set (``general.alignment``, default 32)."""
    entries, keys = [], set()
    alignment = gguf.GGUF_DEFAULT_ALIGNMENT
    for i in range(n_kv):
        start = cur.pos
        key = cur.name(f"key of metadata entry {i}", keys, "metadata")
        vtype = cur.u32(f"metadata '{key}': value type")
        value_start = cur.pos
        cur.value(vtype, f"metadata '{key}'")
        entries.append(MetadataEntry(key, start, vtype, value_start, cur.pos))
        if key == "general.alignment":
            if vtype != VT.UINT32:
                raise cur.fail(
                    f"metadata 'general.alignment' must be a UINT32, got {VT(vtype).name}"
                )
            alignment = struct.unpack_from("<I", cur.buf, value_start)[0]
            if alignment == 0 or alignment & (alignment - 1):
                raise cur.fail(
                    f"metadata 'general.alignment' must be a power of two, got {alignment}"
                )
    return tuple(entries), alignment


def _tensor_entry(cur: _Cursor, i: int, names: set[str]) -> TensorEntry:
    """Tensor-info entry ``i``: name, 1..4 dims each >= 1, a known type, rows of whole
    blocks, the data offset (checked against the data section later)."""
    start = cur.pos
    name = cur.name(f"name of tensor {i}", names, "tensor")
    where = f"tensor '{name}'"
    n_dims = cur.u32(f"{where}: n_dims")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"{where}: n_dims must be in 1..{MAX_DIMS}, got {n_dims}")
    dims = tuple(cur.u64(f"{where}: dimension {d}") for d in range(n_dims))
    if min(dims) < 1:
        raise cur.fail(f"{where}: every dimension must be >= 1, got {list(dims)}")
    raw_type = cur.u32(f"{where}: type")
    try:
        qtype = QT(raw_type)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise cur.fail(f"{where}: type {raw_type} is not a GGML tensor type") from None
    if dims[0] % block:
        raise cur.fail(
            f"{where}: {qtype.name} row length {dims[0]} is not a multiple of its "
            f"block size {block}"
        )
    offset = cur.u64(f"{where}: data offset")
    return TensorEntry(name, start, dims, qtype, offset, math.prod(dims) // block * type_size)


def _describe(t: TensorEntry) -> str:
    return f"'{t.name}' ({t.type.name} {list(reversed(t.dims))}, {t.nbytes} bytes)"


def _check_extents(layout: GGUFLayout) -> None:
    """Every tensor inside the data section, aligned, and packed in order (llama.cpp's rule):
    a tensor starts where the one before it ends, padded to the alignment, so no bytes of the
    data section are claimed twice or by none."""
    path, a, size = layout.path, layout.alignment, layout.size
    expected, before = 0, None
    for t in layout.tensors:
        where = f"{path}: tensor '{t.name}'"
        if layout.data_start + t.offset + t.nbytes > size:
            raise GGUFError(
                f"{where}: data [offset {t.offset}, {t.nbytes} bytes] runs past the end "
                f"of the file ({size} bytes, data section at {layout.data_start})"
            )
        if t.offset % a:
            raise GGUFError(
                f"{where}: data offset {t.offset} is not a multiple of the alignment {a}"
            )
        if t.offset < expected:
            raise GGUFError(
                f"{where}: data [offset {t.offset}, {t.nbytes} bytes] overlaps tensor "
                f"{_describe(before)}, which ends at {before.offset + before.nbytes}"
            )
        if t.offset > expected:
            after = (
                f"tensor {_describe(before)} ends at {expected} (padded to {a})"
                if before
                else "the data section starts at 0"
            )
            raise GGUFError(
                f"{where}: data starts at offset {t.offset}, but {after}: {t.offset - expected} "
                "bytes belong to no tensor (a type or shape that does not match the data?)"
            )
        expected, before = _align(t.offset + t.nbytes, a), t
    if before is not None:
        trailing = size - (layout.data_start + before.offset + before.nbytes)
        if trailing >= a:
            raise GGUFError(
                f"{path}: {trailing} bytes after the last tensor {_describe(before)} "
                f"belong to no tensor (a type or shape that does not match the data?)"
            )

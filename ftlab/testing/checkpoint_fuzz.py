"""Seeded mutations of checkpoints, to fuzz the loaders with (``ftlab.models.loader``).

A mutator is built once over a valid checkpoint and gives, for each seed, one mutated copy
and a :class:`Mutation` saying what changed (the same seed always gives the same copy, so a
failing case can be replayed)::

    from ftlab.testing.checkpoint_fuzz import GGUFMutator
    from ftlab.models.loader import CheckpointError, load_gguf

    mutator = GGUFMutator("model.gguf")
    for seed in range(1000):
        data, mutation = mutator.mutate(seed)
        Path("case.gguf").write_bytes(data)
        try:
            load_gguf("case.gguf")
        except CheckpointError:
            pass  # refused: fine; any other exception is a loader bug (print seed, mutation)

:class:`GGUFMutator` edits the header (magic, version, counts), metadata (value types, string
lengths and array counts, values of the right and of the wrong type, entries removed or
repeated), the tensor table (types, dims, offsets, names), truncates, flips header bytes, or
changes stored values only (``Mutation.values_only``: the loaders do not scan values, so
such a copy loads, and may give non-finite results). :class:`HFMutator` writes a mutated HF
directory: ``config.json`` values (types, ranges, deletions, broken JSON), safetensors
headers, truncations, stored values, and shard layouts with and without an index (extra,
missing, duplicated, mis-mapped shards), and features ftlab lacks (``Mutation.unsupported``:
a sliding window, attention biases, another activation); it lives in :mod:`ftlab.testing.hf_fuzz`.
"""

from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass
from pathlib import Path

import gguf

from ftlab.formats.gguf_structure import GGUFLayout, MetadataEntry, read_layout

VT = gguf.GGUFValueType
_FORMATS = {
    VT.UINT8: "<B",
    VT.INT8: "<b",
    VT.UINT16: "<H",
    VT.INT16: "<h",
    VT.UINT32: "<I",
    VT.INT32: "<i",
    VT.FLOAT32: "<f",
    VT.BOOL: "<?",
    VT.UINT64: "<Q",
    VT.INT64: "<q",
    VT.FLOAT64: "<d",
}
_INTS = (VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64)
# counts and lengths that break parsers: zero, off by one, the sign bit, all ones
_BAD_U64 = (0, 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1)


@dataclass(frozen=True)
class Mutation:
    """What one seed changed: ``kind`` (the family, e.g. ``gguf.tensor-offset``), ``detail``
    (where and how), ``values_only`` (only stored tensor values changed), ``unsupported`` (the
    copy asks for what ftlab does not compute: a loader must refuse it, not load it)."""

    kind: str
    detail: str
    values_only: bool = False
    unsupported: bool = False


def encode_value(vtype: int, value) -> bytes:
    """A GGUF value as stored: scalars little-endian, a string (str or raw bytes) as uint64
    length + bytes, an array as ``(item_type, items)`` -> uint32 type, uint64 count, items."""
    if vtype == VT.STRING:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return struct.pack("<Q", len(raw)) + raw
    if vtype == VT.ARRAY:
        item_type, items = value
        return struct.pack("<IQ", item_type, len(items)) + b"".join(
            encode_value(item_type, v) for v in items
        )
    return struct.pack(_FORMATS[VT(vtype)], value)


def encode_entry(key: str, vtype: int, value) -> bytes:
    """One metadata key/value entry as stored."""
    return encode_value(VT.STRING, key) + struct.pack("<I", vtype) + encode_value(vtype, value)


def splice(
    raw: bytes, layout: GGUFLayout, start: int, end: int, new: bytes, kv_delta: int = 0
) -> bytes:
    """``raw`` with header bytes ``[start, end)`` replaced by ``new``, the key/value count
    moved by ``kv_delta``, and the data section re-padded to the file's alignment (tensor
    offsets are relative to it, so they stay right)."""
    header = bytearray(raw[:start] + new + raw[end : layout.header_end])
    n_kv = struct.unpack_from("<Q", header, 16)[0]
    struct.pack_into("<Q", header, 16, n_kv + kv_delta)
    pad = -len(header) % layout.alignment
    return bytes(header) + b"\0" * pad + raw[layout.data_start :]


def with_metadata(
    raw: bytes, key: str, vtype: int | None, value=None, layout: GGUFLayout | None = None
) -> bytes:
    """GGUF bytes ``raw`` with metadata ``key`` set to ``value`` of type ``vtype`` (replaced
    in place, or appended when absent), or removed (``vtype`` None). ``layout``: raw's
    (read from ``raw`` when not given)."""
    layout = layout or read_layout_of(raw)
    entry = next((e for e in layout.metadata if e.key == key), None)
    new = b"" if vtype is None else encode_entry(key, vtype, value)
    if entry is not None:
        return splice(raw, layout, entry.start, entry.end, new, kv_delta=-1 if vtype is None else 0)
    if vtype is None:
        raise KeyError(f"metadata {key!r} is not in the file")
    end = layout.metadata[-1].end if layout.metadata else 24
    return splice(raw, layout, end, end, new, kv_delta=1)


def read_layout_of(raw: bytes) -> GGUFLayout:
    """:func:`~ftlab.formats.gguf_structure.read_layout` of GGUF bytes (written to a temporary
    file)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(raw)
        f.flush()
        return read_layout(f.name)


def bad_u64(rng: random.Random, current: int, size: int) -> int:
    """A uint64 other than ``current`` that a parser may trust too far."""
    values = (*_BAD_U64, current - 1, current + 1, 2 * current, rng.randrange(size))
    return rng.choice([v % 2**64 for v in values if v % 2**64 != current])


def flip_bytes(data: bytearray, rng: random.Random, lo: int, hi: int, count: int) -> list[int]:
    """Change ``count`` bytes of ``data[lo:hi]`` (a bit flip, 0x00, 0xFF or a random byte, never
    the byte it was); returns their positions."""
    at = sorted(rng.randrange(lo, hi) for _ in range(count))
    for i in at:
        new = {data[i] ^ (1 << rng.randrange(8)), 0x00, 0xFF, rng.randrange(256)} - {data[i]}
        data[i] = rng.choice(sorted(new))
    return at


class GGUFMutator:
    """Seeded mutations of one valid GGUF file (module docstring: which)."""

    KINDS = (
        "header",
        "kv-type",
        "kv-length",
        "kv-value",
        "kv-remove",
        "kv-repeat",
        "alignment",
        "tensor-type",
        "tensor-dims",
        "tensor-offset",
        "tensor-name",
        "truncate",
        "bytes",
        "values",
    )

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.raw = self.path.read_bytes()
        self.layout = read_layout(self.path)
        reader = gguf.GGUFReader(self.path)
        self.values = {e.key: reader.fields[e.key].contents() for e in self.layout.metadata}

    def mutate(self, seed: int) -> tuple[bytes, Mutation]:
        """The mutated bytes and the mutation of ``seed``."""
        rng = random.Random(seed)
        kind = rng.choice(self.KINDS)
        data, detail = getattr(self, "_" + kind.replace("-", "_"))(rng)
        return bytes(data), Mutation("gguf." + kind, detail, values_only=kind == "values")

    def _header(self, rng):
        data = bytearray(self.raw)
        field = rng.choice(["magic", "version", "tensor_count", "kv_count"])
        if field == "magic":
            i = rng.randrange(4)
            data[i] ^= 1 << rng.randrange(8)
            return data, f"magic byte {i} -> {data[i]:#04x}"
        if field == "version":
            v = rng.choice([0, 1, 2, 4, 0x03000000, 0x00030000, 2**32 - 1])
            struct.pack_into("<I", data, 4, v)
            return data, f"version -> {v:#x}"
        at = 8 if field == "tensor_count" else 16
        v = bad_u64(rng, struct.unpack_from("<Q", data, at)[0], len(data))
        struct.pack_into("<Q", data, at, v)
        return data, f"{field} -> {v}"

    def _entry(self, rng) -> MetadataEntry:
        return rng.choice(self.layout.metadata)

    def _kv_type(self, rng):
        data, e = bytearray(self.raw), self._entry(rng)
        at = e.value_start if e.value_type == VT.ARRAY and rng.random() < 0.5 else e.type_at
        current = struct.unpack_from("<I", data, at)[0]
        v = rng.choice([x for x in (*range(14), 2**31, 2**32 - 1) if x != current])
        struct.pack_into("<I", data, at, v)
        if at == e.value_start:
            return data, f"metadata '{e.key}': array item type -> {v}"
        return data, f"metadata '{e.key}': type {VT(e.value_type).name} -> {v}"

    def _kv_length(self, rng):
        data, e = bytearray(self.raw), self._entry(rng)
        targets = [("key length", e.start)]
        if e.value_type == VT.STRING:
            targets.append(("string length", e.value_start))
        if e.value_type == VT.ARRAY:
            targets.append(("array count", e.value_start + 4))
            if struct.unpack_from("<I", data, e.value_start)[0] == VT.STRING:
                n = struct.unpack_from("<Q", data, e.value_start + 4)[0]
                at = e.value_start + 12
                for _ in range(rng.randrange(n) if n else 0):  # walk to a random item
                    at += 8 + struct.unpack_from("<Q", data, at)[0]
                targets.append(("a string item's length", at))
        what, at = rng.choice(targets)
        v = bad_u64(rng, struct.unpack_from("<Q", data, at)[0], len(data))
        struct.pack_into("<Q", data, at, v)
        return data, f"metadata '{e.key}': {what} -> {v}"

    def _kv_value(self, rng):
        e = self._entry(rng)
        current = self.values[e.key]
        vtype, value = rng.choice(self._replacements(e, current, rng))
        shown = value if not isinstance(value, tuple) else (VT(value[0]).name, value[1][:4])
        data = with_metadata(self.raw, e.key, vtype, value, self.layout)
        return data, f"metadata '{e.key}' -> {VT(vtype).name} {shown!r:.120}"

    def _replacements(self, e: MetadataEntry, v, rng) -> list[tuple[int, object]]:
        """Values for entry ``e`` (current value ``v``): in range, out of range, wrong type."""
        if e.value_type in _INTS:
            return [(e.value_type, x) for x in (0, 1, v + 1, max(v - 1, 0), 2 * v)] + [
                (VT.INT32, -1),
                (VT.UINT32, 2**32 - 1),
                (VT.UINT64, 2**63),
                (VT.STRING, str(v)),
                (VT.FLOAT32, float(v)),
                (VT.ARRAY, (VT.FLOAT32, [float(v)])),
                (VT.ARRAY, (e.value_type, [v])),
                (VT.BOOL, True),
            ]
        if e.value_type in (VT.FLOAT32, VT.FLOAT64):
            return [
                (e.value_type, x)
                for x in (0.0, -1.0, math.nan, math.inf, 1e-45, 3.4e38, v * 2, v / 2)
            ] + [(VT.FLOAT64, v), (VT.UINT32, int(v)), (VT.STRING, str(v))]
        if e.value_type == VT.STRING:
            return [
                (VT.STRING, b"\xff\xfe"),
                (VT.STRING, ""),
                (VT.STRING, v + "x"),
                (VT.UINT32, 0),
                (VT.ARRAY, (VT.STRING, [v])),
            ]
        if e.value_type == VT.ARRAY and v and isinstance(v[0], str):
            i = rng.randrange(len(v))

            def items(x):
                return (VT.ARRAY, (VT.STRING, x))

            return [
                items(v[:i] + [b"\xc3\x28"] + v[i + 1 :]),
                items(v[:i] + [""] + v[i + 1 :]),
                items(v[:i] + ["a b c"] + v[i + 1 :]),
                items(v[:i] + [v[-1 - i]] + v[i + 1 :]),
                items(v[:i] + v[i + 1 :]),
                items([*v, v[i]]),
                items([]),
                (VT.ARRAY, (VT.INT32, list(range(len(v))))),
                (VT.STRING, " ".join(v)),
            ]
        if e.value_type == VT.ARRAY and v:
            item = VT(struct.unpack_from("<I", self.raw, e.value_start)[0])
            i = rng.randrange(len(v))
            return [
                (VT.ARRAY, (item, v[:i] + v[i + 1 :])),
                (VT.ARRAY, (item, [*v, v[i]])),
                (VT.ARRAY, (VT.FLOAT32, [float(x) for x in v])),
                (VT.ARRAY, (VT.STRING, [str(x) for x in v])),
            ]
        return [(VT.UINT32, 0), (VT.STRING, "x")]

    def _alignment(self, rng):
        """An alignment the data section was not padded for (or of the wrong type)."""
        a = rng.choice([0, 1, 3, 16, 32, 64, 4096, 2**31])
        vtype = rng.choice([VT.UINT32, VT.UINT32, VT.UINT64, VT.STRING])
        value = str(a) if vtype == VT.STRING else a
        data = with_metadata(self.raw, "general.alignment", vtype, value, self.layout)
        return data, f"metadata 'general.alignment' set: {VT(vtype).name} {a}"

    def _kv_remove(self, rng):
        e = self._entry(rng)
        return splice(
            self.raw, self.layout, e.start, e.end, b"", kv_delta=-1
        ), f"metadata '{e.key}' removed"

    def _kv_repeat(self, rng):
        e = self._entry(rng)
        entry = self.raw[e.start : e.end]
        return splice(
            self.raw, self.layout, e.end, e.end, entry, kv_delta=1
        ), f"metadata '{e.key}' repeated"

    def _tensor(self, rng):
        return rng.choice(self.layout.tensors)

    def _tensor_type(self, rng):
        data, t = bytearray(self.raw), self._tensor(rng)
        types = (*(int(q) for q in gguf.GGML_QUANT_SIZES), 4, 5, 31, 99, 2**32 - 1)
        v = rng.choice([x for x in types if x != t.type])
        struct.pack_into("<I", data, t.type_at, v)
        return data, f"tensor '{t.name}': type {t.type.name} -> {v}"

    def _tensor_dims(self, rng):
        data, t = bytearray(self.raw), self._tensor(rng)
        if rng.random() < 0.25:
            n = rng.choice([0, 5, 2**32 - 1, len(t.dims) - 1, len(t.dims) + 1])
            struct.pack_into("<I", data, t.n_dims_at, n)
            return data, f"tensor '{t.name}': n_dims {len(t.dims)} -> {n}"
        d = rng.randrange(len(t.dims))
        if rng.random() < 0.2 and len(set(t.dims)) > 1:
            dims = list(reversed(t.dims))
            struct.pack_into(f"<{len(dims)}Q", data, t.n_dims_at + 4, *dims)
            return data, f"tensor '{t.name}': dims {list(t.dims)} -> {dims}"
        v = rng.choice(
            [
                x
                for x in (
                    0,
                    1,
                    t.dims[d] // 2,
                    t.dims[d] + 1,
                    t.dims[d] * 2,
                    2**32,
                    2**63,
                    2**64 - 1,
                )
                if x != t.dims[d]
            ]
        )
        struct.pack_into("<Q", data, t.n_dims_at + 4 + 8 * d, v)
        return data, f"tensor '{t.name}': dim {d} {t.dims[d]} -> {v}"

    def _tensor_offset(self, rng):
        data, t = bytearray(self.raw), self._tensor(rng)
        a, size = self.layout.alignment, len(self.raw)
        other = rng.choice(self.layout.tensors).offset
        v = rng.choice(
            [
                x
                for x in (
                    t.offset + 1,
                    t.offset + a,
                    max(t.offset - a, 0),
                    0,
                    other,
                    size,
                    size - self.layout.data_start - t.nbytes + a,
                    2**63,
                    2**64 - 1,
                    2**64 - self.layout.data_start,
                )
                if x != t.offset
            ]
        )
        struct.pack_into("<Q", data, t.offset_at, v)
        return data, f"tensor '{t.name}': offset {t.offset} -> {v}"

    def _tensor_name(self, rng):
        t = self._tensor(rng)
        name = t.name.encode()
        how = rng.choice(["byte", "other", "length"])
        if how == "byte":
            i = rng.randrange(len(name))
            new = (
                name[:i] + bytes([rng.choice([0xFF, 0x00, ord("9"), name[i] ^ 1])]) + name[i + 1 :]
            )
        elif how == "other":
            new = rng.choice([u for u in self.layout.tensors if u != t]).name.encode()
        else:
            data = bytearray(self.raw)
            v = bad_u64(rng, len(name), len(data))
            struct.pack_into("<Q", data, t.start, v)
            return data, f"tensor '{t.name}': name length {len(name)} -> {v}"
        data = splice(self.raw, self.layout, t.start, t.n_dims_at, encode_value(VT.STRING, new))
        return data, f"tensor '{t.name}': name -> {new!r}"

    def _truncate(self, rng):
        end = rng.choice(
            [
                rng.randrange(self.layout.header_end),
                rng.randrange(len(self.raw)),
                len(self.raw) - rng.randrange(1, 64),
            ]
        )
        return self.raw[:end], f"truncated to {end} of {len(self.raw)} bytes"

    def _bytes(self, rng):
        data = bytearray(self.raw)
        at = flip_bytes(data, rng, 0, self.layout.header_end, rng.randrange(1, 5))
        return data, f"header bytes changed at {at}"

    def _values(self, rng):
        data = bytearray(self.raw)
        at = flip_bytes(data, rng, self.layout.data_start, len(data), rng.randrange(1, 9))
        return data, f"data bytes changed at {at}"

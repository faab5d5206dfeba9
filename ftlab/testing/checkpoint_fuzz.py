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
missing, duplicated, mis-mapped shards).
"""

from __future__ import annotations

import json
import math
import random
import struct
from dataclasses import dataclass
from pathlib import Path

import gguf

from ftlab.formats.gguf import GGUFLayout, MetadataEntry, read_layout

VT = gguf.GGUFValueType
_FORMATS = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I",
            VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q",
            VT.FLOAT64: "<d"}  # fmt: skip
_INTS = (VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64)
# counts and lengths that break parsers: zero, off by one, the sign bit, all ones
_BAD_U64 = (0, 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1)


@dataclass(frozen=True)
class Mutation:
    """What one seed changed: ``kind`` (the family, e.g. ``gguf.tensor-offset``), ``detail``
    (where and how), ``values_only`` (only stored tensor values changed)."""

    kind: str
    detail: str
    values_only: bool = False


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


def splice(raw: bytes, layout: GGUFLayout, start: int, end: int, new: bytes,
           kv_delta: int = 0) -> bytes:  # fmt: skip
    """``raw`` with header bytes ``[start, end)`` replaced by ``new``, the key/value count
    moved by ``kv_delta``, and the data section re-padded to the file's alignment (tensor
    offsets are relative to it, so they stay right)."""
    header = bytearray(raw[:start] + new + raw[end : layout.header_end])
    n_kv = struct.unpack_from("<Q", header, 16)[0]
    struct.pack_into("<Q", header, 16, n_kv + kv_delta)
    pad = -len(header) % layout.alignment
    return bytes(header) + b"\0" * pad + raw[layout.data_start :]


def with_metadata(raw: bytes, key: str, vtype: int | None, value=None,
                  layout: GGUFLayout | None = None) -> bytes:  # fmt: skip
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
    """:func:`~ftlab.formats.gguf.read_layout` of GGUF bytes (written to a temporary file)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(raw)
        f.flush()
        return read_layout(f.name)


def _u64(rng: random.Random, current: int, size: int) -> int:
    """A uint64 other than ``current`` that a parser may trust too far."""
    values = (*_BAD_U64, current - 1, current + 1, 2 * current, rng.randrange(size))
    return rng.choice([v % 2**64 for v in values if v % 2**64 != current])


def _flip(data: bytearray, rng: random.Random, lo: int, hi: int, count: int) -> list[int]:
    at = sorted(rng.randrange(lo, hi) for _ in range(count))
    for i in at:
        new = {data[i] ^ (1 << rng.randrange(8)), 0x00, 0xFF, rng.randrange(256)} - {data[i]}
        data[i] = rng.choice(sorted(new))
    return at


class GGUFMutator:
    """Seeded mutations of one valid GGUF file (module docstring: which)."""

    KINDS = ("header", "kv-type", "kv-length", "kv-value", "kv-remove", "kv-repeat", "alignment",
             "tensor-type", "tensor-dims", "tensor-offset", "tensor-name", "truncate", "bytes",
             "values")  # fmt: skip

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
        v = _u64(rng, struct.unpack_from("<Q", data, at)[0], len(data))
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
        v = _u64(rng, struct.unpack_from("<Q", data, at)[0], len(data))
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
                (VT.INT32, -1), (VT.UINT32, 2**32 - 1), (VT.UINT64, 2**63), (VT.STRING, str(v)),
                (VT.FLOAT32, float(v)), (VT.ARRAY, (VT.FLOAT32, [float(v)])),
                (VT.ARRAY, (e.value_type, [v])), (VT.BOOL, True)]  # fmt: skip
        if e.value_type in (VT.FLOAT32, VT.FLOAT64):
            return [(e.value_type, x) for x in (0.0, -1.0, math.nan, math.inf, 1e-45, 3.4e38,
                                                v * 2, v / 2)] + [  # fmt: skip
                (VT.FLOAT64, v), (VT.UINT32, int(v)), (VT.STRING, str(v))]  # fmt: skip
        if e.value_type == VT.STRING:
            return [(VT.STRING, b"\xff\xfe"), (VT.STRING, ""), (VT.STRING, v + "x"),
                    (VT.UINT32, 0), (VT.ARRAY, (VT.STRING, [v]))]  # fmt: skip
        if e.value_type == VT.ARRAY and v and isinstance(v[0], str):
            i = rng.randrange(len(v))

            def items(x):
                return (VT.ARRAY, (VT.STRING, x))

            return [items(v[:i] + [b"\xc3\x28"] + v[i + 1 :]), items(v[:i] + [""] + v[i + 1 :]),
                    items(v[:i] + ["a b c"] + v[i + 1 :]), items(v[:i] + [v[-1 - i]] + v[i + 1 :]),
                    items(v[:i] + v[i + 1 :]), items([*v, v[i]]), items([]),
                    (VT.ARRAY, (VT.INT32, list(range(len(v))))), (VT.STRING, " ".join(v))]  # fmt: skip
        if e.value_type == VT.ARRAY and v:
            item = VT(struct.unpack_from("<I", self.raw, e.value_start)[0])
            i = rng.randrange(len(v))
            return [(VT.ARRAY, (item, v[:i] + v[i + 1 :])), (VT.ARRAY, (item, [*v, v[i]])),
                    (VT.ARRAY, (VT.FLOAT32, [float(x) for x in v])),
                    (VT.ARRAY, (VT.STRING, [str(x) for x in v]))]  # fmt: skip
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
        return splice(self.raw, self.layout, e.start, e.end, b"", kv_delta=-1), \
            f"metadata '{e.key}' removed"  # fmt: skip

    def _kv_repeat(self, rng):
        e = self._entry(rng)
        entry = self.raw[e.start : e.end]
        return splice(self.raw, self.layout, e.end, e.end, entry, kv_delta=1), \
            f"metadata '{e.key}' repeated"  # fmt: skip

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
        v = rng.choice([x for x in (0, 1, t.dims[d] // 2, t.dims[d] + 1, t.dims[d] * 2, 2**32,
                                    2**63, 2**64 - 1) if x != t.dims[d]])  # fmt: skip
        struct.pack_into("<Q", data, t.n_dims_at + 4 + 8 * d, v)
        return data, f"tensor '{t.name}': dim {d} {t.dims[d]} -> {v}"

    def _tensor_offset(self, rng):
        data, t = bytearray(self.raw), self._tensor(rng)
        a, size = self.layout.alignment, len(self.raw)
        other = rng.choice(self.layout.tensors).offset
        v = rng.choice([x for x in (t.offset + 1, t.offset + a, max(t.offset - a, 0), 0, other,
                                    size, size - self.layout.data_start - t.nbytes + a, 2**63,
                                    2**64 - 1, 2**64 - self.layout.data_start) if x != t.offset])  # fmt: skip
        struct.pack_into("<Q", data, t.offset_at, v)
        return data, f"tensor '{t.name}': offset {t.offset} -> {v}"

    def _tensor_name(self, rng):
        t = self._tensor(rng)
        name = t.name.encode()
        how = rng.choice(["byte", "other", "length"])
        if how == "byte":
            i = rng.randrange(len(name))
            new = name[:i] + bytes([rng.choice([0xFF, 0x00, ord("9"), name[i] ^ 1])]) + name[i + 1 :]
        elif how == "other":
            new = rng.choice([u for u in self.layout.tensors if u != t]).name.encode()
        else:
            data = bytearray(self.raw)
            v = _u64(rng, len(name), len(data))
            struct.pack_into("<Q", data, t.start, v)
            return data, f"tensor '{t.name}': name length {len(name)} -> {v}"
        data = splice(self.raw, self.layout, t.start, t.n_dims_at, encode_value(VT.STRING, new))
        return data, f"tensor '{t.name}': name -> {new!r}"

    def _truncate(self, rng):
        end = rng.choice([rng.randrange(self.layout.header_end), rng.randrange(len(self.raw)),
                          len(self.raw) - rng.randrange(1, 64)])  # fmt: skip
        return self.raw[:end], f"truncated to {end} of {len(self.raw)} bytes"

    def _bytes(self, rng):
        data = bytearray(self.raw)
        at = _flip(data, rng, 0, self.layout.header_end, rng.randrange(1, 5))
        return data, f"header bytes changed at {at}"

    def _values(self, rng):
        data = bytearray(self.raw)
        at = _flip(data, rng, self.layout.data_start, len(data), rng.randrange(1, 9))
        return data, f"data bytes changed at {at}"


class HFMutator:
    """Seeded mutations of one valid HF directory (``config.json`` + ``model.safetensors``),
    written to a fresh directory per case (module docstring: which)."""

    KINDS = ("config-type", "config-value", "config-remove", "config-bytes", "st-header",
             "st-truncate", "st-bytes", "st-values", "shards")  # fmt: skip
    # keys the loader reads (fields of Qwen3MoeConfig, and the switches it refuses)
    READ = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok",
            "moe_intermediate_size", "rms_norm_eps", "rope_theta", "norm_topk_prob",
            "tie_word_embeddings", "max_position_embeddings", "model_type", "torch_dtype",
            "attention_bias", "mlp_only_layers", "decoder_sparse_step", "rope_scaling")  # fmt: skip
    INDEX = "model.safetensors.index.json"

    def __init__(self, path: str | Path):
        from safetensors.torch import load_file

        self.path = Path(path)
        self.config_bytes = (self.path / "config.json").read_bytes()
        self.config = json.loads(self.config_bytes)
        self.weights_raw = (self.path / "model.safetensors").read_bytes()
        self.header_len = struct.unpack_from("<Q", self.weights_raw)[0]
        self.header = json.loads(self.weights_raw[8 : 8 + self.header_len])
        self.tensors = load_file(self.path / "model.safetensors")

    def mutate(self, seed: int, out: str | Path) -> Mutation:
        """Write the mutated directory of ``seed`` into the (empty) directory ``out``."""
        rng, out = random.Random(seed), Path(out)
        kind = rng.choice(self.KINDS)
        config, weights = self.config_bytes, self.weights_raw
        detail = ""
        if kind.startswith("config"):
            config, detail = getattr(self, "_" + kind.replace("-", "_"))(rng)
        elif kind.startswith("st"):
            weights, detail = getattr(self, "_" + kind.replace("-", "_"))(rng)
        (out / "config.json").write_bytes(config)
        if kind == "shards":
            detail = self._shards(rng, out)
        else:
            (out / "model.safetensors").write_bytes(weights)
        return Mutation("hf." + kind, detail, values_only=kind == "st-values")

    def _key(self, rng) -> str:
        keys = [k for k in self.READ if k in self.config]
        return rng.choice(keys if rng.random() < 0.85 else list(self.config))

    def _dump(self, config: dict) -> bytes:
        return json.dumps(config, indent=2).encode()

    def _config_type(self, rng):
        key = self._key(rng)
        v = self.config[key]
        new = rng.choice([str(v).lower() if isinstance(v, bool) else str(v), None, [v], {"v": v},
                          float(v) if isinstance(v, (int, float)) and not isinstance(v, bool)
                          else 1.5, True, 0 if isinstance(v, bool) else "x"])  # fmt: skip
        return self._dump({**self.config, key: new}), f"config.json '{key}': {v!r} -> {new!r}"

    def _config_value(self, rng):
        key = self._key(rng)
        v, c = self.config[key], self.config
        choices = [0, -1, 10**12, 2**63, math.nan, math.inf, -math.inf, 1e-300, 1e300, 1.0]
        if isinstance(v, int) and not isinstance(v, bool):
            choices += [v - 1, v + 1, 2 * v]
        choices += {
            "num_experts_per_tok": [c.get("num_experts", 8) + 1],
            "num_key_value_heads": [3, c.get("num_attention_heads", 4) + 1],
            "rope_scaling": [{"rope_type": "yarn", "factor": 4.0}, {"type": "linear"}],
            "torch_dtype": ["float16", "bfloat16", "int8", "nn", "float64", ""],
            "model_type": ["llama", "qwen3_moe "], "attention_bias": [True],
            "mlp_only_layers": [[0]], "decoder_sparse_step": [2],
        }.get(key, [])  # fmt: skip
        new = rng.choice(choices)
        return self._dump({**c, key: new}), f"config.json '{key}': {v!r} -> {new!r}"

    def _config_remove(self, rng):
        key = self._key(rng)
        config = {k: v for k, v in self.config.items() if k != key}
        return self._dump(config), f"config.json '{key}' removed"

    def _config_bytes(self, rng):
        raw = bytearray(self.config_bytes)
        if rng.random() < 0.3:
            end = rng.randrange(len(raw))
            return bytes(raw[:end]), f"config.json truncated to {end} bytes"
        at = _flip(raw, rng, 0, len(raw), rng.randrange(1, 4))
        return bytes(raw), f"config.json bytes changed at {at}"

    def _st_header(self, rng):
        header = json.loads(json.dumps(self.header))
        name = rng.choice([k for k in header if k != "__metadata__"])
        entry = header[name]
        how = rng.choice(["dtype", "shape", "offsets", "rename", "remove", "metadata", "length"])
        if how == "dtype":
            entry["dtype"] = rng.choice(["I32", "U32", "F16", "BF16", "F64", "BOOL", "U8", "I64",
                                         "F8_E4M3", "X"])  # fmt: skip
        elif how == "shape":
            s = entry["shape"]
            entry["shape"] = rng.choice([[], [0], s[::-1], [*s, 1], [s[0] + 1, *s[1:]],
                                         [-1, *s[1:]], [2**64, *s[1:]], [s[0] // 2, *s[1:]]])  # fmt: skip
        elif how == "offsets":
            a, b = entry["data_offsets"]
            entry["data_offsets"] = rng.choice([[a + 1, b + 1], [a, b - 4], [b, a], [0, b - a],
                                                [a, 2**64], [a, b + 4]])  # fmt: skip
        elif how == "rename":
            other = rng.choice([k for k in header if k != "__metadata__"])
            header = {(other if k == name else k): v for k, v in header.items()}
            if other != name:  # the same key twice: written by hand, as json.dumps cannot
                text = json.dumps(header)[:-1] + f', "{other}": ' + json.dumps(entry) + "}"
                return self._with_header(text.encode()), f"safetensors: tensor '{name}' -> '{other}'"
        elif how == "remove":
            del header[name]
        elif how == "metadata":
            header["__metadata__"] = rng.choice([[], "x", {"format": 1}, None])
        else:
            v = _u64(rng, self.header_len, len(self.weights_raw))
            return struct.pack("<Q", v) + self.weights_raw[8:], f"safetensors: header length -> {v}"
        return self._with_header(json.dumps(header).encode()), f"safetensors: {how} of '{name}'"

    def _with_header(self, text: bytes) -> bytes:
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text + self.weights_raw[8 + self.header_len :]

    def _st_truncate(self, rng):
        end = rng.choice([rng.randrange(8 + self.header_len), rng.randrange(len(self.weights_raw)),
                          len(self.weights_raw) - rng.randrange(1, 64)])  # fmt: skip
        return self.weights_raw[:end], f"model.safetensors truncated to {end} bytes"

    def _st_bytes(self, rng):
        data = bytearray(self.weights_raw)
        at = _flip(data, rng, 0, 8 + self.header_len, rng.randrange(1, 5))
        return bytes(data), f"safetensors header bytes changed at {at}"

    def _st_values(self, rng):
        data = bytearray(self.weights_raw)
        at = _flip(data, rng, 8 + self.header_len, len(data), rng.randrange(1, 9))
        return bytes(data), f"safetensors data bytes changed at {at}"

    def _shards(self, rng, out: Path) -> str:
        """Two shards (transformers' names) plus one layout fault, or none."""
        from safetensors.torch import save_file

        names = sorted(self.tensors)
        cut = rng.randrange(1, len(names))
        shards = {"model-00001-of-00002.safetensors": names[:cut],
                  "model-00002-of-00002.safetensors": names[cut:]}  # fmt: skip
        weight_map = {n: s for s, ns in shards.items() for n in ns}
        index: object = {"metadata": {}, "weight_map": weight_map}
        fault = rng.choice(["none", "no index", "stale shard", "stale shard, no index",
                            "duplicate", "duplicate, no index", "missing shard", "wrong shard",
                            "unlisted tensor", "unknown tensor", "index not JSON",
                            "no weight_map", "shard outside the directory"])  # fmt: skip
        first, second = list(shards)
        moved = rng.choice(names)
        if fault.startswith("duplicate"):  # one tensor in both shards
            shards[second if moved in shards[first] else first] = [
                *shards[second if moved in shards[first] else first], moved]
        for shard, ns in shards.items():
            if not (fault == "missing shard" and shard == second):
                save_file({n: self.tensors[n] for n in ns}, str(out / shard), {"format": "pt"})
        if fault.startswith("stale shard"):  # an older copy of some tensors, left in the folder
            stale = {n: self.tensors[n] * 2 for n in rng.sample(names, 3)}
            save_file(stale, str(out / "model-00001-of-00003.safetensors"), {"format": "pt"})
        if fault == "wrong shard":
            weight_map[moved] = second if weight_map[moved] == first else first
        elif fault == "unlisted tensor":
            del weight_map[moved]
        elif fault == "unknown tensor":
            weight_map["model.layers.99.mlp.gate.weight"] = first
        elif fault == "no weight_map":
            index = rng.choice([{"metadata": {}}, {"weight_map": []}, [], {"weight_map": {}}])
        elif fault == "shard outside the directory":
            weight_map[moved] = "../" + weight_map[moved]
        if "no index" not in fault:
            text = json.dumps(index)
            if fault == "index not JSON":
                text = text[: rng.randrange(len(text))]
            (out / self.INDEX).write_text(text)
        return f"2 shards split before '{names[cut]}', fault: {fault} ('{moved}')"

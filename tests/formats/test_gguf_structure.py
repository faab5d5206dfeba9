"""GGUF structure: byte edits of the tiny model's header that GGUFReader would trust (and then
loop, allocate without bound, or read past the end or the wrong bytes) are refused by
ftlab.formats.gguf_structure.read_layout with a GGUFError naming the file and the field or
tensor."""

import struct

import pytest

from ftlab.formats.gguf_structure import GGUFError, read_layout
from ftlab.models import tiny
from ftlab.models.loader import load_gguf
from ftlab.testing.checkpoint_fuzz import encode_value, splice

VT_STRING, VT_ARRAY = 8, 9


@pytest.fixture(scope="module")
def tiny_dir():
    return tiny.ensure("tiny-qwen3-moe")


def entry(layout, key):
    return next(e for e in layout.metadata if e.key == key)


def tensor(layout, name):
    return next(t for t in layout.tensors if t.name == name)


def u32(data, at, v):
    struct.pack_into("<I", data, at, v)


def u64(data, at, v):
    struct.pack_into("<Q", data, at, v)


def nested_arrays(levels: int) -> bytes:
    """An array holding an array holding ... an empty array of uint8."""
    value = struct.pack("<IQ", 0, 0)
    for _ in range(levels - 1):
        value = struct.pack("<IQ", VT_ARRAY, 1) + value
    return value


def f32_edit(L, d):
    t = tensor(L, "blk.0.attn_q.weight")
    u32(d, t.type_at, 1)  # F32 -> F16: the tensor now claims half the bytes it occupies


# name -> (edit of bytearray d given layout L, substrings the message must hold)
CASES = {
    "magic": (lambda L, d: d.__setitem__(slice(0, 4), b"GGUG"), ["magic"]),
    "version": (lambda L, d: u32(d, 4, 4), ["version must be 2 or 3, got 4"]),
    "big-endian": (lambda L, d: u32(d, 4, 0x03000000), ["big-endian"]),
    "tensor count": (lambda L, d: u64(d, 8, 2**64 - 1), ["GGUF.tensor_count 18446744073709551615"]),
    "kv count": (lambda L, d: u64(d, 16, 2**40), ["GGUF.kv_count 1099511627776"]),
    "key length": (lambda L, d: u64(d, 24, 2**64 - 1), ["key of metadata entry 0"]),
    "key not UTF-8": (lambda L, d: d.__setitem__(32, 0xFF), ["key of metadata entry 0", "UTF-8"]),
    "unknown value type": (
        lambda L, d: u32(d, entry(L, "general.architecture").type_at, 13),
        ["'general.architecture'", "value type 13"],
    ),
    # the edit a user found: a string read as an array whose count is the string's bytes
    "string -> array": (
        lambda L, d: u32(d, entry(L, "general.architecture").type_at, VT_ARRAY),
        ["'general.architecture'"],
    ),
    "string length": (
        lambda L, d: u64(d, entry(L, "general.architecture").value_start, 2**63),
        ["'general.architecture'", "9223372036854775808 bytes"],
    ),
    "array item type": (
        lambda L, d: u32(d, entry(L, "tokenizer.ggml.tokens").value_start, 99),
        ["'tokenizer.ggml.tokens'", "value type 99"],
    ),
    "array count": (
        lambda L, d: u64(d, entry(L, "tokenizer.ggml.tokens").value_start + 4, 2**62),
        ["'tokenizer.ggml.tokens'", "an array of 4611686018427387904 STRING"],
    ),
    "a token's length": (
        lambda L, d: u64(d, entry(L, "tokenizer.ggml.tokens").value_start + 12, 2**64 - 1),
        ["'tokenizer.ggml.tokens'", "string"],
    ),
    "n_dims 0": (
        lambda L, d: u32(d, tensor(L, "output.weight").n_dims_at, 0),
        ["tensor 'output.weight'", "n_dims must be in 1..4, got 0"],
    ),
    "n_dims 5": (
        lambda L, d: u32(d, tensor(L, "output.weight").n_dims_at, 5),
        ["tensor 'output.weight'", "n_dims"],
    ),
    "zero dim": (
        lambda L, d: u64(d, tensor(L, "blk.1.attn_k.weight").n_dims_at + 4, 0),
        ["tensor 'blk.1.attn_k.weight'", "every dimension must be >= 1, got [0, 32]"],
    ),
    "unknown tensor type": (
        lambda L, d: u32(d, tensor(L, "output.weight").type_at, 99),
        ["tensor 'output.weight'", "type 99"],
    ),
    "tensor name length": (lambda L, d: u64(d, L.tensors[0].start, 2**63), ["name of tensor 0"]),
    "offset past the end": (
        lambda L, d: u64(d, tensor(L, "output.weight").offset_at, L.size),
        ["tensor 'output.weight'", "runs past the end of the file"],
    ),
    "offset wraps": (
        lambda L, d: u64(d, tensor(L, "output.weight").offset_at, 2**64 - 1),
        [
            "tensor 'output.weight'",
            "[offset 18446744073709551615, 98304 bytes] "
            "runs past the end of the file (703232 bytes",
        ],
    ),
    "offset misaligned": (
        lambda L, d: u64(
            d, tensor(L, "output.weight").offset_at, tensor(L, "output.weight").offset + 4
        ),
        ["tensor 'output.weight'", "not a multiple of the alignment 32"],
    ),
    "overlap": (
        lambda L, d: u64(d, tensor(L, "output.weight").offset_at, 0),
        ["tensor 'output.weight'", "overlaps tensor 'output_norm.weight'"],
    ),
    "F32 -> F16": (
        f32_edit,
        [
            "tensor 'blk.0.attn_k.weight'",
            "'blk.0.attn_q.weight' (F16 [64, 64], 8192 bytes)",
            "8192 bytes belong to no tensor",
        ],
    ),
    "F32 -> F16, last tensor": (
        lambda L, d: u32(d, L.tensors[-1].type_at, 1),
        ["bytes after the last tensor 'blk.1.ffn_down_exps.weight' (F16"],
    ),
    "alignment 3": (None, ["'general.alignment' must be a power of two, got 3"]),
    "alignment UINT64": (None, ["'general.alignment' must be a UINT32"]),
    "repeated key": (None, ["metadata 'qwen3moe.block_count' appears twice"]),
    "repeated tensor": (None, ["tensor 'output_norm.weight' appears twice"]),
    "nested arrays": (None, ["'tokenizer.ggml.merges'", "nested deeper than 4"]),
}


def _spliced(name, raw, L):
    """The cases that change the header's length (re-padded through splice)."""
    if name.startswith("alignment"):
        vtype, value = (4, 3) if name == "alignment 3" else (10, 32)
        new = encode_value(VT_STRING, "general.alignment") + struct.pack("<I", vtype)
        new += encode_value(vtype, value)
        end = L.metadata[-1].end
        return splice(raw, L, end, end, new, kv_delta=1)
    if name == "repeated key":
        e = entry(L, "qwen3moe.block_count")
        return splice(raw, L, e.end, e.end, raw[e.start : e.end], kv_delta=1)
    if name == "repeated tensor":
        t, u = tensor(L, "output.weight"), tensor(L, "output_norm.weight")
        return splice(raw, L, t.start, t.n_dims_at, encode_value(VT_STRING, u.name))
    e = entry(L, "tokenizer.ggml.merges")
    return splice(raw, L, e.type_at + 4, e.end, nested_arrays(6))


@pytest.mark.parametrize("name", list(CASES))
def test_structure_is_refused_naming_the_field(tiny_dir, tmp_path, name):
    raw = (tiny_dir / "model-f32.gguf").read_bytes()
    layout = read_layout(tiny_dir / "model-f32.gguf")
    edit, expected = CASES[name]
    if edit is None:
        data = _spliced(name, raw, layout)
    else:
        data = bytearray(raw)
        edit(layout, data)
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError) as refused:
        load_gguf(path, progress=False)
    message = str(refused.value)
    assert message.startswith(f"{path}: "), message
    for part in expected:
        assert part in message, message


def test_q4_0_row_length_must_hold_whole_blocks(tiny_dir, tmp_path):
    raw = bytearray((tiny_dir / "model-q4_0.gguf").read_bytes())
    t = tensor(read_layout(tiny_dir / "model-q4_0.gguf"), "blk.0.attn_q.weight")
    u64(raw, t.n_dims_at + 4, 48)
    (tmp_path / "model.gguf").write_bytes(bytes(raw))
    with pytest.raises(
        GGUFError,
        match=r"model\.gguf: tensor 'blk\.0\.attn_q\.weight': Q4_0 row "
        r"length 48 is not a multiple of its block size 32",
    ):
        read_layout(tmp_path / "model.gguf")


@pytest.mark.parametrize("keep", [0, 10, 23, 9000, 9406, 9500, 400000, 703231])
def test_truncated_files_are_refused(tiny_dir, tmp_path, keep):
    path = tmp_path / "cut.gguf"
    path.write_bytes((tiny_dir / "model-f32.gguf").read_bytes()[:keep])
    with pytest.raises(GGUFError, match="cut.gguf: "):
        load_gguf(path, progress=False)


def test_layout_of_the_tiny_files(tiny_dir):
    for name in ("model-f32.gguf", "model-q4_0.gguf"):
        layout = read_layout(tiny_dir / name)
        assert layout.version == 3 and layout.alignment == 32
        assert layout.data_start % 32 == 0 and len(layout.tensors) == 27
        last = layout.tensors[-1]
        assert layout.size == layout.data_start + last.offset + last.nbytes

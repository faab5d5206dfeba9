"""ftlab's GGUFFile against gguf-py's GGUFReader: every metadata key (its type, item type and
value) and every tensor (type, shape, sizes, offset, the mapped bytes) equal, on the files the
tests ship, the tiny models' files, and files of random metadata and tensors written by
GGUFWriter; and a model's load parses its file once."""

from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftlab.formats import gguf_structure
from ftlab.formats.gguf import GGUFError, field_value, open_gguf
from ftlab.formats.gguf_read import GGUFFile
from ftlab.models import tiny
from ftlab.models.pipeline import Pipeline

VT, QT = gguf.GGUFValueType, gguf.GGMLQuantizationType
DATA = Path(__file__).parents[1] / "data"
SHIPPED = sorted(DATA.glob("**/*.gguf"))


def plain(value):
    """Our decoded value as GGUFReader's ``contents()`` gives it."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value.item()


def assert_same(path: Path) -> None:
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]
    assert list(ours.keys()) == keys
    for key in keys:
        field = theirs.fields[key]
        vtype, item, value = ours.value(key)
        assert vtype == field.types[0], key
        assert item == (field.types[1] if vtype == VT.ARRAY else None), key
        want, got = field.contents(), plain(value)
        if item == VT.ARRAY:  # GGUFReader's contents() flattens arrays of arrays
            got = [x for inner in got for x in inner]
        assert repr(got) == repr(want), key  # repr: a NaN equals a NaN, -0.0 is not 0.0
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type, a.n_elements, a.n_bytes, a.data_offset) == (
            b.name,
            b.tensor_type,
            b.n_elements,
            b.n_bytes,
            b.data_offset,
        )
        assert a.shape.tolist() == b.shape.tolist() and a.shape.dtype == np.uint64
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data.view(np.uint8), b.data.view(np.uint8)), a.name


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_files_read_as_gguf_py_reads_them(path):
    assert_same(path)


@pytest.mark.parametrize("name", sorted(tiny.TINY_MODELS))
def test_tiny_model_files_read_as_gguf_py_reads_them(name):
    for path in sorted(tiny.ensure(name).glob("*.gguf")):
        assert_same(path)


_INTS = {
    VT.UINT8: (0, 2**8 - 1),
    VT.INT8: (-(2**7), 2**7 - 1),
    VT.UINT16: (0, 2**16 - 1),
    VT.INT16: (-(2**15), 2**15 - 1),
    VT.UINT32: (0, 2**32 - 1),
    VT.INT32: (-(2**31), 2**31 - 1),
    VT.UINT64: (0, 2**64 - 1),
    VT.INT64: (-(2**63), 2**63 - 1),
}


def scalars(vtype):
    if vtype in _INTS:
        return st.integers(*_INTS[vtype])
    if vtype == VT.FLOAT32:
        return st.floats(width=32)
    if vtype == VT.FLOAT64:
        return st.floats()
    if vtype == VT.BOOL:
        return st.booleans()
    return st.text(max_size=12)


SCALAR_TYPES = [*_INTS, VT.FLOAT32, VT.FLOAT64, VT.BOOL, VT.STRING]


@st.composite
def entries(draw):
    """``(vtype, sub_type, value)`` for GGUFWriter.add_key_value: a scalar, an array of one
    scalar type, or an array of int arrays."""
    kind = draw(st.sampled_from(["scalar", "array", "nested"]))
    t = draw(st.sampled_from(SCALAR_TYPES))
    if kind == "scalar":
        return t, None, draw(scalars(t))
    if kind == "array":
        return VT.ARRAY, t, draw(st.lists(scalars(t), min_size=1, max_size=40))
    inner = st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=5)
    return VT.ARRAY, None, draw(st.lists(inner, min_size=1, max_size=4))


@st.composite
def tensors(draw):
    """``(array, raw_dtype)`` for GGUFWriter.add_tensor, rows of whole blocks."""
    qtype = draw(st.sampled_from([QT.F32, QT.F16, QT.BF16, QT.I8, QT.I32, QT.Q4_0, QT.Q8_0]))
    rows = draw(st.integers(1, 3))
    cols = 32 * draw(st.integers(1, 3))
    lead = draw(st.sampled_from([(), (2,)]))
    values = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).standard_normal(
        (*lead, rows, cols), dtype=np.float32
    )
    if qtype in (QT.I8, QT.I32):
        dtype = np.int8 if qtype == QT.I8 else np.int32
        return (values * 50).astype(dtype), None
    if qtype in (QT.F32, QT.F16):
        return values.astype(np.float32 if qtype == QT.F32 else np.float16), None
    return gguf.quants.quantize(values, qtype), qtype


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    metadata=st.lists(entries(), max_size=6),
    arrays=st.lists(tensors(), min_size=1, max_size=4),
    alignment=st.sampled_from([None, 16, 64]),
)
def test_random_files_read_as_gguf_py_reads_them(tmp_path, metadata, arrays, alignment):
    path = tmp_path / "random.gguf"
    writer = gguf.GGUFWriter(str(path), "ftlab")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for i, (vtype, sub, value) in enumerate(metadata):
        writer.add_key_value(f"test.key{i}", value, vtype, sub_type=sub)
    for i, (array, raw) in enumerate(arrays):
        writer.add_tensor(f"t{i}", array, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_same(path)
    ours = GGUFFile(path)
    for i, (_, sub, value) in enumerate(metadata):
        if sub is None and isinstance(value, list):  # arrays of arrays, as written
            assert plain(ours.value(f"test.key{i}")[2]) == value


def test_field_value_kinds(tmp_path):
    path = tmp_path / "kinds.gguf"
    writer = gguf.GGUFWriter(str(path), "ftlab")
    writer.add_array("a.bools", [True, False, True])
    writer.add_float32("a.eps", 1e-6)
    writer.add_uint64("a.big", 2**64 - 1)
    writer.add_key_value("a.bad", b"\xff\xfe", VT.STRING)
    writer.add_tensor("t", np.zeros((1, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = open_gguf(path)
    assert field_value(f, "a.bools", "bool[]") == [True, False, True]
    assert field_value(f, "a.eps", "float") == 1e-06  # the shortest decimal, not 9.99999997e-07
    assert field_value(f, "a.big", "int") == 2**64 - 1
    assert field_value(f, "general.architecture", "str") == "ftlab"
    assert field_value(f, "a.absent", "int") is None
    assert "a.bools" in f and "a.absent" not in f
    with pytest.raises(GGUFError, match=r"metadata 'a.bools' must be an array of integers"):
        field_value(f, "a.bools", "int[]")
    with pytest.raises(GGUFError, match=r"metadata 'a.eps' must be an integer, got FLOAT32"):
        field_value(f, "a.eps", "int")
    with pytest.raises(GGUFError, match=r"metadata 'a.bad': the string is not valid UTF-8"):
        field_value(f, "a.bad", "str")


@pytest.mark.parametrize(
    "name", ["tiny-qwen3-moe", "tiny-qwen35-moe", "tiny-qwen3-next"], ids=lambda n: n
)
def test_a_load_parses_its_file_once(monkeypatch, name):
    """Pipeline.load reads the header (architecture, config, tensors, tokenizer) from one
    parse: read_layout, which every GGUFFile starts with, runs once."""
    tiny.ensure(name)  # built (and its files written) before the count starts
    calls = []
    real = gguf_structure.read_layout

    def counted(path):
        calls.append(Path(path))
        return real(path)

    monkeypatch.setattr(gguf_structure, "read_layout", counted)
    monkeypatch.setattr("ftlab.formats.gguf_read.read_layout", counted)
    pipe = Pipeline.load(name, quant="q4_0")
    assert len(calls) == 1 and calls[0].suffix == ".gguf", calls
    assert pipe.tokenizer.decode(pipe.tokenizer.encode("hello")) == "hello"

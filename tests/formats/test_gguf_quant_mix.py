"""A GGUF file never fails for its quantization mix alone: the packed types ftlab knows load
as QuantWeight (zero-copy, written back byte for byte), every other type gguf-py can
dequantize loads dequantized, a model runs what has no matmul kernel dense (one warning naming
it; Q8_0 and the K-quants stay packed), and a model from such a file computes what its
dequantized weights say."""

import gguf
import numpy as np
import pytest
import torch

from ftlab import ops
from ftlab.formats.gguf import GGUFError, open_gguf, read_tensors
from ftlab.formats.gguf_write import Blocks, write_tensors
from ftlab.models import tiny
from ftlab.models.loader import DequantizedWarning, load_gguf, save_gguf
from ftlab.models.qwen3_moe import LayerWeights, ModelWeights, Qwen3Moe
from ftlab.quant import QTYPES, Q4_0Weight, QuantWeight

QT = gguf.GGMLQuantizationType
# gguf-py quantizes these; the K-quants and IQ types it only dequantizes
QUANTIZABLE = [QT.Q8_0, QT.Q4_1, QT.Q5_0, QT.Q5_1]
DEQUANT_ONLY = [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_NL, QT.IQ4_XS]


def _blocks(qtype, rows: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if qtype in QUANTIZABLE:
        return gguf.quants.quantize(rng.standard_normal((rows, k)).astype(np.float32), qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return rng.integers(0, 256, (rows, k // block * size), dtype=np.uint8)  # any bytes are blocks


@pytest.mark.parametrize("qtype", QUANTIZABLE + DEQUANT_ONLY, ids=lambda q: q.name)
def test_every_type_loads_as_gguf_py_dequantizes_it(tmp_path, qtype):
    data = _blocks(qtype, 3, 512, seed=int(qtype))
    path = write_tensors(tmp_path / "t.gguf", {"w": Blocks(data, qtype), "norm": torch.ones(8)})
    got = read_tensors(path)["w"]
    want = torch.from_numpy(gguf.quants.dequantize(data, qtype).astype(np.float32))
    if qtype.name in QTYPES:  # packed, zero-copy; ftlab's dequantize gives gguf-py's values
        assert isinstance(got, QuantWeight) and got.qtype == qtype.name and got.shape == (3, 512)
        again = write_tensors(tmp_path / "again.gguf", {"w": got, "norm": torch.ones(8)})
        assert again.read_bytes() == path.read_bytes()  # written back byte for byte
        got = ops.dequantize(got, backend="reference")
    assert got.dtype == torch.float32 and got.shape == (3, 512)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_a_type_gguf_py_cannot_dequantize_is_named(tmp_path):
    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "ftlab")
    writer.add_tensor("ids", np.arange(8, dtype=np.int32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        GGUFError, match=r"tensor 'ids' has type I32, which neither ftlab nor gguf-py can"
    ):
        read_tensors(path)


MIX = {
    "output.weight": QT.Q8_0,
    "blk.0.attn_v.weight": QT.Q5_0,
    "blk.1.ffn_down_exps.weight": QT.Q4_1,
}


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory):
    """The tiny model's Q4_0 file with llama.cpp-like exceptions: output in Q8_0, one v
    projection in Q5_0, and one layer's down bank in Q4_1 (its gate/up banks stay Q4_0)."""
    root = tiny.ensure("tiny-qwen3-moe")
    config, weights = load_gguf(root / "model-q4_0.gguf", dtype=torch.float32, progress=False)
    meta = {k: v for k, v in _tokenizer_meta(root / "model-q4_0.gguf").items()}
    return save_gguf(
        tmp_path_factory.mktemp("mix") / "mix.gguf", config, weights, metadata=meta, types=MIX
    )


def _tokenizer_meta(path) -> dict:
    from ftlab.models.tokenizer import Tokenizer, gguf_metadata

    return gguf_metadata(Tokenizer.from_gguf(open_gguf(path)).backend)


def test_the_mix_loads_with_one_warning_naming_the_tensors(mixed_file):
    with pytest.warns(DequantizedWarning) as caught:
        config, weights = load_gguf(mixed_file, dtype=torch.float32, progress=False)
    assert len(caught) == 1
    text = str(caught[0].message)
    for name, qtype in MIX.items():  # the Q8_0 output has a kernel: not named
        assert (f"{qtype.name}: {name}" in text) == (qtype != QT.Q8_0), text
    assert (
        "banks beside another type: blk.1.ffn_gate_exps.weight, blk.1.ffn_up_exps.weight" in text
    ), text
    assert isinstance(weights.layers[0].w_down, Q4_0Weight)  # an all-Q4_0 layer stays packed
    layer1 = weights.layers[1]  # Q4_0 gate/up with a dequantized down: the layer runs dense
    assert isinstance(layer1.w_gate_up, torch.Tensor) and isinstance(layer1.w_down, torch.Tensor)
    assert isinstance(weights.lm_head, QuantWeight) and weights.lm_head.qtype == "Q8_0"
    assert isinstance(weights.layers[0].q_proj, Q4_0Weight)


def _dense(t):
    if isinstance(t, Q4_0Weight):
        return ops.dequantize_q4_0(t)
    return ops.dequantize(t) if isinstance(t, QuantWeight) else t


def test_the_mix_computes_what_its_dequantized_weights_say(mixed_file):
    """The model of the mixed file against one built from every tensor dequantized by gguf-py
    (reference backends, fp32; 11 tokens: the Q4_0 weights take the reference's dequant path)."""
    with pytest.warns(DequantizedWarning):
        config, weights = load_gguf(mixed_file, dtype=torch.float32, progress=False)
    raw = {t.name: t for t in open_gguf(mixed_file).tensors}

    def ggml(name: str) -> torch.Tensor:
        t = raw[name]
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        return torch.from_numpy(values).reshape(tuple(int(d) for d in reversed(t.shape.tolist())))

    for name in MIX:  # the dequantized tensors are gguf-py's values exactly
        i = int(name.split(".")[1]) if name.startswith("blk.") else None
        got = (
            weights.lm_head
            if i is None
            else (weights.layers[i].v_proj if "attn_v" in name else weights.layers[i].w_down)
        )
        torch.testing.assert_close(_dense(got), ggml(name), rtol=0, atol=0)
    dense = ModelWeights(
        _dense(weights.embed),
        [
            LayerWeights(**{f: _dense(getattr(lw, f)) for f in lw.__dataclass_fields__})
            for lw in weights.layers
        ],
        _dense(weights.norm),
        _dense(weights.lm_head),
    )
    tokens = torch.randint(
        0, config.vocab_size, (1, 11), generator=torch.Generator().manual_seed(3)
    )
    positions = torch.arange(11)[None]
    got = Qwen3Moe(config, weights, backends="reference").forward(tokens, positions)
    want = Qwen3Moe(config, dense, backends="reference").forward(tokens, positions)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

"""GGUF files llama.cpp's own converter wrote (tests/data/llama_cpp/converted-*.gguf, made by
``make_converted.py`` there): one small checkpoint of each family converted to BF16 by
``convert_hf_to_gguf.py``, then quantized to Q4_K_M by ``llama-quantize``, with
``llama-tokenize``'s ids of a text in each (converted.json).

- ftlab's tokenizer, read from each file, gives llama-tokenize's ids, and the HF tokenizer's;
- the BF16 file computes what the HF checkpoint computes (its weights are bf16-exact: only fp32
  rounding between two loaders' orders separates them);
- the Q4_K_M file (llama.cpp's mix: Q4_K, Q6_K, and Q5_0 / Q5_1 / Q8_0 where a row is no multiple
  of 256) computes what its weights dequantized by gguf-py compute.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGUFValueType as VT

from ftlab.models.pipeline import Pipeline

DATA = Path(__file__).resolve().parent.parent / "data" / "llama_cpp"
RECORD = json.loads((DATA / "converted.json").read_text())


def _maker():
    spec = importlib.util.spec_from_file_location("make_converted", DATA / "make_converted.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MAKER = _maker()
FAMILIES = sorted(MAKER.FAMILIES)


def _load(path, **kw) -> Pipeline:
    with warnings.catch_warnings():  # Q5_0 / Q5_1 tensors run dequantized: said, and expected
        warnings.simplefilter("ignore")
        return Pipeline.load(str(path), dtype=torch.float32, graphs=False, **kw)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("converted")
    out = {}
    for family in FAMILIES:
        digest = MAKER.checkpoint(family, root / family)
        for name, entry in RECORD["files"].items():
            if entry["family"] == family:
                assert digest == entry["checkpoint_sha256"], (
                    f"{family}: the checkpoint rebuilt here is not the one {name} was converted "
                    "from (the random weights changed): run make_converted.py again"
                )
        out[family] = root / family
    return out


@pytest.mark.parametrize("name", sorted(RECORD["files"]))
def test_each_file_tokenizes_as_llama_tokenize_did(name, checkpoints):
    from tokenizers import Tokenizer

    entry = RECORD["files"][name]
    pipe = _load(DATA / name)
    ids = pipe.tokenizer.encode(RECORD["text"])
    assert ids == entry["llama_tokenize_ids"]
    hf = Tokenizer.from_file(str(checkpoints[entry["family"]] / "tokenizer.json"))
    assert ids == hf.encode(RECORD["text"]).ids


def _prompt(pipe: Pipeline) -> list[int]:
    return pipe.tokenizer.encode(RECORD["text"])[:40]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_bf16_file_computes_what_the_checkpoint_computes(family, checkpoints):
    hf = _load(checkpoints[family])
    conv = _load(DATA / f"converted-{family}-bf16.gguf")
    want, got = hf.prefill(_prompt(hf)), conv.prefill(_prompt(conv))
    scale = want.abs().max().item()
    assert scale > 1.0
    assert (got - want).abs().max().item() <= 1e-5 * scale


def _dequantized_copy(src: Path, dst: Path) -> Path:
    """``src`` with every tensor dequantized to F32 by gguf-py, its metadata as it was."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        w.add_key_value(
            name, f.contents(), f.types[0], f.types[-1] if f.types[0] == VT.ARRAY else None
        )
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        w.add_tensor(t.name, values.astype(np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.parametrize("family", FAMILIES)
def test_the_q4_k_m_file_computes_what_its_dequantized_weights_compute(family, tmp_path):
    src = DATA / f"converted-{family}-q4_k_m.gguf"
    types = {t.tensor_type.name for t in gguf.GGUFReader(str(src)).tensors}
    # llama.cpp's mix: Q4_K where rows are multiples of 256 (none at tiny-qwen3-moe's hidden 64),
    # its fallbacks elsewhere
    assert (
        "Q5_0" in types
        and len(types - {"F32"}) >= 3
        and (family == "qwen3moe") != ("Q4_K" in types)
    )
    packed = _load(src, backends="reference", q4_0_path="dequant")
    dense = _load(_dequantized_copy(src, tmp_path / "f32.gguf"), backends="reference")
    want, got = dense.prefill(_prompt(dense)), packed.prefill(_prompt(packed))
    scale = want.abs().max().item()
    assert scale > 1.0
    assert (got - want).abs().max().item() <= 1e-5 * scale

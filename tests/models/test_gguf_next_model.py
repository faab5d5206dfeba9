"""Qwen3.6 (``qwen35moe``) and Qwen3-Next (``qwen3next``) GGUF files through the loader and the
pipeline: the tiny hybrid models' GGUF forms against their HF forms, llama.cpp's converter's
files (tests/data/gguf_qwen3_next) against the HF checkpoints they were made from, and files of
other architectures refused.

Logits are compared within 1e-5 relative to their largest magnitude: the GGUF files store
``A = -exp(A_log)`` and reading takes ``log(-A)`` back, a few ulps off ``A_log``; every other
value the model computes with is bit-identical (a norm's ``1 + w`` is stored as it is)."""

import shutil
import warnings
from pathlib import Path

import gguf
import pytest
import torch

from ftlab.formats import DequantizedWarning
from ftlab.formats.gguf import GGUFError
from ftlab.formats.gguf_write import write_tensors
from ftlab.models import tiny
from ftlab.models.loader import GGUF_ARCHS, gguf_architecture, load_gguf_model, load_hf
from ftlab.models.pipeline import Pipeline
from ftlab.models.qwen3_next import Qwen3Next, Qwen3NextConfig, read_gguf_hf, read_gguf_tokenizer
from ftlab.models.qwen3_next.tiny import fused_state, hybrid_weights
from ftlab.quant import Q4_0Weight

HYBRID = ["tiny-qwen35-moe", "tiny-qwen3-next"]
DATA = Path(__file__).parent.parent / "data" / "gguf_qwen3_next"
FIXTURES = ["qwen35moe-hv2", "qwen35moe-hv1", "qwen3next-hv2"]
PROMPT = "The router sends every token to a few experts"
QT = gguf.GGMLQuantizationType


pytestmark = pytest.mark.usefixtures("module_cache_dir")  # tiny models built in a fresh cache


def assert_same_logits(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def assert_same_model(a: Pipeline, b: Pipeline, tokens: int = 8) -> None:
    """The same prompt ids, next-token logits and greedy continuation."""
    ids = a.tokenizer.encode(PROMPT)
    assert b.tokenizer.encode(PROMPT) == ids
    assert_same_logits(b.prefill(ids), a.prefill(ids))
    assert list(b.generate(PROMPT, max_new_tokens=tokens)) == list(
        a.generate(PROMPT, max_new_tokens=tokens)
    )


@pytest.mark.parametrize("name", HYBRID)
def test_tiny_f32_gguf_reads_back_the_checkpoint(name):
    """The file holds the checkpoint: every tensor read back bit-identical, but the zero-centred
    norms (stored ``w + 1``: within half an ulp of 1) and ``A_log`` (stored ``-exp(A_log)`` in
    fp32: ``log`` of a value 1 ulp off is 2^-23 off, plus the result's rounding)."""
    root = tiny.ensure(name)
    assert gguf_architecture(root / "model-f32.gguf") == {"tiny-qwen35-moe": "qwen35moe"}.get(
        name, "qwen3next"
    )
    config, tensors, perms = read_gguf_hf(root / "model-f32.gguf", dtype=torch.float32)
    want = fused_state(hybrid_weights(name, tiny.VOCAB_SIZE))
    assert set(tensors) == set(want) and not perms
    for key, w in want.items():
        if key.endswith("A_log"):  # exp's fp32 rounding (1 ulp relative) is absolute in the log
            torch.testing.assert_close(tensors[key], w, rtol=2**-24, atol=2**-23)
        elif key.endswith(
            ("layernorm.weight", "q_norm.weight", "k_norm.weight", "model.norm.weight")
        ):
            assert float((tensors[key] - w).abs().max()) <= 2**-24, key
        else:
            assert torch.equal(tensors[key], w), key
    assert Qwen3NextConfig.from_hf(config) == Pipeline.load(name, quant="hf").config


@pytest.mark.parametrize("name", HYBRID)
def test_tiny_f32_gguf_form_equals_hf_form(name):
    hf = Pipeline.load(name, quant="hf", backends="reference")
    f32 = Pipeline.load(name, quant="f32", backends="reference")
    assert isinstance(f32.model, Qwen3Next) and f32.config == hf.config
    assert f32.tokenizer.eos_token_id == hf.tokenizer.eos_token_id
    assert_same_model(hf, f32)


@pytest.mark.parametrize("name", HYBRID)
def test_tiny_q4_0_gguf_form_runs_and_generates(name):
    """Matmul weights Q4_0 in the file (the embedding, routers and conv kernel float), packed in
    the model; greedy generation is deterministic."""
    path = tiny.ensure(name) / "model-q4_0.gguf"
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.0.ssm_out.weight"] == QT.Q4_0
    assert types["token_embd.weight"] == types["blk.0.ssm_conv1d.weight"] == QT.F32
    pipe = Pipeline.load(name, quant="q4_0")
    moe = pipe.weights.layers[0].moe
    assert isinstance(moe.w_gate_up, Q4_0Weight) and isinstance(moe.shared_down, Q4_0Weight)
    pieces = list(pipe.generate(PROMPT, max_new_tokens=3))
    assert 1 <= len(pieces) <= 3 and pieces == list(pipe.generate(PROMPT, max_new_tokens=3))


def _hf_reference(name: str, tmp_path: Path) -> Path:
    """A HF directory of a fixture's checkpoint (its config.json and safetensors)."""
    shutil.copy(DATA / f"{name}.json", tmp_path / "config.json")
    shutil.copy(DATA / f"{name}.safetensors", tmp_path / "model.safetensors")
    return tmp_path


@pytest.mark.parametrize("name", FIXTURES)
def test_converter_files_give_the_logits_of_their_checkpoints(name, tmp_path):
    gguf_pipe = Pipeline.load(DATA / f"{name}.gguf", backends="reference")
    config, weights = load_hf(_hf_reference(name, tmp_path), dtype=torch.float32, progress=False)
    hf_pipe = Pipeline(
        config, weights, read_gguf_tokenizer(DATA / f"{name}.gguf"), backends="reference"
    )
    assert gguf_pipe.config == hf_pipe.config
    assert_same_model(hf_pipe, gguf_pipe)


@pytest.mark.parametrize("name", ["qwen35moe-hv2-q4_0", "qwen35moe-hv2-q4_k_m"])
def test_llama_quantize_files_run(name):
    """llama-quantize's files of a fixture: Q4_0 stays packed; Q4_K_M's Q5_0 (no ftlab kernel)
    loads dense with a DequantizedWarning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config, weights, tokenizer = load_gguf_model(
            DATA / f"{name}.gguf", dtype=torch.float32, progress=False
        )
    assert [w.category for w in caught] == ([DequantizedWarning] if name.endswith("q4_k_m") else [])
    assert isinstance(weights.layers[0].moe.w_gate_up, Q4_0Weight) == name.endswith("q4_0")
    pipe = Pipeline(config, weights, tokenizer, backends="reference")
    assert torch.isfinite(pipe.prefill(pipe.tokenizer.encode(PROMPT))).all()


def test_other_architectures_are_refused(tmp_path):
    path = write_tensors(
        tmp_path / "llama.gguf", {"token_embd.weight": torch.zeros(8, 32)}, arch="llama"
    )
    for load in (lambda: load_gguf_model(path), lambda: Pipeline.load(path)):
        with pytest.raises(GGUFError) as e:
            load()
        message = str(e.value)
        assert str(path) in message and "'llama'" in message, message
        assert all(arch in message for arch in GGUF_ARCHS), message


@pytest.mark.gpu
@pytest.mark.parametrize("name", HYBRID)
def test_tiny_gguf_forms_on_gpu(name):
    """On the GPU (default backends, eager): the f32 GGUF form equals the HF form as on the CPU,
    and the Q4_0 form, read onto the device packed, generates."""
    hf = Pipeline.load(name, "cuda", quant="hf", graphs=False)
    f32 = Pipeline.load(name, "cuda", quant="f32", graphs=False)
    assert f32.weights.embed.device.type == "cuda"
    assert_same_model(hf, f32)
    q4 = Pipeline.load(name, "cuda", quant="q4_0")
    assert isinstance(q4.weights.layers[0].moe.w_gate_up, Q4_0Weight)
    assert q4.weights.layers[0].moe.w_gate_up.data.device.type == "cuda"
    assert 1 <= len(list(q4.generate(PROMPT, max_new_tokens=8))) <= 8

"""The accuracy gate of the shipped trained models (CI, CPU): ftlab's perplexity of each on a
slice of its held-out text equals the figure transformers produced
(``ftlab/models/trained/reference.json``, written by ``benchmarks/trained_reference.py``) within
1e-4 relative, with the reference backend and with Triton (its interpreter on the CPU); and the
trained Qwen3-MoE predicts the text far better than chance."""

import json

import pytest
import torch

from ftlab import eval as fteval
from ftlab.models.pipeline import Pipeline
from ftlab.models.trained import ROOT, TRAINED_MODELS, held_out_text

REFERENCE = ROOT / "reference.json"
pytestmark = pytest.mark.skipif(not TRAINED_MODELS, reason="no trained model is shipped here")


def _figures() -> dict:
    return json.loads(REFERENCE.read_text()) if REFERENCE.is_file() else {}


def test_every_shipped_model_has_its_transformers_figure():
    assert sorted(_figures()) == sorted(TRAINED_MODELS)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("name", sorted(TRAINED_MODELS))
def test_perplexity_equals_the_transformers_figure(name, backend):
    want = _figures()[name]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    pipe = Pipeline.load(
        name, device, quant="hf", dtype=torch.float32, max_seq_len=want["ctx"], backends=backend
    )
    text = held_out_text()[: want["chars"]]
    if backend == "triton" and device == "cpu":  # the interpreter: the first two windows
        ids = pipe.tokenizer.encode(text)[: 2 * want["ctx"]]
        got = fteval.evaluate(pipe, ids, ctx=want["ctx"], progress=False)
        assert got.perplexity == pytest.approx(want["perplexity_first_two_windows"], rel=1e-4)
        return
    got = fteval.evaluate(pipe, text, ctx=want["ctx"], progress=False)
    assert (got.windows, got.tokens) == (want["windows"], want["tokens"])
    assert got.perplexity == pytest.approx(want["perplexity"], rel=1e-4)
    vocab = pipe.config.vocab_size
    assert got.perplexity < vocab / 10  # trained: far from a uniform guess

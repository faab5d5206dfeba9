"""The trained models' shipped form (``ftlab.models.trained``, made by
``benchmarks/train_tiny.py``): expert banks stored as rank-r factors, expanded into a HF
checkpoint and GGUF files that transformers and ftlab read as the same model, on every family;
the three models' weights within the repository's 30 MB; the training text's held-out split."""

import importlib.util
from pathlib import Path

import pytest
import torch

from ftlab.models import trained
from ftlab.models.pipeline import Pipeline

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("train_tiny", ROOT / "benchmarks" / "train_tiny.py")
train_tiny = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_tiny)


def shipped(family: str, out: Path) -> Path:
    """A model of ``family`` as train_tiny ships it (its initial weights, the expert factors
    drawn), with a small byte-level tokenizer."""
    tok = train_tiny.train_tokenizer(["The router sends every token to its experts. " * 20])
    config, model = train_tiny.build(family, tok.get_vocab_size(), seed=1)
    src = out / train_tiny.FAMILIES[family][0]
    src.mkdir(parents=True)
    from safetensors.torch import save_file

    state = train_tiny.shipped_state(model)
    assert any(k.endswith("experts.gate_up_proj.lr_a") for k in state)
    assert not any("parametrizations" in k or k.endswith(".original") for k in state)
    save_file(state, str(src / "weights.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(src)
    tok.save(str(src / "tokenizer.json"))
    return src


@pytest.mark.parametrize("family", sorted(train_tiny.FAMILIES))
def test_the_expanded_model_is_one_model_in_transformers_and_ftlab(family, tmp_path):
    src = shipped(family, tmp_path / "src")
    out = tmp_path / "files"
    out.mkdir()
    trained.write_files(src, out)
    # the expert banks multiplied out: per-expert tensors of the checkpoint, the factors gone
    config, weights = trained.checkpoint(src)
    text = config.get("text_config", config)
    assert sum(".experts.0.gate_proj.weight" in k for k in weights) == text["num_hidden_layers"]
    assert not any(k.endswith((".lr_a", ".lr_b")) for k in weights)
    ids = list(range(3, 40))
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0, -1]
    for path in (out, out / "model-f32.gguf"):
        got = Pipeline.load(str(path)).prefill(ids)
        assert torch.allclose(got, want, atol=1e-4 * want.abs().max(), rtol=0), path
    # the tokenizer in the GGUF file is the shipped one
    from tokenizers import Tokenizer

    pipe = Pipeline.load(str(out / "model-q4_0.gguf"))
    text = "The router sends every token"
    assert (
        pipe.tokenizer.encode(text)
        == Tokenizer.from_file(str(src / "tokenizer.json")).encode(text).ids
    )


def test_the_three_models_fit_the_repositorys_30_mb():
    total = 0
    for family in train_tiny.FAMILIES:
        _, model = train_tiny.build(family, train_tiny.VOCAB, seed=0)
        total += sum(t.numel() * t.element_size() for t in train_tiny.shipped_state(model).values())
        c = model.config
        assert c.num_hidden_layers >= 4 and c.num_experts >= 16 and c.hidden_size >= 256
        assert c.moe_intermediate_size % 256 == 0 and c.hidden_size % 256 == 0
    assert total <= 30e6, total


def test_the_held_out_split_is_apart_from_the_training_text():
    from ftlab.models.trained import corpus

    train, held = corpus()
    assert len(held) >= 20 and len(train) > 10 * len(held)
    assert not set(held) & set(train)

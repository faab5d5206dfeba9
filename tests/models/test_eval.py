"""ftlab.eval: perplexity counted as llama-perplexity counts it (second half of each window),
equal to transformers' on the same windows for every model family (fp32, CPU); KL divergence,
top-1 agreement and Δp against a reference; the refusals; ``ftlab eval``."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from ftlab import cli
from ftlab import eval as fteval
from ftlab.models import tiny
from ftlab.models.pipeline import Pipeline

transformers = pytest.importorskip("transformers")

MODELS = ["tiny-qwen3-moe", "tiny-qwen35-moe", "tiny-qwen3-next"]
TEXT = (
    "The router sends every token to its experts; the experts compute, the router weighs them, "
    "and the sum goes on to the next layer. "
) * 6


class Uniform:
    """A stand-in pipeline whose every prediction is uniform over ``vocab`` tokens."""

    def __init__(self, vocab: int, max_seq_len: int = 64):
        self.config = SimpleNamespace(vocab_size=vocab)
        self.device, self.max_seq_len = torch.device("cpu"), max_seq_len
        self.model = SimpleNamespace(
            forward=lambda tokens, positions: torch.zeros(1, tokens.shape[1], vocab),
            end_step=lambda: None,
        )

    def reset(self):
        pass


def test_a_uniform_model_has_the_vocabulary_as_perplexity():
    result = fteval.evaluate(Uniform(50), list(range(40)) * 2, ctx=16, progress=False)
    # 80 tokens: 5 windows of 16, positions 8..14 of each predict tokens 9..15
    assert (result.windows, result.tokens) == (5, 5 * 7)
    assert result.perplexity == pytest.approx(50) and result.nll == pytest.approx(math.log(50))
    assert result.per_window == pytest.approx([50] * 5) and result.kl_divergence is None


@pytest.mark.parametrize("name", MODELS)
def test_perplexity_equals_transformers(name):
    """The same windows through transformers' model of the same HF directory: the perplexity
    within 1e-4 relative (fp32)."""
    pipe = Pipeline.load(name, quant="hf", max_seq_len=32)
    ours = fteval.evaluate(pipe, TEXT, ctx=32, progress=False)
    oracle = transformers.AutoModelForCausalLM.from_pretrained(tiny.ensure(name)).eval()
    nll, count = 0.0, 0
    for window in fteval.windows(pipe.tokenizer.encode(TEXT), 32):
        with torch.no_grad():
            logits = oracle(window[None]).logits[0].double()
        logp = torch.log_softmax(logits[16:-1], -1)
        nll -= float(logp.gather(-1, window[17:, None]).sum())
        count += 15
    assert ours.tokens == count and ours.windows >= 2
    assert ours.perplexity == pytest.approx(math.exp(nll / count), rel=1e-4)


def test_against_a_reference():
    f32 = Pipeline.load("tiny-qwen3-moe", quant="f32", max_seq_len=32)
    f32.prefill([1, 2, 3])  # a sequence under way: the evaluation ends it (its cache is reused)
    q4 = Pipeline.load("tiny-qwen3-moe", quant="q4_0", max_seq_len=32)
    same = fteval.evaluate(f32, TEXT, ctx=32, reference=f32, progress=False)
    assert f32.position == 0
    assert same.kl_divergence == pytest.approx(0, abs=1e-12) and same.top1_agreement == 1
    assert same.reference_perplexity == pytest.approx(same.perplexity)
    assert (
        set(same.delta_p) == set(fteval.PERCENTILES) and max(map(abs, same.delta_p.values())) < 1e-9
    )
    quant = fteval.evaluate(q4, TEXT, ctx=32, reference=f32, progress=False)
    assert quant.kl_divergence > 1e-6 and 0 < quant.top1_agreement <= 1
    assert quant.reference_perplexity == pytest.approx(same.perplexity)
    assert list(quant.delta_p.values()) == sorted(quant.delta_p.values())
    assert quant.token_kl is None
    each = fteval.evaluate(q4, TEXT, ctx=32, reference=f32, progress=False, per_token=True)
    assert len(each.token_kl) == each.tokens and min(each.token_kl) >= -1e-12
    assert sum(each.token_kl) / each.tokens == pytest.approx(quant.kl_divergence, rel=1e-9)


def test_refusals():
    pipe = Pipeline.load("tiny-qwen3-moe", quant="f32", max_seq_len=32)
    with pytest.raises(ValueError, match="text must hold at least one window of ctx = 32 tokens"):
        fteval.evaluate(pipe, "The router", ctx=32, progress=False)
    with pytest.raises(ValueError, match="text must be a non-empty string"):
        fteval.evaluate(pipe, "", ctx=32, progress=False)
    with pytest.raises(ValueError, match="ctx must fit the pipe's max_seq_len = 32, got 64"):
        fteval.evaluate(pipe, TEXT, ctx=64, progress=False)
    with pytest.raises(ValueError, match=r"ctx must be an int >= 4 \(half of a window"):
        fteval.evaluate(pipe, TEXT, ctx=2, progress=False)
    with pytest.raises(TypeError, match="ctx must be an int >= 4, got 8.0"):
        fteval.evaluate(pipe, TEXT, ctx=8.0, progress=False)
    with pytest.raises(ValueError, match=r"reference must have the model's vocabulary \(\d+"):
        fteval.evaluate(pipe, TEXT, ctx=16, reference=Uniform(7), progress=False)
    with pytest.raises(ValueError, match="text must be token ids in"):
        fteval.evaluate(pipe, [1, 2, 10**6], ctx=16, progress=False)


def test_the_command(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    out = tmp_path / "eval.json"
    args = ["eval", "tiny-qwen3-moe", "--text", str(text), "--ctx", "32", "--device", "cpu"]
    assert cli.main([*args, "--reference", "tiny-qwen3-moe", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "perplexity " in printed and "mean KL divergence 0.000000" in printed
    data = json.loads(out.read_text())
    assert data["model"] == "tiny-qwen3-moe" and data["ctx"] == 32 and data["perplexity"] > 1
    assert cli.main(["eval", "tiny-qwen3-moe", "--text", str(tmp_path / "none.txt")]) == 1
    assert "--text must be a text file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main([*args[:4], "--ctx", "2"])
    assert exit_.value.code == 2
    assert "ctx must be an int >= 4 (half of a window is scored), got 2" in capsys.readouterr().err

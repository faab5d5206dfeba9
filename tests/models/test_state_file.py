"""``Pipeline.save_state`` / ``load_state`` (:mod:`ftlab.models.state_file`): a state read back
continues the sequence as the pipeline that wrote it does, on every model family; a file of
another model, config, dtype or weights format is refused naming the mismatch; a truncated,
altered or hostile file is an error, never a state, and a refused file leaves the pipeline as it
was."""

import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from ftlab.models.pipeline import Pipeline
from ftlab.models.state_file import FORMAT

pytestmark = pytest.mark.usefixtures("module_cache_dir")  # tiny models built in a fresh cache

MODELS = ["tiny-qwen3-moe", "tiny-qwen35-moe", "tiny-qwen3-next"]
_PIPES: dict = {}


def written(name: str, tmp_path_factory) -> tuple[Pipeline, Path, list[int]]:
    """A pipeline of ``name`` after a prompt and two decode steps, the state file it wrote, and the
    tokens it holds (one a model)."""
    if name not in _PIPES:
        pipe = Pipeline.load(name, quant="f32", max_seq_len=64)
        logits = pipe.prefill(list(range(3, 20)))
        for _ in range(2):
            logits = pipe.decode_step(int(logits.argmax()))
        path = tmp_path_factory.mktemp("state") / f"{name}.safetensors"
        assert pipe.save_state(path) == path
        _PIPES[name] = pipe, path, pipe.tokens
    return _PIPES[name]


def snapshot(pipe: Pipeline) -> list[torch.Tensor]:
    """Everything of ``pipe``'s live state, copied."""
    rec = pipe.model.recurrent_state()
    return [t.clone() for t in (*pipe.model.cache.k, *pipe.model.cache.v, *rec)]


@pytest.mark.parametrize("name", MODELS)
def test_a_state_read_back_continues_the_sequence(name, tmp_path_factory):
    pipe, path, tokens = written(name, tmp_path_factory)
    other = Pipeline.load(name, quant="f32", max_seq_len=64)
    assert other.load_state(path) == len(tokens) == other.position
    assert other.tokens == tokens
    for token in (5, 9, 2):
        assert torch.equal(other.decode_step(token), pipe.decode_step(token))
    # a prompt that begins with the state's tokens resumes after them: its logits as computed
    fresh = Pipeline.load(name, quant="f32", max_seq_len=64, prefix_cache_bytes=0)
    reader = Pipeline.load(name, quant="f32", max_seq_len=64)
    reader.load_state(path)
    prompt = tokens + [7, 8]
    got = reader.prefill(prompt)
    assert reader.reused == len(tokens)
    want = fresh.prefill(prompt)
    assert torch.allclose(got, want, atol=1e-4 * want.abs().max(), rtol=0)


def test_what_is_refused_names_the_mismatch(tmp_path_factory):
    _, path, _ = written("tiny-qwen3-moe", tmp_path_factory)
    cases = [
        (Pipeline.load("tiny-qwen3-moe", quant="q4_0"), "weights format"),
        (Pipeline.load("tiny-qwen3-moe", dtype=torch.bfloat16), "dtype"),
        (Pipeline.load("tiny-qwen3-next"), "model class"),
    ]
    for pipe, what in cases:
        with pytest.raises(ValueError, match=f"this state is of another {what}"):
            pipe.load_state(path)
    _, next_path, _ = written("tiny-qwen3-next", tmp_path_factory)
    with pytest.raises(ValueError, match=r"another config \(arch\)"):
        Pipeline.load("tiny-qwen35-moe").load_state(next_path)
    short = Pipeline.load("tiny-qwen3-moe", max_seq_len=8)
    with pytest.raises(ValueError, match=r"position must be in \[1, 8\] \(max_seq_len\), got 19"):
        short.load_state(path)


def test_another_models_weights_are_refused(tmp_path_factory):
    """Same class, config, dtype and format; other weights (a layer norm changed)."""
    _, path, _ = written("tiny-qwen3-moe", tmp_path_factory)
    pipe = Pipeline.load("tiny-qwen3-moe")
    pipe.weights.layers[0].input_norm[0] += 1
    with pytest.raises(ValueError, match=r"another model \(its weights differ\)"):
        pipe.load_state(path)


def test_save_needs_a_sequence(tmp_path):
    pipe = Pipeline.load("tiny-qwen3-moe")
    with pytest.raises(ValueError, match="holds no sequence"):
        pipe.save_state(tmp_path / "s.safetensors")
    assert not (tmp_path / "s.safetensors").exists()
    with pytest.raises(FileNotFoundError, match="path must be a state file"):
        pipe.load_state(tmp_path / "none.safetensors")


def rewrite(path, out, tensors=None, meta=None):
    with safe_open(str(path), framework="pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
        m = dict(f.metadata())
    t.update(tensors or {})
    m.update(meta or {})
    save_file({k: v for k, v in t.items() if v is not None}, str(out), metadata=m)
    return out


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-qwen35-moe"])
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_damaged_file_is_an_error_and_changes_nothing(name, data, tmp_path_factory):
    _, path, tokens = written(name, tmp_path_factory)
    pipe = Pipeline.load(name, quant="f32", max_seq_len=64)
    pipe.prefill([4, 5, 6])
    before, held = snapshot(pipe), pipe.tokens
    raw = path.read_bytes()
    how = data.draw(st.sampled_from(["truncate", "flip", "tensor", "meta", "drop"]))
    bad = path.with_name("bad.safetensors")
    if how == "truncate":
        bad.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])
    elif how == "flip":
        b = bytearray(raw)
        b[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        bad.write_bytes(bytes(b))
    elif how == "tensor":  # a tensor of another shape, or out-of-range tokens, digest kept
        key = data.draw(st.sampled_from(["tokens", "logits", "k.0"]))
        value = {"tokens": torch.tensor([0, 10**6]), "logits": torch.zeros(3), "k.0": torch.ones(1)}
        rewrite(path, bad, tensors={key: value[key]})
    elif how == "meta":
        key = data.draw(st.sampled_from(["format", "config", "digest", "model_class"]))
        value = data.draw(st.sampled_from(["", "{}", "[1]", "ftlab.state/0", "x" * 70]))
        rewrite(path, bad, meta={key: value})
    else:
        rewrite(path, bad, tensors={"logits": None})
    try:
        pipe.load_state(bad)
        # a bit flip that changed nothing the state is made of (the header's padding) may pass:
        # then it is the written state, whole
        assert how == "flip" and pipe.tokens == tokens
        return
    except ValueError:
        pass
    assert pipe.tokens == held and pipe.position == len(held)
    assert all(torch.equal(a, b) for a, b in zip(snapshot(pipe), before, strict=True))


def test_a_state_file_is_safetensors_with_its_identity(tmp_path_factory):
    _, path, tokens = written("tiny-qwen35-moe", tmp_path_factory)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        assert f.get_tensor("tokens").tolist() == tokens
    assert meta["format"] == FORMAT and meta["model_class"] == "Qwen3Next"
    assert json.loads(meta["config"])["arch"] == "qwen3_5_moe"
    assert meta["dtype"] == "float32" and meta["weights_format"] == "float32"

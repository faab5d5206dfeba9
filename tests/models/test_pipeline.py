"""The step-by-step pipeline on the built-in tiny models (CPU)."""

import pytest
import torch

from ftlab.models import tiny
from ftlab.models.pipeline import DecodeGraph, Pipeline, backend_map, format_compare
from ftlab.models.qwen3_moe import MODEL_OPS


@pytest.fixture(scope="module", autouse=True)
def tiny_cache(tmp_path_factory, monkeypatch_module=None):
    import os

    old = os.environ.get("FTLAB_CACHE_DIR")
    os.environ["FTLAB_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("FTLAB_CACHE_DIR")
    else:
        os.environ["FTLAB_CACHE_DIR"] = old


def test_tiny_models_are_deterministic(tmp_path):
    a = tiny.ensure("tiny-qwen3-moe", tmp_path / "a")
    b = tiny.ensure("tiny-qwen3-moe", tmp_path / "b")
    for name in ("model.safetensors", "tokenizer.json", "model-q4_0.gguf"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("quant", ["hf", "f32", "q4_0"])
def test_generate_is_greedy_and_stops(quant):
    pipe = Pipeline.load("tiny-qwen3-moe", quant=quant)
    pieces = list(pipe.generate("The router sends", max_new_tokens=12))
    assert pieces == list(pipe.generate("The router sends", max_new_tokens=12))
    assert (
        1 <= len(pieces) <= 12
        and pipe.position <= len(pipe.tokenizer.encode("The router sends")) + 12
    )


def test_hf_and_gguf_f32_agree():
    hf = Pipeline.load("tiny-qwen3-moe", quant="hf")
    gg = Pipeline.load("tiny-qwen3-moe", quant="f32")
    ids = hf.tokenizer.encode("Hello world")
    assert ids == gg.tokenizer.encode("Hello world")
    assert torch.equal(hf.prefill(ids), gg.prefill(ids))


def test_decode_steps_equal_prefill():
    pipe = Pipeline.load("tiny-qwen3-moe-wide")
    ids = pipe.tokenizer.encode("Every operator has a reference")
    full = pipe.prefill(ids)
    pipe.prefill(ids[:3])
    for t in ids[3:]:
        step = pipe.decode_step(t)
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


def test_stages_cover_the_forward_pass():
    pipe = Pipeline.load("tiny-qwen3-moe")
    stages = list(pipe.stages("Hello world"))
    names = [s.name for s in stages]
    assert names[0] == "embed" and names[-2:] == ["logits", "sample"]
    assert "layer 1 router" in names and "layer 0 experts" in names
    router = next(s for s in stages if s.name == "layer 0 router")
    ids = router.tensors["ids"]
    assert ids.shape[1] == 2 and len(set(ids.flatten().tolist())) > 2, (
        "routing uses several experts"
    )
    logits = stages[-2].tensors["logits"]
    assert int(stages[-1].tensors["token"]) == int(logits[0, -1].argmax())


def test_compare_against_itself_is_zero_and_backends_are_listed():
    pipe = Pipeline.load("tiny-qwen3-moe")
    rows = pipe.compare("Hello world", backends=["reference", {"moe_experts": "reference"}])
    assert rows and all(r.max_abs == 0.0 for r in rows)
    assert "layer 0 experts" in format_compare(rows)


def test_sampling_is_seeded():
    pipe = Pipeline.load("tiny-qwen3-moe")
    a = "".join(pipe.generate("The", 10, temperature=1.0, top_p=0.9, seed=3))
    b = "".join(pipe.generate("The", 10, temperature=1.0, top_p=0.9, seed=3))
    assert a == b


def test_bad_inputs():
    with pytest.raises(ValueError, match="backends keys"):
        backend_map({"attention": "triton"})
    with pytest.raises(FileNotFoundError, match="tiny model name"):
        Pipeline.load("no-such-model")
    pipe = Pipeline.load("tiny-qwen3-moe")
    pipe.max_seq_len = 4
    with pytest.raises(ValueError, match="max_seq_len"):
        pipe.prefill(list(range(5)))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "backends, q4_0_path",
    [
        ({"index": "triton", "store": "triton"}, "dequant"),
        ({"index": "hip", "store": "hip"}, "dequant"),
        ({"q4_0_matmul": "triton"}, "dequant"),
        ({"q4_0_matmul": "triton"}, "int8"),
        ({"q4_0_matmul": "hip"}, "int8"),
        ({"route_topk": "triton", "moe_experts": "triton"}, "dequant"),
        ({"route_topk": "triton", "moe_experts": "triton"}, "int8"),
        ({"route_topk": "hip", "moe_experts": "hip"}, "int8"),
    ],
)
def test_backends_agree_with_reference_on_gpu(backends, q4_0_path):
    """Every stage of the tiny Q4_0 model on the GPU, each op set against the all-reference
    run of the same Q4_0 path (int8 paths differ from dequant ones by the Q8_1 rounding)."""
    pipe = Pipeline.load("tiny-qwen3-moe", "cuda", quant="q4_0")
    pipe.q4_0_path = q4_0_path
    # the ops not named stay on the reference, so each row measures the named ops alone
    rows = pipe.compare(
        "The router sends every token", [{**dict.fromkeys(MODEL_OPS, "reference"), **backends}]
    )
    worst = max(rows, key=lambda r: r.rel)
    assert worst.rel < 1e-4, format_compare(rows)


def test_graphs_need_a_gpu_and_a_static_model():
    with pytest.raises(ValueError, match="graphs=True needs a CUDA or ROCm device"):
        Pipeline.load("tiny-qwen3-moe", "cpu", graphs=True)
    pipe = Pipeline.load("tiny-qwen3-moe", "cpu")
    with pytest.raises(ValueError, match="static=True"):
        DecodeGraph(pipe.model, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["q4_0", "f32"])
def test_graph_decode_generates_what_eager_does_gpu(quant):
    """The graph-captured decode step (static model) against the eager one (dynamic model):
    the same greedy text, and next-token logits within fp32 rounding of each other."""
    prompt = "The router sends every token"
    eager = Pipeline.load("tiny-qwen3-moe", "cuda", quant=quant)
    graphed = Pipeline.load("tiny-qwen3-moe", "cuda", quant=quant, graphs=True)
    assert "".join(graphed.generate(prompt, 24)) == "".join(eager.generate(prompt, 24))
    ids = eager.tokenizer.encode(prompt)
    a, b = eager.prefill(ids), graphed.prefill(ids)
    for step in range(16):
        token = int(a.argmax())
        a, b = eager.decode_step(token), graphed.decode_step(token)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=f"step {step}")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_decode_graph_replays_equal_eager_gpu(batch):
    """DecodeGraph replays, with new tokens and positions each time, equal the static model's
    eager forward bit for bit (the same kernels on the same inputs)."""
    from ftlab.models.qwen3_moe import Qwen3Moe

    pipe = Pipeline.load("tiny-qwen3-moe", "cuda", quant="q4_0")
    model = Qwen3Moe(pipe.config, pipe.weights, max_batch=8, max_seq_len=64, static=True)
    graph = DecodeGraph(model, batch)
    gen = torch.Generator(device="cuda").manual_seed(batch)
    for _ in range(30):
        tokens = torch.randint(0, pipe.config.vocab_size, (batch, 1), device="cuda", generator=gen)
        positions = torch.randint(0, 63, (batch, 1), device="cuda", generator=gen)
        replayed = graph(tokens, positions).clone()
        assert torch.equal(replayed, model.forward(tokens, positions))


def _hybrid_against_base(device: str, quant: str, graphs: bool, steps: int = 16) -> tuple[Pipeline, list[float]]:
    """A hybrid pipeline (half the experts of each layer in device slots, the rest on the CPU)
    against the plain one, both on the int8 path: the same greedy tokens, and each step's
    next-token logits with their max-abs difference."""
    base = Pipeline.load("tiny-qwen3-moe", device, quant=quant, q4_0_path="int8", graphs=graphs)
    hyb = Pipeline.load("tiny-qwen3-moe", device, quant=quant, q4_0_path="int8", graphs=graphs, hybrid_slots=4)
    ids = base.tokenizer.encode("The router sends every token")
    a, b = base.prefill(ids), hyb.prefill(ids)
    diffs = [float((a - b).abs().max())]
    for _ in range(steps):
        token = int(a.argmax())
        assert int(b.argmax()) == token
        a, b = base.decode_step(token), hyb.decode_step(token)
        diffs.append(float((a - b).abs().max()))
    return hyb, diffs


@pytest.mark.parametrize("quant", ["f32", "q4_0"])
def test_hybrid_experts_decode_like_the_plain_model(quant):
    """CPU: the hybrid layers (GPU part simulated on the CPU, CPU part the native kernels)
    decode what the plain model does, logits within fp32 rounding, while the residency moves."""
    hyb, diffs = _hybrid_against_base("cpu", quant, graphs=False)
    assert max(diffs) <= 1e-4, diffs
    for ex in hyb.hybrid:
        assert ex.mechanism == "eager" and len(ex.policy.resident()) <= 4
        assert ex.policy.hits > 0 and ex.policy.misses > 0


def test_hybrid_slots_must_fit():
    with pytest.raises(ValueError, match="hybrid_slots must be an int in"):
        Pipeline.load("tiny-qwen3-moe", "cpu", hybrid_slots=9)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["f32", "q4_0"])
def test_hybrid_graph_decode_like_the_plain_model_gpu(quant):
    """GPU: the decode step with hybrid layers is captured in one graph (every layer's
    handshake passed its probe) and decodes what the plain graph-captured model does."""
    hyb, diffs = _hybrid_against_base("cuda", quant, graphs=True, steps=24)
    assert hyb.graph_capturable and hyb._graph is not None
    assert max(diffs) <= 1e-4, diffs
    for ex in hyb.hybrid:
        ex.check()
        assert ex.policy.hits > 0 and ex.policy.misses > 0

"""The step-by-step pipeline on the built-in tiny models (CPU): what it computes, eager and (on a
GPU) graph-captured. Its argument checks: test_pipeline_arguments.py."""

import pytest
import torch

from ftlab.models import tiny
from ftlab.models.pipeline import DecodeGraph, Pipeline, format_compare
from ftlab.models.pipeline_args import MODEL_OPS

pytestmark = pytest.mark.usefixtures("module_cache_dir")  # tiny models built in a fresh cache


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
    tokens, pos = torch.tensor([ids]), torch.arange(len(ids))[None]
    assert torch.equal(hf.model.forward(tokens, pos), gg.model.forward(tokens, pos))
    # prefill's lm_head takes the last row only: the CPU BLAS's one-row kernel depends on the
    # weight's alignment (the two loads hold equal weights at addresses 8 and 0 mod 64), which
    # may sum the same products in another order
    torch.testing.assert_close(hf.prefill(ids), gg.prefill(ids), rtol=1e-6, atol=1e-6)


def test_decode_steps_equal_prefill():
    pipe = Pipeline.load("tiny-qwen3-moe-wide")
    ids = pipe.tokenizer.encode("Every operator has a reference")
    full = pipe.prefill(ids)
    pipe.prefill(ids[:3])
    for t in ids[3:]:
        step = pipe.decode_step(t)
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_decode_attention_op_equals_sdpa(backend):
    """Decode steps through ops.decode_attention (named in the backends map) give the logits of
    torch's SDPA over the masked cache (the "auto" path) within the fp32 logits gate the models
    meet against transformers (1e-4: both attentions are fp32, summed in other orders, and four
    layers carry the difference); the prefill (SDPA in both) is identical."""
    sdpa = Pipeline.load("tiny-qwen3-moe-wide")
    op = Pipeline.load("tiny-qwen3-moe-wide", backends={"decode_attention": backend})
    ids = sdpa.tokenizer.encode("Every operator has a reference")
    torch.testing.assert_close(op.prefill(ids[:3]), sdpa.prefill(ids[:3]), rtol=0, atol=0)
    for t in ids[3:]:
        torch.testing.assert_close(op.decode_step(t), sdpa.decode_step(t), rtol=0, atol=1e-4)


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


def test_decode_is_eager_on_the_cpu_by_default():
    """graphs="auto": captured on a CUDA/ROCm device, eager on the CPU; False opts out."""
    assert Pipeline.load("tiny-qwen3-moe", "cpu").graphs is False
    assert Pipeline.load("tiny-qwen3-moe", "cpu", graphs=False).graph_capturable is False


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


@pytest.mark.gpu
@pytest.mark.parametrize(
    "backends", ["reference", {"moe_experts": "reference"}, {"store": "reference"}]
)
def test_reference_backends_decode_eagerly_by_default_gpu(backends):
    """The reference reads tensors on the host, which a graph capture forbids: with it on any op,
    graphs="auto" decodes eagerly (and gives the text the all-triton graph gives), and
    graphs=True is refused naming the op."""
    prompt = "The router sends every token"
    pipe = Pipeline.load("tiny-qwen3-moe", "cuda", quant="f32", backends=backends)
    assert not pipe.graphs and not pipe.graph_capturable
    graphed = Pipeline.load("tiny-qwen3-moe", "cuda", quant="f32", backends="triton")
    assert graphed.graph_capturable
    assert "".join(pipe.generate(prompt, 12)) == "".join(graphed.generate(prompt, 12))
    with pytest.raises(
        ValueError, match=r"graphs=True: .*\(reference\) cannot run inside a graph capture"
    ):
        Pipeline.load("tiny-qwen3-moe", "cuda", quant="f32", backends=backends, graphs=True)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["q4_0", "f32"])
def test_graph_decode_generates_what_eager_does_gpu(quant):
    """The graph-captured decode step (static model; the default on a GPU) against the eager one
    (dynamic model, graphs=False with launches=False): the same greedy text, and next-token logits
    within fp32 rounding of each other."""
    prompt = "The router sends every token"
    eager = Pipeline.load("tiny-qwen3-moe", "cuda", quant=quant, graphs=False, launches=False)
    assert eager.decode_path == "eager" and not eager.model.static
    # graphs="auto": captured on a GPU
    graphed = Pipeline.load("tiny-qwen3-moe", "cuda", quant=quant)
    assert graphed.graph_capturable and not eager.graph_capturable
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

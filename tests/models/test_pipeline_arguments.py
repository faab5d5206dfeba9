"""The step-by-step pipeline's argument checks on the built-in tiny models (CPU): every entry
point (Pipeline.load, the constructor, generate, prefill, decode_step, compare, stages,
DecodeGraph) refuses a bad argument up front, naming it, what was expected and what came; the
boundary values are accepted."""

import re

import numpy as np
import pytest
import torch

from ftlab import backends as ftbackends
from ftlab.models import tiny
from ftlab.models.pipeline import DecodeGraph, Pipeline, backend_map

pytestmark = pytest.mark.usefixtures("module_cache_dir")  # tiny models built in a fresh cache


def test_bad_inputs():
    with pytest.raises(ValueError, match="backends keys"):
        backend_map({"attention": "triton"})
    with pytest.raises(FileNotFoundError, match="tiny model name"):
        Pipeline.load("no-such-model")
    pipe = Pipeline.load("tiny-qwen3-moe")
    pipe.max_seq_len = 4
    with pytest.raises(ValueError, match="max_seq_len"):
        pipe.prefill(list(range(5)))


@pytest.fixture(scope="module")
def pipe():
    return Pipeline.load("tiny-qwen3-moe")


LOAD_ERRORS = [
    (
        dict(backends="cuda"),
        ValueError,
        "backends must be 'auto', one of ['reference', 'triton', 'hip'] (every op) "
        "or a dict {op: backend}, got 'cuda'",
    ),
    (
        dict(backends={"moe_experts": "nope"}),
        ValueError,
        "backends['moe_experts'] must be 'auto' or one of "
        f"{ftbackends.backends_of('moe_experts')}, got 'nope'",
    ),
    (dict(backends={"attention": "triton"}), ValueError, "backends keys must be op names among"),
    (
        dict(backends=["triton"]),
        TypeError,
        "backends must be a backend name or a dict {op: backend}, got list",
    ),
    (
        dict(dtype="bf16"),
        TypeError,
        "dtype must be a torch.dtype (torch.float32, torch.float16, torch.bfloat16), "
        "got 'bf16' (str)",
    ),
    (
        dict(dtype=torch.int8),
        ValueError,
        "dtype must be one of torch.float32, torch.float16, torch.bfloat16, got torch.int8",
    ),
    (dict(quant="q8_0"), ValueError, "quant must be one of ['hf', 'f32', 'q4_0'], got 'q8_0'"),
    (dict(max_seq_len=0), ValueError, "max_seq_len must be an int >= 1, got 0"),
    (dict(max_seq_len=-3), ValueError, "max_seq_len must be an int >= 1, got -3"),
    (dict(max_seq_len=64.0), TypeError, "max_seq_len must be an int >= 1, got 64.0 (float)"),
    (dict(max_seq_len=True), TypeError, "max_seq_len must be an int >= 1, got True (bool)"),
    (dict(device="gpu0"), ValueError, "device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu0'"),
    (
        dict(device="meta"),
        ValueError,
        "device must be a CPU or CUDA/ROCm device ('cpu', 'cuda', 'cuda:N'), got 'meta'",
    ),
    (dict(device=0.5), TypeError, "device must be a str or torch.device, got 0.5 (float)"),
    (dict(graphs="yes"), TypeError, "graphs must be 'auto', True or False, got 'yes'"),
    (
        dict(graphs=True),
        ValueError,
        "graphs=True needs a CUDA or ROCm device, the weights are on cpu",
    ),
    (dict(hybrid_slots=-1), ValueError, "hybrid_slots must be an int >= 0, got -1"),
    (dict(hybrid_slots=2.0), TypeError, "hybrid_slots must be an int >= 0, got 2.0 (float)"),
    (
        dict(q4_0_path="fp8"),
        ValueError,
        "q4_0_path must be one of ['auto', 'int8', 'dequant'], got 'fp8'",
    ),
    (
        dict(path_or_tiny=None),
        TypeError,
        "path_or_tiny must be a tiny model name or a path, got NoneType",
    ),
    (
        dict(path_or_tiny="/nonexistent.gguf"),
        FileNotFoundError,
        "'/nonexistent.gguf' is none of these",
    ),
]


@pytest.mark.parametrize(
    "kwargs, error, message", LOAD_ERRORS, ids=[str(k) for k, _, _ in LOAD_ERRORS]
)
def test_load_checks_every_argument_before_reading_anything(monkeypatch, kwargs, error, message):
    """Each bad argument raises, naming it, what was expected and what came -- before the tiny
    model is built or any file is read."""

    def no_work(*args, **kw):
        raise AssertionError("the model was read before the arguments were checked")

    kwargs = {"path_or_tiny": "tiny-qwen3-moe", **kwargs}
    if kwargs["path_or_tiny"] == "tiny-qwen3-moe":
        monkeypatch.setattr(tiny, "ensure", no_work)
    with pytest.raises(error, match=re.escape(message)):
        Pipeline.load(**kwargs)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal of a GPU device without one"
)
def test_load_refuses_a_gpu_device_without_a_gpu():
    with pytest.raises(
        ValueError, match=re.escape("device 'cuda' needs a CUDA or ROCm GPU, got none")
    ):
        Pipeline.load("tiny-qwen3-moe", "cuda")


def test_load_refuses_a_file_that_is_no_model(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="a HF directory or a .gguf file, got the file"):
        Pipeline.load(path)


def test_load_refuses_a_backend_that_cannot_run_here(monkeypatch):
    from ftlab.backends import BackendUnavailable

    monkeypatch.setattr(tiny, "ensure", lambda *a: pytest.fail("the model was read first"))
    with pytest.raises(BackendUnavailable, match="index: backend 'hip' cannot serve this call"):
        Pipeline.load("tiny-qwen3-moe", "cpu", backends="hip")


def test_hybrid_slots_above_the_expert_count(pipe):
    with pytest.raises(ValueError, match=re.escape("hybrid_slots must be an int in [0, 8], got 9")):
        Pipeline(pipe.config, pipe.weights, pipe.tokenizer, hybrid_slots=9)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(max_seq_len=0), ValueError, "max_seq_len must be an int >= 1, got 0"),
        (
            dict(backends={"route_topk": "cuda"}),
            ValueError,
            "backends['route_topk'] must be 'auto' or one of",
        ),
        (dict(graphs=None), TypeError, "graphs must be 'auto', True or False, got None"),
        (dict(q4_0_path="int4"), ValueError, "q4_0_path must be one of"),
    ],
)
def test_constructor_checks_its_arguments(pipe, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        Pipeline(pipe.config, pipe.weights, pipe.tokenizer, **kwargs)


GENERATE_ERRORS = [
    (dict(prompt=""), ValueError, "prompt must be a non-empty string, got ''"),
    (
        dict(prompt=b"The"),
        TypeError,
        "prompt must be a str, or token ids (a list of ints or an integer tensor [T]), got bytes",
    ),
    (dict(prompt=[]), ValueError, "prompt must hold at least one token id, got none"),
    (dict(prompt=[1, -1]), ValueError, "prompt must be token ids in [0, "),
    (dict(prompt=[1.0]), TypeError, "prompt must be a list of int token ids"),
    (dict(ignore_eos=1), TypeError, "ignore_eos must be True or False, got 1"),
    (dict(top_p=0), ValueError, "top_p must be in (0, 1], got 0.0"),
    (dict(top_p=-0.5), ValueError, "top_p must be in (0, 1], got -0.5"),
    (dict(top_p=1.5), ValueError, "top_p must be in (0, 1], got 1.5"),
    (dict(top_p=float("nan")), ValueError, "top_p must be in (0, 1], got nan"),
    (dict(top_p="0.9"), TypeError, "top_p must be a number, got '0.9' (str)"),
    (
        dict(temperature=float("nan")),
        ValueError,
        "temperature must be a finite number >= 0 (0: greedy), got nan",
    ),
    (
        dict(temperature=-1.0),
        ValueError,
        "temperature must be a finite number >= 0 (0: greedy), got -1.0",
    ),
    (
        dict(temperature=float("inf")),
        ValueError,
        "temperature must be a finite number >= 0 (0: greedy), got inf",
    ),
    (dict(temperature=None), TypeError, "temperature must be a number, got None (NoneType)"),
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be an int >= 0, got -1"),
    (dict(max_new_tokens=2.0), TypeError, "max_new_tokens must be an int >= 0, got 2.0 (float)"),
    (dict(seed="1"), TypeError, "seed must be an int in [0, 18446744073709551615], got '1' (str)"),
    (
        dict(seed=1.0),
        TypeError,
        "seed must be an int in [0, 18446744073709551615], got 1.0 (float)",
    ),
    (dict(seed=-1), ValueError, "seed must be an int in [0, 18446744073709551615], got -1"),
]


@pytest.mark.parametrize(
    "kwargs, error, message", GENERATE_ERRORS, ids=[str(k) for k, _, _ in GENERATE_ERRORS]
)
def test_generate_checks_its_arguments_when_called(pipe, kwargs, error, message):
    """generate() raises at the call, not at the first token, and leaves the sequence alone."""
    pipe.position = 7
    with pytest.raises(error, match=re.escape(message)):
        pipe.generate(**{"prompt": "The router", **kwargs})
    assert pipe.position == 7


def test_generate_takes_token_ids_and_can_ignore_eos(pipe, monkeypatch):
    ids = pipe.tokenizer.encode("The router")
    text = "".join(pipe.generate("The router", 6))
    assert "".join(pipe.generate(ids, 6)) == text
    assert "".join(pipe.generate(torch.tensor([ids]), 6)) == text
    pieces = list(pipe.generate(ids, 6, temperature=1.0, top_p=0.9, seed=4))
    assert pieces == list(pipe.generate(torch.tensor(ids), 6, temperature=1.0, top_p=0.9, seed=4))
    # an end-of-text token ends a generation unless ignore_eos: make it the likeliest token
    eos = pipe.tokenizer.eos_token_id
    monkeypatch.setattr(pipe, "sample", lambda logits, t, p, g: eos)
    assert list(pipe.generate(ids, 5)) == []
    assert len(list(pipe.generate(ids, 5, ignore_eos=True))) == 5


def test_boundary_values_are_accepted(pipe):
    assert list(pipe.generate("The router", max_new_tokens=0)) == []
    text = "".join(
        pipe.generate("The router", 3, temperature=1e-3, top_p=1, seed=np.uint64(2**64 - 1))
    )
    assert text == "".join(pipe.generate("The router", 3))  # T -> 0 is greedy
    assert pipe.sample(torch.tensor([0.0, 5.0, 1.0]), 0, 1e-9, None) == 1
    pipe.prefill(torch.tensor([[1, 2, 3]], dtype=torch.int32))
    pipe.decode_step(torch.tensor(4))
    pipe.decode_step(np.int64(5))
    assert pipe.position == 5


def test_prompt_longer_than_max_seq_len_is_refused_everywhere():
    """stages() and compare() once ran such a prompt and returned wrong logits; now every entry
    point refuses it up front."""
    pipe = Pipeline.load("tiny-qwen3-moe", max_seq_len=4)
    prompt = "Every operator has a reference"
    n = len(pipe.tokenizer.encode(prompt))
    message = re.escape(f"prompt must fit in max_seq_len = 4 tokens, got {n} tokens")
    for call in (pipe.stages, pipe.generate, lambda p: pipe.compare(p, ["reference"])):
        with pytest.raises(ValueError, match=message):
            call(prompt)
    with pytest.raises(
        ValueError, match=re.escape(f"ids must fit in max_seq_len = 4 tokens, got {n} tokens")
    ):
        pipe.prefill(pipe.tokenizer.encode(prompt))
    assert len(list(pipe.stages("The"))) > 2  # a prompt that fits


@pytest.mark.parametrize(
    "ids, error, message",
    [
        ([], ValueError, "ids must hold at least one token id, got none"),
        (
            [1, 2.5],
            TypeError,
            "ids must be a list of int token ids or an integer tensor [T], got [1, 2.5]",
        ),
        ("12", TypeError, "ids must be a list of int token ids or an integer tensor [T], got '12'"),
        (
            torch.tensor([1.0, 2.0]),
            TypeError,
            "ids must hold integer token ids, got a torch.float32 tensor",
        ),
        (
            torch.zeros(2, 3, dtype=torch.long),
            ValueError,
            "ids must be [T] (or [1, T]), got shape (2, 3)",
        ),
        ([1, 384], ValueError, "ids must be token ids in [0, 384), got 384"),
        ([-1, 2], ValueError, "ids must be token ids in [0, 384), got -1"),
    ],
)
def test_prefill_checks_its_ids(pipe, ids, error, message):
    with pytest.raises(error, match=re.escape(message)):
        pipe.prefill(ids)


@pytest.mark.parametrize(
    "token, error, message",
    [
        (2.0, TypeError, "token must be an int token id, got 2.0 (float)"),
        (torch.tensor(2.0), TypeError, "token must be an int token id, got tensor(2.)"),
        (-1, ValueError, "token must be a token id in [0, 384), got -1"),
        (384, ValueError, "token must be a token id in [0, 384), got 384"),
    ],
)
def test_decode_step_checks_its_token(pipe, token, error, message):
    pipe.prefill([1, 2])
    with pytest.raises(error, match=re.escape(message)):
        pipe.decode_step(token)
    assert pipe.position == 2


def test_decode_step_stops_at_max_seq_len():
    pipe = Pipeline.load("tiny-qwen3-moe", max_seq_len=3)
    pipe.prefill([1, 2, 3])
    with pytest.raises(ValueError, match="the sequence reached max_seq_len = 3"):
        pipe.decode_step(4)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            dict(backends="triton"),
            TypeError,
            "backends must be a list of backend sets (a name or an {op: backend} dict "
            "each), got str 'triton'",
        ),
        (
            dict(backends=[{"moe_experts": "nope"}]),
            ValueError,
            "backends['moe_experts'] must be 'auto' or one of",
        ),
        (
            dict(backends=["reference"], reference="cuda"),
            ValueError,
            "backends must be 'auto', one of",
        ),
        (dict(prompt=""), ValueError, "prompt must be a non-empty string"),
    ],
)
def test_compare_checks_its_arguments(pipe, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        pipe.compare(**{"prompt": "Hello world", "backends": ["reference"], **kwargs})


def test_stages_checks_its_prompt_when_called(pipe):
    with pytest.raises(ValueError, match="prompt must be a non-empty string"):
        pipe.stages("")


def test_graphs_need_a_gpu_and_a_static_model():
    with pytest.raises(ValueError, match="graphs=True needs a CUDA or ROCm device"):
        Pipeline.load("tiny-qwen3-moe", "cpu", graphs=True)
    pipe = Pipeline.load("tiny-qwen3-moe", "cpu")
    with pytest.raises(ValueError, match="static=True"):
        DecodeGraph(pipe.model, 1)

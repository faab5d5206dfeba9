"""Hybrid CPU/GPU routed experts in the hybrid Qwen models (Qwen3.5-MoE / Qwen3.6 and Qwen3-Next;
docs/OPS.md section 4): each layer's routed experts split between device slots and the CPU, the
shared expert on the device. On the CPU (the device part simulated by the reference, the CPU
part the native kernels), on the tiny models with none, some and all experts resident:

- every layer of the prefill and of the decode steps after it: its routed experts against all
  experts through the reference on the same input and routes, within ``hybrid_tolerance`` (the
  bound of the Qwen3-MoE hybrid tests), on dense, Q4_0 and K-quant (Q4_K gate/up, Q8_0 down)
  banks; the shared expert exactly the plain model's;
- with dense banks, the logits of the plain model within the rounding-order bound of these
  models' tests (``rtol = 1e-5``, ``atol = 1e-5 * max |logits|``: 4e-5 at tiny-qwen3-moe's
  logits, inside its hybrid test's 1e-4), and the same greedy tokens. Quantized banks are held
  to the per-layer bound alone: their int8 path quantizes each expert's input to Q8_1, so a
  one-ulp difference of summation order between the parts can round a Q8_1 value the other way,
  a jump no rounding bound on the logits covers (the Q4_0 GGUF form of tiny-qwen35-moe: 8e-4 in
  one layer's shared expert from a one-ulp input difference, 0.04 in the logits).

On a GPU (the gpu marker): the graph-captured hybrid decode step equals the same static model's
eager step bit for bit, recurrent state included, as the residency moves; and the graph-captured
hybrid pipeline decodes what the plain one does.
"""

from dataclasses import replace

import pytest
import torch

import ftlab.testing as ft
from ftlab import ops
from ftlab.jit import cpu_unavailable_reason
from ftlab.models.pipeline import DecodeGraph, Pipeline
from ftlab.testing.common import assert_within

HYBRID = ["tiny-qwen35-moe", "tiny-qwen3-next"]
PROMPT = "The router sends every token"
STEPS = 3

needs_cpu_build = pytest.mark.skipif(
    cpu_unavailable_reason() is not None, reason=str(cpu_unavailable_reason())
)


pytestmark = pytest.mark.usefixtures("module_cache_dir")  # tiny models built in a fresh cache


_loaded: dict[tuple[str, str, str], tuple] = {}


def _model(name: str, banks: str, device: str = "cpu") -> tuple:
    """(config, weights, tokenizer) of a tiny model's HF form with each layer's routed banks
    ``banks``: "dense" (as stored), "Q4_0" (quantized), or "Q4_K/Q8_0" (random Q4_K gate/up
    blocks, the down bank quantized to Q8_0: its rows of I = 64 are too short for a K-quant); the
    shared expert and the projections stay dense. "Q4_0 GGUF": the model's Q4_0 GGUF form
    (projections and banks Q4_0). Kept for the module."""
    key = (name, banks, device)
    if key not in _loaded:
        pipe = Pipeline.load(
            name, device, quant="q4_0" if banks == "Q4_0 GGUF" else "hf", graphs=False
        )
        weights, c = pipe.weights, pipe.config
        h, inter, e = c.hidden_size, c.moe_intermediate_size, c.num_experts

        def routed(i, moe):  # quantized on the host, then moved
            gate_up, down = moe.w_gate_up.cpu(), moe.w_down.cpu()
            if banks == "Q4_0":
                gate_up, down = ops.quantize_q4_0(gate_up), ops.quantize_q4_0(down)
            else:
                gate_up = ft.random_quant_bank(
                    10 + i, "Q4_K", e, 2 * inter, h, magnitude=4 * h**-0.5
                )
                down = ops.quantize(down, "Q8_0")
            return replace(moe, w_gate_up=gate_up.to(device), w_down=down.to(device))

        if banks in ("Q4_0", "Q4_K/Q8_0"):
            weights = replace(
                weights,
                layers=[replace(lw, moe=routed(i, lw.moe)) for i, lw in enumerate(weights.layers)],
            )
        _loaded[key] = (c, weights, pipe.tokenizer)
    return _loaded[key]


def _slots(config, share: str) -> int:
    return {"none": 0, "some": 3 * config.num_experts // 8, "all": config.num_experts}[share]


CASES = [(name, "dense", share) for name in HYBRID for share in ("none", "some", "all")] + [
    ("tiny-qwen3-next", "Q4_0", "some"),
    ("tiny-qwen35-moe", "Q4_K/Q8_0", "some"),
]


@needs_cpu_build
@pytest.mark.parametrize("name, banks, share", CASES)
def test_hybrid_model_equals_the_plain_one(name, banks, share):
    """Prefill then STEPS greedy decode steps of the hybrid model beside the plain one. At every
    layer of every pass: the routed experts (device slots + CPU) against all experts through the
    reference on the same input and routes, within ``hybrid_tolerance``; the shared expert bit
    for bit. Dense banks: the logits within the rounding-order bound of the plain model's, the
    same greedy tokens (module docstring)."""
    config, weights, tokenizer = _model(name, banks)
    slots = _slots(config, share)
    hyb = Pipeline(
        config, weights, tokenizer, q4_0_path="int8", hybrid_slots=slots, hybrid_policy="lru"
    )
    base = Pipeline(config, weights, tokenizer, q4_0_path="int8")
    assert len(hyb.hybrid) == config.num_hidden_layers
    assert all(
        ex.host_gate_up.shape[0] == config.num_experts and ex.policy.slots == slots
        for ex in hyb.hybrid
    )
    ids = tokenizer.encode(PROMPT)
    tokens, positions = torch.tensor([ids]), torch.arange(len(ids))[None]
    for step in range(STEPS + 1):
        stages = {
            s.name: s.tensors
            for s in hyb.model.stages(tokens, positions, last_only=True, snapshot=False)
        }
        for i, lw in enumerate(weights.layers):
            h = stages[f"layer {i} post_attention_norm"]["hidden"].reshape(-1, config.hidden_size)
            w, routes = stages[f"layer {i} router"]["weights"], stages[f"layer {i} router"]["ids"]
            mw, gpu_ids = lw.moe, hyb.hybrid[i].split(routes)[0]
            want = ops.moe_experts(
                h, mw.w_gate_up, mw.w_down, w, routes, path="int8", backend="reference"
            )
            bound = ft.hybrid_tolerance(
                h, mw.w_gate_up, mw.w_down, w, routes, gpu_ids, "int8", want
            )
            assert_within(
                f"{name} {banks} {slots} slots",
                f"pass {step} layer {i} experts",
                stages[f"layer {i} experts"]["experts"],
                want,
                bound,
            )
            shared = stages[f"layer {i} shared_expert"]
            zero = torch.zeros(h.shape[0], 1, dtype=torch.int32)
            assert torch.equal(
                shared["shared_expert"],
                ops.moe_experts(
                    h, mw.shared_gate_up, mw.shared_down, shared["gate"], zero, path="int8"
                ),
            )
        hyb.model.end_step()
        got = stages["logits"]["logits"][0, -1]
        if banks == "dense":
            want = base.model.forward(tokens, positions, last_only=True)[0, -1]
            assert int(got.argmax()) == int(want.argmax()), f"pass {step}"
            torch.testing.assert_close(
                got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()), msg=f"pass {step}"
            )
        tokens, positions = got.argmax().view(1, 1), positions[:, -1:] + 1
    for p in (ex.policy for ex in hyb.hybrid):
        assert len(p.resident()) <= slots and p.misses > 0
        if share == "all":  # nothing leaves: each expert misses once, when first routed to
            assert p.misses == len(p.resident()) and p.hits > 0


@needs_cpu_build
@pytest.mark.parametrize("name", HYBRID)
def test_pipeline_load_takes_hybrid_slots(name):
    """``Pipeline.load(..., hybrid_slots=k)``: prefill then STEPS decode steps through the
    pipeline give the plain pipeline's greedy tokens and its logits within the rounding-order
    bound while the residency moves; its stages are the plain pipeline's."""
    base = Pipeline.load(name, quant="hf", q4_0_path="int8")
    hyb = Pipeline.load(
        name,
        quant="hf",
        q4_0_path="int8",
        hybrid_slots=_slots(base.config, "some"),
        hybrid_policy="lru",
    )
    ids = base.tokenizer.encode(PROMPT)
    a, b = base.prefill(ids), hyb.prefill(ids)
    for step in range(STEPS + 1):
        assert int(b.argmax()) == int(a.argmax())
        torch.testing.assert_close(
            b, a, rtol=1e-5, atol=1e-5 * float(a.abs().max()), msg=f"step {step}"
        )
        if step < STEPS:
            a, b = base.decode_step(int(a.argmax())), hyb.decode_step(int(a.argmax()))
    for ex in hyb.hybrid:
        assert ex.mechanism == "eager" and ex.policy.hits > 0 and ex.policy.misses > 0
    assert [s.name for s in hyb.stages(PROMPT)] == [s.name for s in base.stages(PROMPT)]


@pytest.mark.gpu
@pytest.mark.parametrize("banks", ["dense", "Q4_0", "Q4_K/Q8_0", "Q4_0 GGUF"])
@pytest.mark.parametrize("name", HYBRID)
def test_hybrid_graph_replays_equal_eager_gpu(name, banks):
    """The decode step of the static hybrid model captured in one graph (every layer's handshake
    passed its probe) and replayed, 16 greedy steps after a prefill: each replay's logits and
    recurrent state equal the same model's eager step from the same state bit for bit (the same
    kernels and CPU jobs on the same inputs), the residency moving between steps."""
    config, weights, tokenizer = _model(name, banks, "cuda")
    pipe = Pipeline(
        config,
        weights,
        tokenizer,
        q4_0_path="int8",
        hybrid_slots=config.num_experts // 2,
        hybrid_policy="lru",
    )
    assert pipe.graph_capturable and all(ex.mechanism != "eager" for ex in pipe.hybrid)
    model = pipe.model
    ids = tokenizer.encode(PROMPT)
    logits = pipe.prefill(ids)
    graph = DecodeGraph(model, 1)
    state = model.recurrent_state()
    for step in range(16):
        tok = logits.argmax().view(1, 1)
        pos = torch.tensor([[len(ids) + step]], device="cuda")
        saved = [t.clone() for t in state]
        replayed = graph(tok, pos).clone()
        after = [t.clone() for t in state]
        for t, kept in zip(state, saved, strict=True):
            t.copy_(kept)
        eager = model.forward(tok, pos)
        assert torch.equal(replayed, eager), f"step {step}: replay differs from eager"
        assert all(torch.equal(t, a) for t, a in zip(state, after, strict=True)), (
            f"step {step}: state"
        )
        model.end_step()
        logits = eager[0, -1]
    for ex in pipe.hybrid:
        ex.check()
        assert ex.policy.hits > 0 and ex.policy.misses > 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", HYBRID)
def test_hybrid_graph_decode_like_the_plain_model_gpu(name):
    """The graph-captured hybrid pipeline (half the experts in device slots) decodes what the
    plain graph-captured one does: the same greedy tokens, logits within the bound of these
    models' graph-against-eager test."""
    base = Pipeline.load(name, "cuda", quant="hf", q4_0_path="int8")
    hyb = Pipeline.load(
        name,
        "cuda",
        quant="hf",
        q4_0_path="int8",
        hybrid_slots=base.config.num_experts // 2,
        hybrid_policy="lru",
    )
    assert hyb.graph_capturable
    ids = base.tokenizer.encode(PROMPT)
    a, b = base.prefill(ids), hyb.prefill(ids)
    for _ in range(24):
        token = int(a.argmax())
        assert int(b.argmax()) == token
        a, b = base.decode_step(token), hyb.decode_step(token)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * float(a.abs().max()))
    assert hyb._graph is not None
    for ex in hyb.hybrid:
        ex.check()
        assert ex.policy.hits > 0 and ex.policy.misses > 0

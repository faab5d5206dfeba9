"""Hybrid CPU/GPU experts in the Qwen3-MoE pipeline (``Pipeline(hybrid_slots=...,
hybrid_policy=...)``):
decode against the plain model on the CPU and, graph-captured, on the GPU; the arguments' checks."""

import re

import pytest
import torch

from ftlab.models.pipeline import Pipeline


def _hybrid_against_base(
    device: str, quant: str, graphs: bool, steps: int = 16, policy: str = "lru"
) -> tuple[Pipeline, list[float]]:
    """A hybrid pipeline (half the experts of each layer in device slots, the rest on the CPU)
    against the plain one, both on the int8 path: the same greedy tokens, and each step's
    next-token logits with their max-abs difference."""
    base = Pipeline.load("tiny-qwen3-moe", device, quant=quant, q4_0_path="int8", graphs=graphs)
    hyb = Pipeline.load(
        "tiny-qwen3-moe",
        device,
        quant=quant,
        q4_0_path="int8",
        graphs=graphs,
        hybrid_slots=4,
        hybrid_policy=policy,
    )
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


def test_static_hybrid_experts_decode_like_the_plain_model():
    """hybrid_policy="static": experts 0..3 of every layer in the slots for good, the rest on the
    CPU, nothing moved between steps; the same tokens and logits within fp32 rounding."""
    hyb, diffs = _hybrid_against_base("cpu", "q4_0", graphs=False, steps=8, policy="static")
    assert max(diffs) <= 1e-4, diffs
    for ex in hyb.hybrid:
        assert ex.policy.expert_in == [0, 1, 2, 3] and ex.table.tolist() == [0, 1, 2, 3] + [-1] * 4
        assert ex.policy.hits > 0 and ex.policy.misses > 0


def test_layer_placement_decodes_like_the_plain_model():
    """hybrid_policy="layers": 4 of 8 experts' share placed by layers -- every expert of the first
    of the tiny model's 2 layers on the CPU (an executor with no slots), the other layer's on the
    device (no executor); the same tokens and logits within fp32 rounding."""
    hyb, diffs = _hybrid_against_base("cpu", "q4_0", graphs=False, steps=8, policy="layers")
    assert max(diffs) <= 1e-4, diffs
    assert hyb.hybrid[1] is None and hyb.executors == hyb.hybrid[:1]
    (ex,) = hyb.executors
    assert ex.policy.slots == 0 and ex.policy.hits == 0 and ex.policy.misses > 0


@pytest.mark.parametrize(
    "name, slots",
    [
        ("tiny-qwen3-moe", 0),
        ("tiny-qwen3-moe", 6),
        ("tiny-qwen3-moe", 8),
        ("tiny-qwen3-moe-wide", 8),
        ("tiny-qwen3-moe-wide", 11),
    ],
)
def test_layer_placement_puts_the_share_on_the_cpu(name, slots):
    """Pipeline(hybrid_policy="layers"): exactly cpu_layers(L, E, N) leading layers get an executor
    (every expert on the CPU), whatever the share -- all of them, some, or none (a graph-free CPU
    decode still runs when no layer has one)."""
    from ftlab.hybrid import cpu_layers

    pipe = Pipeline.load(
        name, "cpu", quant="q4_0", q4_0_path="int8", hybrid_slots=slots, hybrid_policy="layers"
    )
    c = pipe.config
    want = cpu_layers(c.num_hidden_layers, c.num_experts, slots)
    assert [ex is not None for ex in pipe.hybrid] == [True] * want + [False] * (
        c.num_hidden_layers - want
    )
    assert all(ex.policy.slots == 0 for ex in pipe.executors)
    logits = pipe.prefill(pipe.tokenizer.encode("every expert"))
    assert bool(torch.isfinite(pipe.decode_step(int(logits.argmax()))).all())


def test_lru_table_on_the_device_follows_the_policy():
    """end_step copies the slot table only when the policy loaded an expert: after every step, with
    loads or none, the executor's table equals the policy's."""
    from ftlab.hybrid import HybridDecodeExecutor

    gen = torch.Generator().manual_seed(4)
    ex = HybridDecodeExecutor(
        torch.randn(8, 64, 32, generator=gen),
        torch.randn(8, 32, 32, generator=gen),
        3,
        "cpu",
        backend="reference",
        path="dequant",
    )
    loaded = []
    for ids in ([[0, 1]], [[0, 1]], [[2, 3]], [[3, 2]], [[5, -1]], [[5, 0]], [[7, 7]]):
        loaded.append(len(ex.end_step(torch.tensor(ids))))
        assert ex.table.tolist() == ex.policy.table().tolist()
    assert 0 in loaded and max(loaded) > 0


def test_layer_executors_place_the_share():
    from ftlab.hybrid import layer_executors

    gen = torch.Generator().manual_seed(3)
    banks = [
        (torch.randn(8, 64, 32, generator=gen), torch.randn(8, 32, 32, generator=gen))
        for _ in range(6)
    ]
    # 6 of 8 experts' bytes on the CPU: 4.5 -> 5 layers
    placed = layer_executors(banks, 2, "cpu", "layers")
    assert [ex is None for ex in placed] == [False] * 5 + [True]
    assert all(ex.policy.slots == 0 and ex.table.tolist() == [-1] * 8 for ex in placed[:5])
    for placement, table in (("static", [0, 1] + [-1] * 6), ("lru", [-1] * 8)):
        placed = layer_executors(banks, 2, "cpu", placement)
        assert len(placed) == 6 and all(ex.table.tolist() == table for ex in placed)
    with pytest.raises(
        ValueError, match=re.escape("placement must be one of ['lru', 'static', 'layers'], got 'x'")
    ):
        layer_executors(banks, 2, "cpu", "x")


def test_hybrid_policy_is_checked():
    from ftlab.hybrid import PLACEMENTS
    from ftlab.models.pipeline_args import HYBRID_POLICIES

    assert HYBRID_POLICIES == PLACEMENTS
    with pytest.raises(
        ValueError,
        match=re.escape("hybrid_policy must be one of ['lru', 'static', 'layers'], got 'fifo'"),
    ):
        Pipeline.load("tiny-qwen3-moe", "cpu", hybrid_slots=2, hybrid_policy="fifo")


def test_hybrid_slots_must_fit():
    with pytest.raises(ValueError, match="hybrid_slots must be an int in"):
        Pipeline.load("tiny-qwen3-moe", "cpu", hybrid_slots=9)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "quant, policy", [("f32", "lru"), ("q4_0", "lru"), ("q4_0", "static"), ("q4_0", "layers")]
)
def test_hybrid_graph_decode_like_the_plain_model_gpu(quant, policy):
    """GPU: the decode step with hybrid layers is captured in one graph (every layer's
    handshake passed its probe) and decodes what the plain graph-captured model does."""
    hyb, diffs = _hybrid_against_base("cuda", quant, graphs=True, steps=24, policy=policy)
    assert hyb.graph_capturable and hyb._graph is not None
    assert max(diffs) <= 1e-4, diffs
    for ex in hyb.executors:
        ex.check()
        assert ex.policy.hits > 0 or policy == "layers"
        assert ex.policy.misses > 0


@pytest.mark.gpu
def test_residency_follows_the_replays_after_an_eager_pass_gpu():
    """An eager pass between graph steps (as compare() or stages() make) must not leave the
    residency reading its router ids: after the next replay, every hybrid layer's end_step reads
    the graph's id buffers again, and the LRU slots follow the replays' routes."""
    pipe = Pipeline.load(
        "tiny-qwen3-moe",
        "cuda",
        quant="q4_0",
        q4_0_path="int8",
        graphs=True,
        hybrid_slots=4,
        hybrid_policy="lru",
    )
    logits = pipe.prefill(pipe.tokenizer.encode("The router sends every token"))
    token = int(logits.argmax())
    logits = pipe.decode_step(token)  # the first decode step captures the graph
    assert pipe._graph is not None and len(pipe._graph.routed) == pipe.config.num_hidden_layers
    pos = torch.tensor([[pipe.position - 1]], device="cuda")
    pipe.model.forward(torch.tensor([[token]], device="cuda"), pos)  # rewrites the same cache slot
    for _ in range(4):
        logits = pipe.decode_step(int(logits.argmax()))
        assert all(pipe.model.routed[i] is ids for i, ids in pipe._graph.routed.items())
        for i, ex in enumerate(pipe.hybrid):  # the slots hold this replay's experts
            routed = set(pipe._graph.routed[i].flatten().tolist())
            assert routed <= ex.policy.resident(), (i, routed, ex.policy.resident())

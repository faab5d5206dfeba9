"""``ftlab bench model --arch qwen35moe``: the Qwen3.6-35B-A3B text shape (hybrid: 30 Gated
DeltaNet + 10 gated-attention layers, 256 experts top-8; :mod:`ftlab.bench.qwen35moe_random`)
with random Q4_0 weights made on the device, through :class:`~ftlab.models.pipeline.Pipeline`
(graphs on a GPU): prefill tokens/s of one 512-token prompt, decode tokens/s at batch 1 (the
pipeline's ``decode_step``) and batch 8 (a :class:`~ftlab.models.qwen3_next.Qwen3Next` of 8
sequences over the same weights), graph against eager, beside the bound bytes-per-step / copy
bandwidth measured in the same run; the per-layer expert load of the prefill shows the routing
spread. ``write_gguf``: the same weights as a ``qwen35moe`` GGUF file first (llama-bench runs it).

On the CPU (``device="cpu"``, for a scaled-down shape) every step runs eagerly, timed by the host
clock, beside the host's copy bandwidth: a check that the bench runs, not a measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import torch
from tqdm import tqdm

from ftlab.bench.harness import Report, capture, require_gpu
from ftlab.bench.model import (
    decode_rows,
    expert_loads,
    experts_used,
    fill_cache,
    near_logits,
    note_expert_load,
    prefill_row,
)
from ftlab.bench.model import timer as bench_timer
from ftlab.bench.qwen35moe_gguf import write_random_gguf
from ftlab.bench.qwen35moe_random import (
    QWEN35_35B_A3B,
    RandomTensors,
    Shape,
    byte_tokenizer,
    hf_config,
)
from ftlab.models.pipeline import DecodeGraph, Pipeline
from ftlab.models.qwen3_next.config import Qwen3NextConfig
from ftlab.models.qwen3_next.model import Qwen3Next
from ftlab.models.qwen3_next.model_weights import NextWeights
from ftlab.models.qwen3_next.weights import build_weights
from ftlab.quant import QuantWeight

DECODE_BATCHES = (1, 8)
DECODE_ROOM = 64  # cache positions after the prompt: the decode steps timed
NOTES = [
    "prefill: one prompt through Pipeline.prefill (eager, host checks and launches included, the "
    "last position's logits as the pipeline returns them); on a GPU with graphs also graph: the "
    "same pass of the static model replayed from a captured CUDA graph.",
    "decode batch 1: Pipeline.decode_step after that prefill (graph: its captured CUDA graph, host "
    "copies of the token and position included); batch 8: a Qwen3Next of 8 sequences at the "
    "prompt's length over the same weights, DecodeGraph; eager: the same model's forward launched "
    "op by op.",
    "bound: the bytes a decode step reads -- weights (projections, routers, shared experts, the "
    "routed experts the step's tokens use, lm_head, one embedding row a token) plus the recurrent "
    "state (DeltaNet state read and written, conv state) and the KV cache of every slot a static "
    "step attends over -- over the copy bandwidth measured in this run.",
]


def run(
    quick: bool = False,
    shape: Shape = QWEN35_35B_A3B,
    device: str = "cuda",
    write_gguf: str | Path | None = None,
) -> Report:
    """The bench of ``shape`` on ``device`` (``"cuda"``: a GPU is required; ``"cpu"``: eager, a
    smoke run); ``quick``: fewer repetitions; ``write_gguf``: a path to write the model's GGUF
    file to. The report is ``model-qwen35moe``, or ``model-qwen35moe-scaled`` for another shape
    than the released model's."""
    if not isinstance(shape, Shape):
        raise TypeError(f"shape must be a Shape, got {type(shape).__name__}")
    dev = torch.device(device)
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if dev.type == "cuda":
        require_gpu()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    hf = hf_config(shape)
    tensors = RandomTensors(hf, dev)
    if write_gguf is not None:
        print(f"writing {write_gguf}")
        write_random_gguf(
            write_gguf, hf, tensors, progress=lambda r: tqdm(r, desc="GGUF layers", unit="layer")
        )
    name = "model-qwen35moe" if shape == QWEN35_35B_A3B else "model-qwen35moe-scaled"
    report = Report.for_device(name, NOTES, dev)
    config = Qwen3NextConfig.from_hf(hf)
    weights = build_weights(
        config,
        tensors,
        device=dev,
        dtype=dtype,
        where="random qwen35moe",
        progress=lambda r: tqdm(r, desc="random Q4_0 layers", unit="layer"),
    )
    report.notes.insert(0, _shape_note(config, weights))
    bench_pipeline(
        report, config, weights, shape.prefill, bench_timer(dev, quick), "random qwen35moe"
    )
    return report


def bench_pipeline(
    report: Report, config: Qwen3NextConfig, weights: NextWeights, length: int, timer, name: str
) -> None:
    """The prefill row of one ``length``-token prompt and the decode rows of every batch of
    :data:`DECODE_BATCHES` (module docstring), with their notes, into ``report``, through a
    :class:`Pipeline` named ``name`` over ``weights``; ``timer(fn, warmup, reps)`` gives
    microseconds."""
    pipe = Pipeline(config, weights, byte_tokenizer(), max_seq_len=length + DECODE_ROOM, name=name)
    gen = torch.Generator(device=pipe.device).manual_seed(1)
    _prefill(report, pipe, length, gen, timer)
    for batch in DECODE_BATCHES:
        _decode(report, pipe, length, batch, gen, timer)
        if pipe.device.type == "cuda":
            torch.cuda.empty_cache()


def _nbytes(w) -> int:
    return w.nbytes if isinstance(w, QuantWeight) else w.numel() * w.element_size()


def _shape_note(c: Qwen3NextConfig, w: NextWeights) -> str:
    total = sum(_nbytes(x) for lw in w.layers for x in (lw.moe.w_gate_up, lw.moe.w_down)) + _nbytes(
        w.lm_head
    )
    return (
        f"shape: {c.num_hidden_layers} layers ({len(c.linear_layers)} Gated DeltaNet + "
        f"{len(c.attention_layers)} gated attention), hidden {c.hidden_size}, attention "
        f"{c.num_attention_heads} / {c.num_key_value_heads} heads x {c.head_dim} (rotary "
        f"{c.rotary_dim}), linear attention {c.linear_num_key_heads} key / "
        f"{c.linear_num_value_heads} value heads x {c.linear_key_head_dim}, conv "
        f"{c.linear_conv_kernel_dim}, {c.num_experts} experts top-{c.num_experts_per_tok} of "
        f"{c.moe_intermediate_size} + shared {c.shared_expert_intermediate_size}, vocab "
        f"{c.vocab_size}; random Q4_0 matmul weights, dense {w.embed.dtype}; routed experts + "
        f"lm_head {total / 1e9:.2f} GB"
    )


def decode_bytes(
    config: Qwen3NextConfig, weights: NextWeights, experts_used: float, batch: int, attended: int
) -> tuple[float, float]:
    """``(weight bytes, state bytes)`` one decode step of ``batch`` sequences reads (and, for the
    state, writes) with ``experts_used`` distinct experts a layer and ``attended`` KV-cache
    slots a full-attention layer."""
    c, w = config, weights
    weight = _nbytes(w.lm_head) + batch * c.hidden_size * w.embed.element_size()
    for lw in w.layers:
        m = lw.moe
        per_expert = (_nbytes(m.w_gate_up) + _nbytes(m.w_down)) / c.num_experts
        weight += experts_used * per_expert + sum(
            _nbytes(x) for x in (m.router, m.shared_gate_up, m.shared_down, m.shared_gate)
        )
        mixer = lw.mixer
        parts = [getattr(mixer, f.name) for f in fields(mixer)]
        weight += sum(_nbytes(x) for x in parts if isinstance(x, (torch.Tensor, QuantWeight)))
        weight += _nbytes(lw.input_norm) + _nbytes(lw.post_attention_norm)
    delta = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
    conv = c.conv_dim * (c.linear_conv_kernel_dim - 1) * w.embed.element_size()
    kv = 2 * c.num_key_value_heads * c.head_dim * attended * w.embed.element_size()
    state = batch * (len(c.linear_layers) * 2 * (delta + conv) + len(c.attention_layers) * kv)
    return weight, state


def _prefill(report: Report, pipe: Pipeline, length: int, gen: torch.Generator, timer) -> None:
    """One prompt of ``length`` random tokens: tokens/s, finite logits, and the expert load."""
    c, dev = pipe.config, pipe.device
    tokens = torch.randint(0, c.vocab_size, (length,), device=dev, generator=gen)
    logits = pipe.prefill(tokens)
    finite = bool(torch.isfinite(logits).all())
    pos = torch.arange(length, device=dev)[None]
    stages = pipe.model.stages(tokens[None], pos, last_only=True, snapshot=False)
    load = expert_loads(stages, c.num_experts)
    # the prompt's whole pass each time, not a resume from the prefix cache's snapshot of it
    again = lambda: (pipe.prefix_cache.clear(), pipe.reset(), pipe.prefill(tokens))
    prefill_row(report, length, timer(again, 2, 5), finite, "eager")
    report.notes.append(
        f"prefill logits: finite {finite}, RMS {float(logits.float().pow(2).mean().sqrt()):.2f}"
    )
    # the same pass replayed from a graph: no host launches
    if dev.type == "cuda" and pipe.model.static:
        replay, out = capture(
            lambda: pipe.model.forward(tokens[None], pos, last_only=True), warmup=2
        )
        replay()
        got = out[0, -1]
        ok = near_logits(got, logits)
        prefill_row(report, length, timer(replay, 2, 5), ok, "graph")
        report.notes.append(
            f"prefill graph: the static model's pass replayed from a captured graph; its logits "
            f"{'bit-equal to' if torch.equal(got, logits) else 'within 5% of the largest of'} the "
            "eager pass's"
        )
        del replay, out
        torch.cuda.empty_cache()
    note_expert_load(report, load, length, c.num_experts_per_tok)


def _same_step(
    model: Qwen3Next, first: Callable[[], torch.Tensor], second: Callable[[], torch.Tensor]
) -> bool:
    """Whether two ways of running one decode step from the same recurrent state give identical,
    finite logits (the state is put back after each)."""
    saved = [t.clone() for t in model.recurrent_state()]

    def restore() -> None:
        for t, kept in zip(model.recurrent_state(), saved, strict=True):
            t.copy_(kept)

    a = first().clone()
    restore()
    b = second().clone()
    restore()
    return bool(torch.isfinite(a).all()) and torch.equal(a, b)


def _eager_held(model: Qwen3Next, step: Callable[[], torch.Tensor]) -> bool:
    """An eager decode step from the model's state (put back after): finite logits, and every
    layer's ``ops.decode_attention`` (hip's kernel where the plan's ``hip_attention`` picks it)
    within the derived bound of the reference on the same inputs. Its logits are not held to the
    graph's: a last-bit difference between attention kernels flips routing choices later on."""
    from ftlab.testing.attention import decode_attention_held_to_reference

    saved = [t.clone() for t in model.recurrent_state()]
    with decode_attention_held_to_reference() as calls:
        out = step().clone()
    for t, kept in zip(model.recurrent_state(), saved, strict=True):
        t.copy_(kept)
    return bool(torch.isfinite(out).all()) and all(over == 0 for _, over, _ in calls)


def _decode(
    report: Report, pipe: Pipeline, length: int, batch: int, gen: torch.Generator, timer
) -> None:
    """Decode steps of ``batch`` sequences at position ``length``: graph (on a GPU) and eager.
    Validated:
    the graph's step (or the pipeline's, at batch 1) bit for bit against an eager step through the
    graph's kernels (``DecodePlan.attention_as_captured``); the eager step, which takes hip's
    attention where the plan's ``hip_attention`` picks it, by :func:`_eager_held`."""
    c, dev = pipe.config, pipe.device
    steps = [
        torch.randint(0, c.vocab_size, (batch, 1), device=dev, generator=gen) for _ in range(8)
    ]
    positions = torch.full((batch, 1), length, device=dev)
    it = iter(range(1 << 62))
    if batch == 1:
        model = pipe.model  # its state: the prompt _prefill left
        ids = [int(s) for s in steps]

        def graph_step() -> torch.Tensor:
            if pipe.position >= pipe.max_seq_len:
                pipe.position = length
            return pipe.decode_step(ids[next(it) % 8])

        pipe.position = length
        # an eager step through the graph's kernels
        with model.planned(model.plan.attention_as_captured()):
            ok = _same_step(
                model,
                lambda: pipe.decode_step(ids[0]),
                lambda: model.forward(steps[0], positions)[0, -1],
            )
        eager_ok = ok and _eager_held(model, lambda: model.forward(steps[0], positions))
        pipe.position = length
    else:
        model = Qwen3Next(
            c,
            pipe.weights,
            max_batch=batch,
            max_seq_len=pipe.max_seq_len,
            plan=pipe.model.plan,
            static=pipe.graph_capturable,
        )
        fill_cache(model.cache)  # a prefix to attend over (the recurrent state starts at zeros)
        graph = DecodeGraph(model, batch) if pipe.graph_capturable else None
        eager = lambda: model.forward(steps[0], positions)
        # an eager step through the graph's kernels
        with model.planned(model.plan.attention_as_captured()):
            ok = _same_step(
                model, (lambda: graph(steps[0], positions)) if graph is not None else eager, eager
            )
        eager_ok = ok and _eager_held(model, eager)

        def graph_step() -> torch.Tensor:
            return graph(steps[next(it) % 8], positions)

    used = experts_used(c, batch)
    attended = pipe.max_seq_len if model.static else length + 1
    weight, state = decode_bytes(c, pipe.weights, used, batch, attended)
    nbytes = int(weight + state)
    times = {}
    if pipe.graph_capturable:
        times["graph"] = timer(graph_step, 3, 20)
    times["eager"] = timer(lambda: model.forward(steps[next(it) % 8], positions), 2, 10)
    rates = decode_rows(report, batch, times, nbytes, {"graph": ok, "eager": eager_ok})
    report.notes.append(
        f"decode batch {batch}: {weight / 1e9:.3f} GB of weights (~{used:.0f} experts a layer) + "
        f"{state / 1e9:.3f} GB of state a step: {rates}"
    )

"""``ftlab bench model``: a Qwen3-30B-A3B-shaped model (48 layers, hidden 2048, 32 / 4 heads x 128,
128 experts top-8 of width 768, vocab 151936) with random Q4_0 weights generated in packed form
(no float model), bf16 activations: prefill tokens/s at 512 tokens, decode tokens/s at batch 1
and 8, graph against eager, beside the bound bytes-per-token / copy bandwidth.

Weights: every Q4_0 matrix gets uniform random nibbles and one fp16 scale per block, sized so
that a row's dot with a unit-RMS input has unit RMS; norms are ones; the router is random bf16;
the embedding has a larger scale (RMS 4) so the hidden state, and the routing, is not dominated
by the residual's start. The per-layer expert load of the prefill (how many of the 512 x 8 routes
each expert gets) is reported beside the timings, to show that routing spreads as real routing
does.

``ftlab bench model --gguf FILE [--prefill N] [--llama-bench BIN] [--device cpu]``
(:mod:`ftlab.bench.model_gguf`) times the model of a llama.cpp GGUF file the same way
(:func:`bench_weights`), its tensors in the file's types -- e.g. the Q4_K_M mix (Q4_K, Q6_K) of
``benchmarks/make_kquant_model.sh`` -- with the bound counted from their packed sizes
(:func:`decode_bytes` takes weights of any type), and llama.cpp's llama-bench on the same file in
the same run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from ftlab.bench.harness import Measurement, Report, capture, time_us
from ftlab.models.decode_steps import DecodeLaunches, NotReplayable
from ftlab.models.pipeline import DecodeGraph
from ftlab.models.qwen3_moe.config import Qwen3MoeConfig
from ftlab.models.qwen3_moe.model import Qwen3Moe
from ftlab.models.qwen3_moe.model_weights import LayerWeights, ModelWeights
from ftlab.quant import QK, Q4_0Weight, QuantWeight

CONFIG = Qwen3MoeConfig(
    vocab_size=151936,
    hidden_size=2048,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
)
PREFILL = 512
DECODE_BATCHES = (1, 8)

NOTES = [
    "prefill: one 512-token sequence, logits of the last token only; eager (host launches "
    "included), and graph: the same pass replayed from a captured CUDA graph (the static model, "
    "which reads every cache slot under a mask), validated against eager's logits (within 5% of "
    "the largest).",
    "decode: one token per sequence per step at position 512, graph = the whole step replayed from "
    "a captured CUDA graph, eager = launched op by op from Python, launches = eager's kernels "
    "launched from a schedule recorded once (ftlab.models.decode_steps: no graph, the ops' Python "
    "run once), validated bit for bit against the eager step.",
    "bound: the weight bytes a decode step reads (attention projections, router, the experts the "
    "step's tokens use, the lm_head, one embedding row per token) over the copy bandwidth "
    "measured in this run.",
]


def random_q4_0(shape: tuple[int, ...], device: torch.device, gen: torch.Generator) -> Q4_0Weight:
    """Nibbles uniform over 1..15 (centred on 8: codes 0..15 would give every weight a mean of
    -d/2, a common offset in every output that piles up in the residual and collapses routing
    onto a few experts), scales so a row's dot with a unit-RMS input has unit RMS (the codes
    minus 8 have RMS ~4.32)."""
    *lead, k = shape
    nb = k // QK
    lo = torch.randint(1, 16, (*lead, nb, 18), dtype=torch.uint8, device=device, generator=gen)
    hi = torch.randint(1, 16, (*lead, nb, 18), dtype=torch.uint8, device=device, generator=gen)
    data = lo | (hi << 4)
    scale = torch.full((*lead, nb, 1), 1.0 / (4.32 * k**0.5), dtype=torch.float16, device=device)
    data[..., :2] = scale.view(torch.uint8)
    return Q4_0Weight(data.view(*lead, nb * 18), tuple(shape))


def random_model(config: Qwen3MoeConfig, device: torch.device) -> ModelWeights:
    c = config
    gen = torch.Generator(device=device).manual_seed(0)
    h, hd, e, i = c.hidden_size, c.head_dim, c.num_experts, c.moe_intermediate_size
    ones = torch.ones(h, dtype=torch.bfloat16, device=device)
    hd_ones = torch.ones(hd, dtype=torch.bfloat16, device=device)
    layers = []
    for _ in tqdm(range(c.num_hidden_layers), desc="random Q4_0 layers", unit="layer"):
        layers.append(
            LayerWeights(
                q_proj=random_q4_0((c.num_attention_heads * hd, h), device, gen),
                k_proj=random_q4_0((c.num_key_value_heads * hd, h), device, gen),
                v_proj=random_q4_0((c.num_key_value_heads * hd, h), device, gen),
                o_proj=random_q4_0((h, c.num_attention_heads * hd), device, gen),
                q_norm=hd_ones,
                k_norm=hd_ones,
                input_norm=ones,
                post_attention_norm=ones,
                router=(torch.randn(e, h, device=device, generator=gen) * h**-0.5).to(
                    torch.bfloat16
                ),
                w_gate_up=random_q4_0((e, 2 * i, h), device, gen),
                w_down=random_q4_0((e, h, i), device, gen),
            )
        )
    embed = (torch.randn(c.vocab_size, h, device=device, generator=gen) * 4.0).to(torch.bfloat16)
    return ModelWeights(embed, layers, ones, random_q4_0((c.vocab_size, h), device, gen))


def nbytes(w: QuantWeight | torch.Tensor) -> int:
    """The bytes a weight occupies: its packed blocks (any GGUF type), or a dense tensor's
    elements."""
    return w.nbytes if isinstance(w, QuantWeight) else w.numel() * w.element_size()


def decode_bytes(
    config: Qwen3MoeConfig, weights: ModelWeights, experts_used: float, batch: int
) -> float:
    """Weight bytes one decode step of ``batch`` tokens reads with ``experts_used`` distinct
    experts per layer: every layer's projections, norms and router as stored (packed of any type,
    or dense), its expert banks per expert, the lm_head, one embedding row a token. Weights of a
    tensor-parallel rank: its own bytes (its banks hold its share of the experts)."""
    total = nbytes(weights.lm_head) + nbytes(weights.norm) + batch * nbytes(weights.embed[0])
    for lw in weights.layers:  # a rank's bank holds its share of the experts: bytes / E is the same
        per_expert = (nbytes(lw.w_gate_up) + nbytes(lw.w_down)) / config.num_experts
        total += experts_used * per_expert + sum(
            nbytes(w)
            for w in (
                lw.q_proj,
                lw.k_proj,
                lw.v_proj,
                lw.o_proj,
                lw.q_norm,
                lw.k_norm,
                lw.input_norm,
                lw.post_attention_norm,
                lw.router,
            )
        )
    return total


def run(quick: bool = False) -> Report:
    dev = torch.device("cuda")
    report = Report.for_device("model", NOTES)
    config = CONFIG
    if quick:
        from dataclasses import replace

        config = replace(CONFIG, num_hidden_layers=4)
    weights = random_model(config, dev)
    bench_weights(report, config, weights, PREFILL, timer(dev, quick=False))
    return report


def bench_weights(
    report: Report, config: Qwen3MoeConfig, weights: ModelWeights, length: int, timer, tp=None
) -> None:
    """The prefill row of one ``length``-token prompt, then the decode rows of every batch of
    :data:`DECODE_BATCHES` at position ``length`` (graph and eager on a GPU, eager on the CPU),
    with their notes, into ``report``; ``timer(fn, warmup, reps)`` gives microseconds. ``tp``: a
    :class:`~ftlab.models.tensor_parallel.TensorParallel` rank holding its shard of the weights
    (every rank runs the same calls: token ids are drawn on the host, the same on every rank)."""
    dev = weights.embed.device
    gen = torch.Generator().manual_seed(1)
    prefill(report, config, weights, gen, length, timer, tp)
    _empty_cache(dev)
    for batch in DECODE_BATCHES:
        decode(report, config, weights, batch, gen, length, timer, tp)
        _empty_cache(dev)


def _empty_cache(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def timer(dev: torch.device, quick: bool) -> Callable[..., float]:
    """``timer(fn, warmup, reps)``: median microseconds of ``fn()`` -- device events on a GPU, the
    host clock on the CPU (one warm-up and three repeats there; ``quick``: one call)."""
    if dev.type == "cuda":
        return lambda fn, warmup, reps: time_us(
            fn, warmup=warmup, reps=max(3, reps // 2) if quick else reps
        )

    def host(fn: Callable[[], object], warmup: int, reps: int) -> float:
        if not quick:
            fn()
        samples = []
        for _ in range(1 if quick else 3):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
        return statistics.median(samples)

    return host


def prefill(
    report: Report,
    config: Qwen3MoeConfig,
    weights: ModelWeights,
    gen: torch.Generator,
    length: int,
    timer,
    tp=None,
) -> None:
    """``length`` random tokens through the dynamic model; the router's choices give the expert
    load."""
    dev = weights.embed.device
    model = Qwen3Moe(config, weights, max_batch=1, max_seq_len=length + 8, tp=tp)
    tokens = torch.randint(0, config.vocab_size, (1, length), generator=gen).to(dev)
    pos = torch.arange(length, device=dev)[None]
    load = expert_loads(model.stages(tokens, pos, last_only=True), config.num_experts)
    eager = model.forward(tokens, pos, last_only=True)
    finite = bool(torch.isfinite(eager).all())
    t = timer(lambda: model.forward(tokens, pos, last_only=True), 2, 5)
    prefill_row(report, length, t, finite, "eager")
    # the same pass replayed from a graph: the device's time without host launches
    if dev.type == "cuda":
        del model
        static = Qwen3Moe(config, weights, max_batch=1, max_seq_len=length + 8, static=True, tp=tp)
        replay, out = capture(lambda: static.forward(tokens, pos, last_only=True), warmup=2)
        replay()
        # the static model reads every cache slot under a mask: eager's logits up to summation order
        ok = near_logits(out, eager)
        prefill_row(report, length, timer(replay, 2, 5), ok, "graph")
    note_expert_load(report, load, length, config.num_experts_per_tok)


def expert_loads(stages, experts: int) -> torch.Tensor:
    """How many routes each of ``experts`` experts got in each layer, ``[layers, E]`` fp32: the
    choices (``ids``) of the router stages among a model's ``stages``."""
    loads = [
        torch.bincount(stage.tensors["ids"].flatten().long(), minlength=experts)
        for stage in stages
        if stage.name.endswith("router")
    ]
    return torch.stack(loads).float()


def prefill_row(report: Report, length: int, t: float, ok: bool, mode: str) -> None:
    """The row of a ``length``-token prefill that took ``t`` microseconds (tokens/s in its case)."""
    case = f"prefill {length} tokens: {length / (t * 1e-6):.0f} tokens/s"
    report.measurements.append(Measurement(case, "auto", t, 0, ok, mode))


def near_logits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether logits ``got`` are finite and no further from ``want`` than 5% of its largest: a
    sanity bound for sums in x's dtype taken in another order than ``want``'s over every layer,
    which garbage fails."""
    finite = bool(torch.isfinite(got).all())
    return finite and float((got - want).abs().max()) <= 0.05 * float(want.abs().max())


def note_expert_load(report: Report, load: torch.Tensor, length: int, top_k: int) -> None:
    """Two notes on the expert load ``[layers, E]`` (:func:`expert_loads`) of a ``length``-token
    prefill routing each token to ``top_k`` experts: its spread, and a histogram over the mean."""
    mean = length * top_k / load.shape[1]
    spread = float((load.max(1).values / mean).median())
    report.notes.append(
        f"prefill expert load over {load.shape[0]} layers (routes per expert, mean {mean:.1f}): "
        f"min {load.min():.0f}, max {load.max():.0f}, median per-layer max/mean {spread:.2f}, "
        f"experts with no route {int((load == 0).sum())} of {load.numel()}"
    )
    hist = torch.histc(load / mean, bins=8, min=0, max=4).int().tolist()
    report.notes.append(
        f"prefill expert load histogram (routes / mean, 8 bins over [0, 4), all layers): {hist}"
    )


def fill_cache(cache, seed: int = 1) -> None:
    """Every slot of a static ``KVCache`` set to random rows of RMS 1, so that a decode step attends
    over a real prefix: over a cache of zeros but the step's own row, an attention that read the
    wrong positions or merged its splits wrongly would give the same output and pass
    :func:`eager_step_ok`."""
    if not cache.k:
        return
    gen = torch.Generator(device=cache.k[0].device).manual_seed(seed)
    for t in cache.k + cache.v:
        t.normal_(generator=gen)


def parted_note(what: str, got: torch.Tensor, want: torch.Tensor) -> str:
    """A line for the report when ``got`` is not bit-equal to ``want`` (logits): how many differ, by
    how much against the largest, and whether the tokens they choose do."""
    diff = (got.float() - want.float()).abs()
    finite = bool(torch.isfinite(got).all())
    same_tokens = bool(torch.equal(got.argmax(-1), want.argmax(-1)))
    return (
        f"{what} is not bit-equal to the eager step through its kernels: {int((diff != 0).sum())} "
        f"of {diff.numel()} logits differ, max |diff| {diff.max().item():.3g} (largest logit "
        f"{want.abs().max().item():.3g}), {'finite' if finite else 'NOT finite'}, greedy tokens "
        f"{'the same' if same_tokens else 'different'}"
    )


def which_side(
    graph: Callable[..., torch.Tensor],
    model,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    replayed: torch.Tensor,
    same: torch.Tensor,
) -> str:
    """After a failed graph check: whether each side gives its logits again (a second replay, a
    second eager step through the graph's kernels), and whether the step launched eagerly through
    exactly the captured kernels (``DecodePlan.as_captured``: the fused norm and q/k/v matvec off
    too) equals the replay -- a text for the report, which tells a flaky kernel from a path that
    parts."""
    again = graph(tokens, positions).clone()
    with model.planned(model.plan.attention_as_captured()):
        same2 = model.forward(tokens, positions).clone()
    with model.planned(model.plan.as_captured()):
        exact = model.forward(tokens, positions).clone()

    def eq(a: torch.Tensor, b: torch.Tensor) -> str:
        return "equal" if torch.equal(a, b) else "differ"

    return (
        f"; a second replay and the first: {eq(again, replayed)}; a second eager step and the "
        f"first: {eq(same2, same)}; the replay and the step launched eagerly through exactly the "
        f"captured kernels: {eq(replayed, exact)}"
    )


def eager_step_ok(
    step: Callable[[], torch.Tensor], eager: torch.Tensor, same: torch.Tensor
) -> bool:
    """Whether an eager decode step is right: its logits ``eager`` equal ``same``, those of the step
    through the graph's kernels, where it took the same kernels (the default: both attend through
    hip's one-launch kernel); where the graph's attention is SDPA and the eager step's hip's (a
    plan's ``hip_attention="eager"``) the two may part -- a last-bit difference
    in one layer's attention flips a routing choice a few layers on (random weights: ~7% of the
    largest logit apart after 48 layers, at batch 1 as at 8 and 16; benchmarks/NOTES.md, "Eager
    decode") -- so ``step`` is run again (it rewrites the same cache slots) with every layer's
    attention held to the reference on its inputs within the derived bound, and must give ``eager``
    again, bit for bit."""
    if torch.equal(eager, same):
        return True
    from ftlab.testing.attention import decode_attention_held_to_reference

    with decode_attention_held_to_reference() as calls:
        again = step()
    return (
        bool(calls) and all(over == 0 for _, over, _ in calls) and bool(torch.equal(again, eager))
    )


def decode(
    report: Report,
    config: Qwen3MoeConfig,
    weights: ModelWeights,
    batch: int,
    gen: torch.Generator,
    length: int,
    timer,
    tp=None,
) -> None:
    """One decode step at position ``length`` for ``batch`` sequences: graph (on a GPU) and eager.
    Validated: finite logits; on a GPU the graph's equal to an eager step's through the graph's
    kernels (``DecodePlan.attention_as_captured``), and the eager step by :func:`eager_step_ok`."""
    dev = weights.embed.device
    model = Qwen3Moe(config, weights, max_batch=batch, max_seq_len=length + 8, static=True, tp=tp)
    fill_cache(model.cache)  # a prefix of `length` positions to attend over
    steps = [
        torch.randint(0, config.vocab_size, (batch, 1), generator=gen).to(dev) for _ in range(8)
    ]
    positions = torch.full((batch, 1), length, device=dev)
    graph = DecodeGraph(model, batch) if dev.type == "cuda" else None
    eager = model.forward(steps[0], positions).clone()
    ok = {"eager": bool(torch.isfinite(eager).all())}
    if graph is not None:
        # the graph's kernels, launched eagerly
        with model.planned(model.plan.attention_as_captured()):
            same = model.forward(steps[0], positions).clone()
        replayed = graph(steps[0], positions)
        ok["graph"] = bool(torch.isfinite(same).all()) and bool(torch.equal(replayed, same))
        if not ok["graph"]:  # what a failing check saw, for benchmarks/graph_replay_probe.py's hunt
            report.notes.append(
                parted_note(f"decode batch {batch}: the graph step", replayed, same)
                + which_side(graph, model, steps[0], positions, replayed.clone(), same)
            )
        ok["eager"] = ok["eager"] and eager_step_ok(
            lambda: model.forward(steps[0], positions), eager, same
        )
    used = experts_used(config, batch)
    nbytes = int(decode_bytes(config, weights, used, batch))
    launched = None
    # eager steps launched from a recorded schedule: the same kernels as eager's
    if graph is not None:
        try:
            launched = DecodeLaunches(model, batch)
            ok["launches"] = bool(torch.equal(launched(steps[0], positions), eager))
        except NotReplayable as refused:
            report.notes.append(f"decode batch {batch}: no launch schedule ({refused})")
    it = iter(range(1 << 62))
    times = {}
    if graph is not None:
        times["graph"] = timer(lambda: graph(steps[next(it) % 8], positions), 3, 20)
    if launched is not None:
        times["launches"] = timer(lambda: launched(steps[next(it) % 8], positions), 3, 20)
    times["eager"] = timer(lambda: model.forward(steps[next(it) % 8], positions), 2, 10)
    rates = decode_rows(report, batch, times, nbytes, ok)
    report.notes.append(
        f"decode batch {batch}: {nbytes / 1e9:.3f} GB of weights a step (~{used:.0f} experts a "
        f"layer): {rates}"
    )


def experts_used(config, batch: int) -> float:
    """The distinct experts a layer that a decode step of ``batch`` tokens uses, expected under
    uniform routing (``config``: its ``num_experts``, ``num_experts_per_tok``)."""
    k, e = config.num_experts_per_tok, config.num_experts
    return e * (1 - (1 - k / e) ** batch)


def decode_rows(
    report: Report, batch: int, times: dict[str, float], nbytes: int, ok: dict[str, bool]
) -> str:
    """A row per mode of ``times`` (the microseconds of a decode step of ``batch`` tokens that
    reads ``nbytes``; ``ok``: each mode's check); returns the end of the step's note: the bound
    that reading ``nbytes`` at the copy bandwidth gives, and each mode's tokens/s."""
    for mode, tm in times.items():
        label = f"decode batch {batch}: {batch / (tm * 1e-6):.0f} tokens/s"
        report.measurements.append(Measurement(label, "auto", tm, nbytes, ok[mode], mode))
    bound = batch / (nbytes / (report.copy_gbps * 1e9))
    rates = ", ".join(f"{mode} {batch / (tm * 1e-6):.0f}" for mode, tm in times.items())
    return f"bound {bound:.0f} tokens/s at {report.copy_gbps:.0f} GB/s; {rates} tokens/s"

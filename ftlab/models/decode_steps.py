"""A decode step without the ops' Python: replayed from a captured graph (:class:`DecodeGraph`), or
launched eagerly from a recorded schedule (:class:`DecodeLaunches`).

Launched op by op, a decode step of the Qwen3-30B-A3B shape spends several times longer in the
ops' Python than its kernels take (benchmarks/NOTES.md, "Eager decode"). A static model's
step has fixed shapes and buffers, so its layers' launches are the same every step but for the
values of a few input tensors: :class:`DecodeLaunches` records them once
(:func:`ftlab.launches.record`) and launches them again every step from a loop, after writing
the step's inputs into the recorded ones. Every kernel is still launched from the host at every
step -- no graph is captured -- in the order and with the arguments the ops chose.

A step: the tokens copied into the recorded buffer and the geometry of the positions rewritten in
place (``KVCache.update_geometry``: a few small torch launches); the recorded launches of the
embedding, every layer, and the last residual add with the final norm; then the logits through
the ops (the lm_head may take a Triton kernel, which a schedule does not hold).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ftlab.launches import NotReplayable, Schedule, record

if TYPE_CHECKING:
    from ftlab.models.qwen3_moe.model import Qwen3Moe
    from ftlab.models.qwen3_next.model import Qwen3Next

__all__ = ["DecodeGraph", "DecodeLaunches", "NotReplayable", "Schedule", "pipeline_step"]


def _check_step(model, batch: int, why: str) -> None:
    """ValueError unless ``model`` is static and ``batch`` within its ``max_batch``."""
    if not model.static:
        raise ValueError(f"model must be built with static=True {why}")
    if not 1 <= batch <= model.max_batch:
        raise ValueError(
            f"batch must be in [1, {model.max_batch}] (the model's max_batch), got {batch}"
        )


class DecodeGraph:
    """One decode step of a static :class:`Qwen3Moe` or :class:`Qwen3Next` (tokens ``[B, 1]``),
    captured in a CUDA/HIP graph: ``graph(tokens, positions)`` copies the inputs into the
    captured buffers, replays, and returns the captured logits buffer fp32 ``[B, 1, V]``
    (overwritten by the next replay).

    Warm-up and capture run at position ``max_seq_len - 1`` of every sequence: that cache slot
    is written by a step before any step reads it, and the recurrent state a warm-up step
    advances (a hybrid model's conv and delta states) is restored after it, so capturing
    mid-sequence corrupts nothing."""

    def __init__(self, model: Qwen3Moe | Qwen3Next, batch: int):
        _check_step(model, batch, "to be captured in a graph")
        device = model.weights.embed.device
        self.model = model  # the graph reads its caches and weights: they live as long as it does
        self.tokens = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.positions = torch.full(
            (batch, 1), model.max_seq_len - 1, dtype=torch.long, device=device
        )
        state = model.recurrent_state()
        saved = [t.clone() for t in state]
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        # compile, build and allocate outside the capture, through the kernels it takes
        with torch.cuda.stream(side), model.planned(model.plan.as_captured()):
            for _ in range(2):
                model.forward(self.tokens, self.positions)
            for t, kept in zip(state, saved, strict=True):
                t.copy_(kept)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = model.forward(self.tokens, self.positions)
        # a hybrid model's router ids of each hybrid layer, as the graph writes them every replay
        self.routed = dict(getattr(model, "routed", {}))

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.graph.replay()
        # the model's end_step reads this replay's ids, even after an eager pass in between
        if self.routed:
            self.model.routed.update(self.routed)
        return self.logits


class DecodeLaunches:
    """One decode step of a static model (tokens ``[B, 1]``) whose launches -- the embedding, every
    layer, the last add with the final norm -- were recorded: ``step(tokens, positions)`` returns
    fp32 logits ``[B, 1, V]`` (a new tensor each step), equal bit for bit to
    ``model.forward(tokens, positions)`` launched op by op.

    Raises :class:`~ftlab.launches.NotReplayable` (naming what it saw) when the model's layers do
    anything but launch through ftlab's HIP modules -- a torch kernel (SDPA's attention, an fp32
    model's casts), a Triton kernel, a CPU module -- and for hybrid or tensor-parallel models (CPU
    experts, collectives). The recording step runs at position ``max_seq_len - 1`` of every
    sequence (as :class:`DecodeGraph`'s warm-up: that slot is written before any step
    reads it), after one step op by op there that makes every one-time buffer."""

    def __init__(self, model, batch: int):
        _check_step(model, batch, "(fixed shapes and buffers) to record its step")
        if not hasattr(model, "layer_stages"):
            raise NotReplayable([f"{type(model).__name__} has no layer_stages to record"])
        if getattr(model, "hybrid", None) or getattr(model, "tp", None) is not None:
            raise NotReplayable(
                ["hybrid CPU/GPU experts or tensor parallelism: work outside the HIP modules"]
            )
        self.model = model
        dev = model.weights.embed.device
        # the step's inputs: written in place before each launch of the schedule
        self.tokens = torch.zeros((batch, 1), dtype=torch.long, device=dev)
        self.positions = torch.full((batch, 1), model.max_seq_len - 1, dtype=torch.long, device=dev)
        # modules built, one-time buffers (counters, stacked weights) made
        model.forward(self.tokens, self.positions)
        self.geo = model.geometry(self.positions, model.weights.embed.dtype)

        def step() -> torch.Tensor:  # the embedding, every layer, the last add and the final norm
            gen = model.layer_stages(model.embed(self.tokens), self.positions, self.geo)
            while True:
                try:
                    next(gen)
                except StopIteration as done:
                    return model.final_norm(*done.value)[0]

        self.schedule, self.hidden = record(step)
        # every tensor of the geometry, rewritten in place before each launch ("read", every slot of
        # each sequence, is the same for any positions)
        self.inputs = [
            k for k, v in self.geo.items() if isinstance(v, torch.Tensor) and k != "read"
        ]

    @property
    def schedule_length(self) -> int:
        """Launch calls a step in the schedule (the embedding's, the layers', the final norm's)."""
        return len(self.schedule)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits fp32 ``[B, 1, V]`` of tokens ``[B, 1]`` at ``positions [B, 1]`` (the recording's
        shapes; ValueError otherwise). Values are the caller's to check, as for an op-by-op step of
        the static model: token ids in the vocabulary, positions in ``[0, max_seq_len)`` (checking
        device tensors on the host would stall the step)."""
        if tokens.shape != self.tokens.shape or positions.shape != self.positions.shape:
            raise ValueError(
                f"tokens and positions must be {tuple(self.tokens.shape)} (the recorded batch), "
                f"got {tuple(tokens.shape)} and {tuple(positions.shape)}"
            )
        self.tokens.copy_(tokens)
        self.model.cache.update_geometry(self.geo, positions, self.inputs)
        self.schedule.launch()
        # the lm_head through the ops: it may take a Triton kernel
        return self.model.logits(self.hidden)

    __call__ = step


def pipeline_step(pipe, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """A :class:`~ftlab.models.pipeline.Pipeline`'s decode step of ``tok`` at ``pos`` (``[1, 1]``
    each) by its :attr:`~ftlab.models.pipeline.Pipeline.decode_path`: the graph (captured at the
    first step), the recorded launches (recorded at the first step; op by op on the dynamic model
    from then on if refused) or op by op. Logits fp32 ``[V]``, a tensor of its own."""
    if pipe.graph_capturable:
        if pipe._graph is None:
            pipe._graph = DecodeGraph(pipe.model, 1)
        return pipe._graph(tok, pos)[0, -1].clone()
    if pipe.decode_path == "launches":
        if pipe._launches is None:
            try:
                pipe._launches = DecodeLaunches(pipe.model, 1)
            except NotReplayable as e:
                pipe.launches_refused = str(e)
                pipe.model.static = pipe.model.cache.static = False
        step = pipe._launches or pipe.model.forward
        return step(tok, pos)[0, -1]
    return pipe.model.forward(tok, pos)[0, -1]

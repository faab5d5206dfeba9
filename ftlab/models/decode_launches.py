"""An eager decode step at the host cost of a loop: :class:`DecodeLaunches`.

Launched op by op, a decode step of the Qwen3-30B-A3B shape spends ~15-20 ms of host time in the
ops' Python against ~2.5 ms of kernels (benchmarks/NOTES.md, "Eager decode"). A static model's
step has fixed shapes and buffers, so its layers' launches are the same every step but for the
values of a few input tensors: :class:`DecodeLaunches` records them once
(:func:`ftlab.launches.record`) and launches them again every step from a loop, after writing
the step's inputs into the recorded ones. Every kernel is still launched from the host at every
step -- no graph is captured -- in the order and with the arguments the ops chose.

A step: the tokens' embedding and the positions' geometry through the ops (Python, once a step),
copied into the recorded ones; the layers' recorded launches; the last residual add, the final
norm and the logits through the ops again.
"""

from __future__ import annotations

import torch

from ftlab.launches import NotReplayable, Schedule, record

__all__ = ["DecodeLaunches", "NotReplayable", "Schedule"]


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class DecodeLaunches:
    """One decode step of a static model (tokens ``[B, 1]``) whose layers' launches were
    recorded: ``step(tokens, positions)`` returns fp32 logits ``[B, 1, V]`` (a new tensor each
    step), equal bit for bit to ``model.forward(tokens, positions)`` launched op by op.

    Raises :class:`~ftlab.launches.NotReplayable` (naming what it saw) when the model's layers do
    anything but launch through ftlab's HIP modules -- a torch kernel (SDPA's attention, an fp32
    model's casts), a Triton kernel, a CPU module -- and for hybrid or tensor-parallel models (CPU
    experts, collectives). The recording step runs at position ``max_seq_len - 1`` of every
    sequence (as :class:`~ftlab.models.pipeline.DecodeGraph`'s warm-up: that slot is written before
    any step reads it), after one step op by op there that makes every one-time buffer."""

    def __init__(self, model, batch: int):
        if not model.static:
            raise ValueError("model must be built with static=True (fixed shapes and buffers) to record its step")
        if not 1 <= batch <= model.max_batch:
            raise ValueError(f"batch must be in [1, {model.max_batch}] (the model's max_batch), got {batch}")
        if not hasattr(model, "layer_stages"):
            raise NotReplayable([f"{type(model).__name__} has no layer_stages to record"])
        if getattr(model, "hybrid", None) or getattr(model, "tp", None) is not None:
            raise NotReplayable(["hybrid CPU/GPU experts or tensor parallelism: work outside the HIP modules"])
        self.model = model
        dev = model.weights.embed.device
        tokens = torch.zeros((batch, 1), dtype=torch.long, device=dev)
        positions = torch.full((batch, 1), model.max_seq_len - 1, dtype=torch.long, device=dev)
        model.forward(tokens, positions)  # modules built, one-time buffers (counters, stacked weights) made
        self.x = model.embed(tokens)
        self.geo = model.geometry(positions, self.x.dtype)

        def layers() -> tuple[torch.Tensor, torch.Tensor]:
            gen = model.layer_stages(self.x, positions, self.geo)
            while True:
                try:
                    next(gen)
                except StopIteration as done:
                    return done.value

        self.schedule, (self.last, self.moe) = record(layers)
        # the geometry tensors the launches read (through views of them): rewritten every step
        read = {_storage(t) for t in self.schedule.tensors()}
        self.inputs = [k for k, v in self.geo.items() if isinstance(v, torch.Tensor) and _storage(v) in read]
        self._positions = positions

    @property
    def schedule_length(self) -> int:
        """Launch calls a step (the layers')."""
        return len(self.schedule)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits fp32 ``[B, 1, V]`` of tokens ``[B, 1]`` at ``positions [B, 1]`` (shapes of the
        recording: the caller checks values)."""
        if tokens.shape != self.x.shape[:2] or positions.shape != self._positions.shape:
            raise ValueError(f"tokens and positions must be {tuple(self.x.shape[:2])} (the recorded batch), got "
                             f"{tuple(tokens.shape)} and {tuple(positions.shape)}")  # fmt: skip
        m = self.model
        self.x.copy_(m.embed(tokens))
        geo = m.geometry(positions, self.x.dtype)
        for k in self.inputs:
            self.geo[k].copy_(geo[k])
        self.schedule.launch()
        *_, last = m.head_stages(self.last + self.moe)
        return last.tensors["logits"]

    __call__ = step


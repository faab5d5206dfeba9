"""How far one forward pass's stages are from another's (:meth:`Pipeline.compare
<ftlab.models.pipeline.Pipeline.compare>`): per stage, the max-abs and relative difference of its
main tensor (:class:`~ftlab.models.layers.Stage`) between two backend sets, and a table of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ftlab.models.layers import Stage

__all__ = ["StageDiff", "compare_sets", "format_compare", "stage_diffs"]


@dataclass
class StageDiff:
    stage: str
    backend: str
    max_abs: float
    rel: float  # ||a - b|| / ||b|| over the stage's main tensor


def stage_diffs(
    base: dict[str, Stage], stages: Iterable[Stage], backends: str | dict[str, str]
) -> list[StageDiff]:
    """One :class:`StageDiff` a stage of ``stages`` (a forward pass on the backend set
    ``backends``: a name, or a dict ``{op: backend}``) against the stage of its name in ``base``
    (the reference pass's, by name), their main tensors compared in fp32."""
    label = (
        backends if isinstance(backends, str) else ",".join(f"{k}={v}" for k, v in backends.items())
    )
    rows = []
    for stage in stages:
        want = base[stage.name].tensors[stage.main].float()
        got = stage.tensors[stage.main].float()
        diff = (got - want).abs()
        rows.append(
            StageDiff(
                stage.name,
                label,
                float(diff.max()),
                float(diff.norm() / want.norm().clamp(min=1e-30)),
            )
        )
    return rows


def compare_sets(make_model, ids, base_ops: dict, sets: list[tuple]) -> list[StageDiff]:
    """Every stage of the pass of ``ids`` ``[1, T]`` through a model of each backend set (``sets``:
    (label, ops map)) against the pass on ``base_ops``; ``make_model(ops)`` builds a model over an
    ops map, one at a time (each holds its own KV cache)."""
    pos = torch.arange(ids.shape[1], device=ids.device)[None]
    base = {s.name: s for s in make_model(base_ops).stages(ids, pos)}
    rows = []
    for label, ops in sets:
        rows += stage_diffs(base, make_model(ops).stages(ids, pos), label)
    return rows


def format_compare(rows: list[StageDiff]) -> str:
    width = max([len("backend"), *(len(r.backend) for r in rows)])
    stage = max([22, *(len(r.stage) for r in rows)])
    lines = [f"{'stage':<{stage}} {'backend':<{width}} {'max |diff|':>11} {'rel':>10}"]
    lines += [
        f"{r.stage:<{stage}} {r.backend:<{width}} {r.max_abs:>11.3e} {r.rel:>10.3e}" for r in rows
    ]
    return "\n".join(lines)

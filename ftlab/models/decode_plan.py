"""A model's decode plan: what its forward pass does beyond the math, decided once and frozen.

The math of a layer is the model's; the choices around it -- which ops' launches are fused, how a
decode step attends, whether the ops check their arguments, which backend each op takes -- are
this plan's, made once when the model is built (``Pipeline`` builds it) and handed in. Each
kernel an op runs is the planner's (``ftlab.backends.plan``); the plan here only says which ops
the model calls. The reasons and measurements behind each default are in benchmarks/NOTES.md
("The fusions on the GPU", "Eager decode", "Graph against eager decode: cuDNN's attention").

Some choices hold for every step (``"always"``), some only for a step launched op by op on a GPU
(``"eager"``: where the host's launches bound the step, one op call fewer pays), never inside a
captured graph. :meth:`DecodePlan.as_captured` gives the plan whose eager steps take exactly the
kernels a captured step takes, so the two can be held to each other bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import torch

from ftlab import platform as ftplatform
from ftlab.models.pipeline_args import backend_map, q4_0_path

#: when a choice holds: never, only for steps launched op by op on a GPU, or for every step
WHEN = ("never", "eager", "always")


@dataclass(frozen=True)
class DecodePlan:
    """The choices of a model's forward pass (module docstring).

    - ``backends``: op name -> backend name ("auto" for each op not named; keys checked against
      ``ftlab.models.pipeline_args.MODEL_OPS``), or one backend name for every op;
    - ``quant_path``: the path of quantized weights, linears and experts ("auto", "int8",
      "dequant");
    - ``checks``: whether the hot ops run their argument checks (off: the model's tensors come
      from a checked config and checked weights; the backends still refuse layouts they cannot
      read);
    - ``kv_store_in_rope``: a layer's KV cache written inside ``ops.qk_norm_rope``'s launch, not
      by a separate ``ops.store`` (where "store" names no other backend);
    - ``norm_in_router``: the post-attention residual add and norm inside
      ``ops.add_rmsnorm_router_topk``;
    - ``norm_in_qkv`` (a WHEN): each layer's input add and norm inside its q/k/v matvec
      (``ops.add_rmsnorm_q4_0_matmul``: decode, one stacked Q4_0 weight);
    - ``hip_attention`` (a WHEN): a decode step with decode_attention "auto" attends through
      ``ops.decode_attention`` where the planner gives it hip's one-launch kernel ("tiles": one
      launch, its splits merged in a fixed order, so replayed and eager steps agree bit for bit),
      not torch's SDPA over every slot;
    - ``attention_q8``: that attention also writes its output's Q8_1, which a Q4_0 o_proj
      matvec takes instead of quantizing its input in every block.
    """

    backends: Mapping[str, str] | str = field(default_factory=dict)
    quant_path: str = "auto"
    checks: bool = False
    kv_store_in_rope: bool = True
    norm_in_router: bool = True
    norm_in_qkv: str = "eager"
    hip_attention: str = "always"
    attention_q8: bool = True

    def __post_init__(self) -> None:
        given = self.backends if isinstance(self.backends, str) else dict(self.backends)
        object.__setattr__(self, "backends", MappingProxyType(backend_map(given)))
        q4_0_path(self.quant_path)
        for name in ("checks", "kv_store_in_rope", "norm_in_router", "attention_q8"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("norm_in_qkv", "hip_attention"):
            if getattr(self, name) not in WHEN:
                raise ValueError(f"{name} must be one of {WHEN}, got {getattr(self, name)!r}")

    def with_(self, **changes) -> DecodePlan:
        """A copy with ``changes`` (checked as a new plan is)."""
        return replace(self, **changes)

    def as_captured(self) -> DecodePlan:
        """The plan whose eager steps take the kernels a captured step takes: every "eager"
        choice "never" (a graph's warm-up builds what its capture uses)."""
        return replace(
            self,
            **{n: "never" for n in ("norm_in_qkv", "hip_attention") if getattr(self, n) == "eager"},
        )

    def attention_as_captured(self) -> DecodePlan:
        """As :meth:`as_captured`, for the attention alone (the fused norm and q/k/v matvec
        gives the two ops' bits: its contract)."""
        return replace(
            self, hip_attention="never" if self.hip_attention == "eager" else self.hip_attention
        )

    def now(self, name: str, device: torch.device) -> bool:
        """Whether the WHEN choice ``name`` holds for a step on ``device`` now (a step being
        captured is not eager)."""
        when = getattr(self, name)
        if when == "always":
            return True
        return when == "eager" and device.type == "cuda" and not ftplatform.capturing(device)


def plan_of(plan: DecodePlan | None, backends: dict[str, str] | None, q4_0_path: str) -> DecodePlan:
    """A model's plan: ``plan``, or the default one of ``backends`` and ``q4_0_path`` (not both)."""
    if plan is None:
        return DecodePlan(backends or {}, q4_0_path)
    if backends is not None or q4_0_path != "auto":
        raise ValueError("pass plan, or backends and q4_0_path (which make its default), not both")
    if not isinstance(plan, DecodePlan):
        raise TypeError(f"plan must be a ftlab.models.DecodePlan, got {type(plan).__name__}")
    return plan


class Planned:
    """What a model built over a :class:`DecodePlan` (its ``plan``) exposes of it, and the plans of
    its op calls (``op_plans``: made once a weight and row count,
    ``ftlab.models.layers.op_plan``)."""

    plan: DecodePlan

    @property
    def op_plans(self) -> dict:
        if "_op_plans" not in self.__dict__:
            self.__dict__["_op_plans"] = {}
        return self.__dict__["_op_plans"]

    @property
    def backends(self) -> Mapping[str, str]:
        """op name -> backend name (the plan's)."""
        return self.plan.backends

    @property
    def q4_0_path(self) -> str:
        """The quantized weights' path (the plan's)."""
        return self.plan.quant_path

    @contextlib.contextmanager
    def planned(self, plan: DecodePlan) -> Iterator[None]:
        """Within: the model runs by ``plan`` (e.g. ``model.plan.as_captured()``)."""
        old, self.plan = self.plan, plan
        try:
            yield
        finally:
            self.plan = old

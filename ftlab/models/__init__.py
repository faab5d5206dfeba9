"""Models built from ftlab ops: Qwen3-MoE, Qwen3-Next and Qwen3.5-MoE / Qwen3.6, their loaders and
the step-by-step :class:`~ftlab.models.pipeline.Pipeline`; :class:`DecodePlan` holds the choices a
model's forward pass makes beyond its math."""

from ftlab.models.decode_plan import DecodePlan

__all__ = ["DecodePlan"]

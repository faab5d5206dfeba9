"""Models built from ftlab ops, a package a model family -- :mod:`~ftlab.models.qwen3_moe`
(Qwen3-MoE), :mod:`~ftlab.models.qwen3_next` (Qwen3-Next and Qwen3.5-MoE / Qwen3.6): config,
model, weights, loaders -- and what they share: the layers, the loader of any checkpoint
(:mod:`~ftlab.models.loader`), the tokenizer, the tiny models, tensor parallelism and the
step-by-step :class:`~ftlab.models.pipeline.Pipeline`; :class:`DecodePlan` holds the choices a
model's forward pass makes beyond its math."""

from ftlab.models.decode_plan import DecodePlan

__all__ = ["DecodePlan"]

"""The next token of a generation from a step's logits: greedy, or nucleus (top-p) sampling at a
temperature (:meth:`Pipeline.generate <ftlab.models.pipeline.Pipeline.generate>`)."""

from __future__ import annotations

import torch

from ftlab.models import pipeline_args as check

__all__ = ["sample"]


def sample(
    logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None
) -> int:
    """A token id from logits ``[V]``: greedy when ``temperature == 0``, else nucleus
    sampling (``top_p`` in (0, 1]) over ``softmax(logits / temperature)``. The work runs where
    ``gen`` draws (the logits' device without one): the token id is all that comes to the host."""
    temperature, top_p = check.temperature(temperature), check.top_p(top_p)
    if temperature == 0:
        return int(logits.argmax())
    on = logits.device if gen is None else gen.device
    probs = torch.softmax(logits.float().to(on) / temperature, -1)
    order = probs.argsort(descending=True)
    keep = probs[order].cumsum(0) - probs[order] < top_p  # the smallest set reaching top_p
    choice = torch.multinomial(probs[order] * keep, 1, generator=gen)
    return int(order[choice])

"""A generation's loop (:meth:`Pipeline.generate <ftlab.models.pipeline.Pipeline.generate>`):
the prompt's prefill, then one decode step a new token, each token chosen on the model's device
(:func:`~ftlab.models.sampling.sample`) and its text streamed; and the same stream with its
wall-clock :class:`~ftlab.models.generation_timing.Timing` (:func:`timed_generate`)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ftlab.models import pipeline_args as check
from ftlab.models.generation_timing import Timing, timed

__all__ = ["generate", "stream", "timed_generate"]


def generate(pipe, prompt, max_new_tokens, temperature, top_p, seed, ignore_eos) -> Iterator[str]:
    """:meth:`Pipeline.generate <ftlab.models.pipeline.Pipeline.generate>`'s arguments checked,
    then its :func:`stream`."""
    if isinstance(prompt, str):
        ids = pipe._prompt_ids(prompt)
    elif not isinstance(prompt, (list, tuple, torch.Tensor)):
        raise TypeError(
            "prompt must be a str, or token ids (a list of ints or an integer tensor [T]), "
            f"got {type(prompt).__name__}"
        )
    else:
        ids = check.token_ids("prompt", prompt, pipe.config.vocab_size, pipe.max_seq_len, "cpu")
    max_new_tokens = check.max_new_tokens(max_new_tokens)
    temperature, top_p = check.temperature(temperature), check.top_p(top_p)
    check.flag("ignore_eos", ignore_eos)
    gen = torch.Generator(device=pipe.device).manual_seed(check.seed(seed))
    return stream(pipe, ids, max_new_tokens, temperature, top_p, gen, ignore_eos)


def stream(
    pipe,
    ids: list[int] | torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    gen: torch.Generator,
    ignore_eos: bool = False,
) -> Iterator[str]:
    """The text of each new token of ``pipe`` (a Pipeline) after the prompt ``ids`` (checked by
    the caller): up to ``max_new_tokens``, ending at the end-of-text token (unless
    ``ignore_eos``) or at the pipeline's max_seq_len. Lazy: the prefill runs when the first
    piece is asked for."""
    logits = pipe.prefill(ids)
    new: list[int] = []
    shown = ""
    for _ in range(max_new_tokens):
        token = pipe.sample(logits, temperature, top_p, gen)
        if token == pipe.tokenizer.eos_token_id and not ignore_eos:
            break
        new.append(token)
        text = pipe.tokenizer.decode(new)
        yield text[len(shown) :]
        shown = text
        if pipe.position >= pipe.max_seq_len:
            break
        logits = pipe.decode_step(token)


def timed_generate(pipe, prompt, max_new_tokens: int, **kw) -> Iterator[tuple[str, Timing]]:
    """generate(), with the :class:`~ftlab.models.generation_timing.Timing` so far beside each
    piece (the arguments checked here)."""
    return timed(pipe.generate(prompt, max_new_tokens, **kw))

"""How well a model predicts text: perplexity as llama.cpp's ``llama-perplexity`` counts it, and,
against a reference model's predictions, the KL divergence, the top-1 agreement and the change of
the right token's probability (``llama-perplexity --kl-divergence``'s figures).

The text's tokens are cut into windows of ``ctx`` tokens (what is left after the last whole
window is not read); each window is a fresh sequence through the model, and only the second half
of it is scored: the logits at positions ``ctx // 2 .. ctx - 2`` predict the tokens after them
(the first half gives every scored token at least ``ctx / 2`` tokens of context).

    from ftlab import eval as fteval
    pipe = Pipeline.load("model-q4_k_m.gguf", "cuda", dtype=torch.bfloat16, max_seq_len=512)
    ref = Pipeline.load("model-f32.gguf", "cuda", max_seq_len=512)
    result = fteval.evaluate(pipe, text, ctx=512, reference=ref)
    print(result.perplexity, result.kl_divergence, result.top1_agreement)

``ftlab eval PATH --text FILE`` runs it from the command line (``ftlab.cli.eval``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
from tqdm import tqdm

from ftlab.models import pipeline_args as check

__all__ = ["EvalResult", "check_ctx", "evaluate", "windows"]

#: the Δp percentiles reported (of the right token's probability, model minus reference)
PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


@dataclass
class EvalResult:
    """What :func:`evaluate` measured over ``tokens`` scored tokens of ``windows`` windows of
    ``ctx``: ``perplexity`` (exp of the mean negative log-likelihood) and ``nll`` (that mean, in
    nats); against a reference (else None): the reference's own ``reference_perplexity``, the
    mean ``kl_divergence`` KL(reference || model) in nats, ``top1_agreement`` (the share of
    scored positions where both models' most likely token is the same) and ``delta_p``
    (``{percentile: model's minus reference's probability of the right token}``).
    ``per_window``: each window's perplexity; ``token_kl`` (:func:`evaluate` with ``per_token``,
    against a reference): the KL divergence at each scored position, in text order."""

    ctx: int
    windows: int
    tokens: int
    nll: float
    perplexity: float
    per_window: list[float] = field(default_factory=list)
    reference_perplexity: float | None = None
    kl_divergence: float | None = None
    top1_agreement: float | None = None
    delta_p: dict[int, float] | None = None
    token_kl: list[float] | None = None

    def to_json(self) -> dict:
        return asdict(self)


def check_ctx(ctx: object) -> int:
    """A window's tokens: an int >= 4 (half of a window is scored)."""
    if isinstance(ctx, bool) or not isinstance(ctx, int):
        raise TypeError(f"ctx must be an int >= 4, got {ctx!r} ({type(ctx).__name__})")
    if ctx < 4:
        raise ValueError(f"ctx must be an int >= 4 (half of a window is scored), got {ctx}")
    return ctx


def windows(ids: list[int] | torch.Tensor, ctx: int) -> torch.Tensor:
    """The whole windows of ``ctx`` tokens of ``ids``, int64 ``[n, ctx]``; ValueError naming
    ``text`` when there is not one, ``ctx`` when it is not an int >= 4."""
    ctx = check_ctx(ctx)
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    n = ids.numel() // ctx
    if n == 0:
        raise ValueError(
            f"text must hold at least one window of ctx = {ctx} tokens, got {ids.numel()} tokens"
        )
    return ids[: n * ctx].view(n, ctx)


def _logits(pipe, window: torch.Tensor) -> torch.Tensor:
    """fp32 logits ``[ctx, V]`` of one window, a fresh sequence at positions ``0 .. ctx - 1``
    (the pipeline's own sequence, whose cache the window overwrites, is ended: position 0)."""
    pipe.reset()
    tokens = window.to(pipe.device)[None]
    positions = torch.arange(window.numel(), device=pipe.device)[None]
    with torch.no_grad():
        out = pipe.model.forward(tokens, positions)[0].float()
    pipe.model.end_step()
    return out


def evaluate(
    pipe,
    text: str | list[int] | torch.Tensor,
    ctx: int = 512,
    reference=None,
    progress: bool = True,
    per_token: bool = False,
) -> EvalResult:
    """Perplexity of ``pipe`` (a :class:`~ftlab.models.pipeline.Pipeline`) on ``text`` (a str,
    tokenized by the pipeline's tokenizer, or token ids) in windows of ``ctx`` tokens (module
    docstring); with ``reference`` (another Pipeline of the same vocabulary and tokenizer) the KL
    divergence, top-1 agreement and Δp against its predictions. ``progress``: a bar over the
    windows. ``per_token``: keep the KL divergence of each scored position
    (:attr:`EvalResult.token_kl`). ValueError naming ``ctx`` (not an int >= 4, or over a model's
    max_seq_len), ``text`` (fewer tokens than one window, or an empty string) or ``reference``
    (another vocabulary or tokenizer)."""
    if isinstance(text, str):
        if not text:
            raise ValueError("text must be a non-empty string, got ''")
        ids = pipe.tokenizer.encode(text)
    else:
        ids = check.token_ids("text", text, pipe.config.vocab_size, 2**62, "cpu").tolist()
    chunks = windows(ids, ctx)
    for name, p in (("pipe", pipe), ("reference", reference)):
        if p is not None and ctx > p.max_seq_len:
            raise ValueError(
                f"ctx must fit the {name}'s max_seq_len = {p.max_seq_len}, got {ctx} "
                f"(load it with max_seq_len >= {ctx})"
            )
    if reference is not None:
        _same_vocabulary(pipe, reference, text)
    first = ctx // 2
    nll, counted, per_window = 0.0, 0, []
    kl, agree, deltas, ref_nll, token_kl = 0.0, 0, [], 0.0, []
    bar = tqdm(chunks, desc="perplexity", unit="window", disable=not progress)
    for window in bar:
        logp = torch.log_softmax(_logits(pipe, window)[first:-1].double(), -1)
        target = window[first + 1 :].to(logp.device)
        right = logp.gather(-1, target[:, None])[:, 0]
        window_nll = -float(right.sum())
        nll += window_nll
        counted += target.numel()
        per_window.append(math.exp(window_nll / target.numel()))
        if reference is not None:
            ref = torch.log_softmax(_logits(reference, window)[first:-1].double(), -1)
            ref = ref.to(logp.device)
            ref_right = ref.gather(-1, target[:, None])[:, 0]
            ref_nll -= float(ref_right.sum())
            position_kl = (ref.exp() * (ref - logp)).sum(-1)
            kl += float(position_kl.sum())
            if per_token:
                token_kl += position_kl.tolist()
            agree += int((ref.argmax(-1) == logp.argmax(-1)).sum())
            deltas.append((right.exp() - ref_right.exp()).cpu())
        bar.set_postfix(ppl=f"{math.exp(nll / counted):.4f}")
    result = EvalResult(ctx, len(chunks), counted, nll / counted, math.exp(nll / counted))
    result.per_window = per_window
    if reference is not None:
        dp = torch.cat(deltas)
        result.reference_perplexity = math.exp(ref_nll / counted)
        result.kl_divergence = kl / counted
        result.top1_agreement = agree / counted
        result.delta_p = {q: float(torch.quantile(dp, q / 100)) for q in PERCENTILES}
        result.token_kl = token_kl if per_token else None
    return result


def _same_vocabulary(pipe, reference, text) -> None:
    """ValueError naming ``reference`` unless it shares ``pipe``'s vocabulary size and, for a
    text, its tokenization."""
    a, b = pipe.config.vocab_size, reference.config.vocab_size
    if a != b:
        raise ValueError(
            f"reference must have the model's vocabulary ({a} tokens), got one of {b} tokens"
        )
    if isinstance(text, str):
        sample = text[:2000]
        if pipe.tokenizer.encode(sample) != reference.tokenizer.encode(sample):
            raise ValueError(
                "reference must tokenize the text as the model does (another tokenizer?)"
            )

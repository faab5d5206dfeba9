"""``ftlab eval``: a model's perplexity on a text, as llama.cpp's ``llama-perplexity`` counts it,
and against a reference model (:mod:`ftlab.eval`): KL divergence, top-1 agreement, Δp."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ftlab.cli.options import HelpFormatter, add_device, option
from ftlab.eval import check_ctx
from ftlab.models import pipeline_args as check

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def cmd_eval(args) -> int:
    """Load the model (and the reference), read the text, evaluate, print and write the JSON."""
    import torch

    from ftlab import eval as fteval
    from ftlab.models.pipeline import Pipeline

    text_path = Path(args.text)
    if not text_path.is_file():
        raise ValueError(f"--text must be a text file, got {args.text!r} (no such file)")
    try:
        text = text_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--text must be UTF-8 text: {args.text} is not ({e.reason})") from None
    where = args.device
    if where == "auto":
        where = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, DTYPES[args.dtype])

    def load(path, dt):
        return Pipeline.load(path, where, backends=args.backend, dtype=dt, max_seq_len=args.ctx)

    pipe = load(args.model, dtype)
    reference = load(args.reference, torch.float32) if args.reference else None
    result = fteval.evaluate(pipe, text, ctx=args.ctx, reference=reference)
    print(
        f"perplexity {result.perplexity:.4f} over {result.tokens} tokens ({result.windows} "
        f"windows of {result.ctx}, the second half of each scored)"
    )
    if reference is not None:
        print(
            f"reference perplexity {result.reference_perplexity:.4f}; mean KL divergence "
            f"{result.kl_divergence:.6f}; top-1 agreement {100 * result.top1_agreement:.2f}%; "
            f"delta p median {result.delta_p[50]:+.5f}, 1% {result.delta_p[1]:+.5f}, "
            f"99% {result.delta_p[99]:+.5f}"
        )
    if args.json:
        out = {"model": str(args.model), "reference": args.reference, "text": str(text_path)}
        out |= {"device": str(pipe.device), "dtype": args.dtype, "backend": args.backend}
        Path(args.json).write_text(json.dumps(out | result.to_json(), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def add_parser(sub, common: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "eval",
        parents=common,
        formatter_class=HelpFormatter,
        help="a model's perplexity on a text, and its divergence from a reference model",
        description="Perplexity of a model on a text in windows of --ctx tokens (the second half "
        "of each scored, as llama-perplexity counts it); with --reference, the mean KL divergence "
        "from the reference's predictions, the top-1 agreement and the percentiles of the change "
        "in the right token's probability.",
    )
    p.set_defaults(fn=cmd_eval)
    p.add_argument("model", help="a tiny model name, a HF directory or a .gguf file")
    p.add_argument(
        "--text", required=True, help="the UTF-8 text file to score (default: none: required)"
    )
    p.add_argument(
        "--ctx",
        type=option(int, "an int", check_ctx),
        default=512,
        help="tokens a window (an int >= 4)",
    )
    p.add_argument("--reference", help="the model whose predictions to compare (default: none)")
    p.add_argument(
        "--backend",
        default="auto",
        choices=["auto", *check.backend_names()],
        help="backend of every op of the model (the reference model's too)",
    )
    add_device(p)
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="fp32",
        help="the model's dense weights and activations (the reference runs in fp32)",
    )
    p.add_argument("--json", help="also write the figures as JSON here (default: not written)")

"""ftlab's tokenizer and perplexity beside llama.cpp's on the same GGUF files and text: for each
file, the token ids of ``llama-tokenize`` against ftlab's (``Tokenizer.from_gguf``), and the
final perplexity of ``llama-perplexity`` against ``ftlab.eval`` (same ``--ctx``, windows and
scored halves), each backend asked for. Writes JSON and Markdown into ``benchmarks/results/``.

    python benchmarks/perplexity_vs_llama_cpp.py --bin /path/to/llama.cpp/build/bin \\
        --text held_out.txt --ctx 128 model-f32.gguf model-q4_0.gguf [--backend reference triton]

The text defaults to the first ``--chars`` characters of the trained models' held-out text
(:func:`ftlab.models.trained.held_out_text`: the Python standard library's docstrings the training
never saw).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def held_out_text(chars: int) -> str:
    from ftlab.models.trained import held_out_text as text

    return text()[:chars]


def llama_tokens(bin_dir: Path, gguf: Path, text_file: Path) -> list[int]:
    """``llama-tokenize``'s ids of the text (no BOS added: these files' tokenizers add none)."""
    out = subprocess.run(
        [
            str(bin_dir / "llama-tokenize"),
            "-m",
            str(gguf),
            "-f",
            str(text_file),
            "--ids",
            "--log-disable",
            "--no-escape",
            "--no-bos",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def llama_perplexity(bin_dir: Path, gguf: Path, text_file: Path, ctx: int) -> float:
    """``llama-perplexity``'s final estimate over windows of ``ctx`` tokens (CPU, 2 threads)."""
    res = subprocess.run(
        [
            str(bin_dir / "llama-perplexity"),
            "-m",
            str(gguf),
            "-f",
            str(text_file),
            "-c",
            str(ctx),
            "-b",
            str(ctx),
            "-t",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", res.stdout + res.stderr)
    if not found:
        raise RuntimeError(
            f"llama-perplexity gave no estimate:\n{(res.stdout + res.stderr)[-2000:]}"
        )
    return float(found.group(1))


def markdown(head: dict) -> str:
    """The results' table: per file and backend, whether the tokens equal llama.cpp's, both
    perplexities, their mean negative log-likelihoods (nats) and the perplexities' difference."""
    lines = [
        f"# ftlab vs llama.cpp: tokens and perplexity ({head['date']}, {head['device']['name']}, "
        f"ftlab "
        f"{head['ftlab_commit']})",
        "",
        f"Text: {head['text_chars']} characters; {head['llama_cpp']}; ftlab.eval and "
        "llama-perplexity over the same windows, the second half of each scored.",
        "",
        "| file | backend | ctx | tokens equal | ftlab ppl | llama.cpp ppl | ftlab nll | "
        "llama.cpp nll | ppl difference |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['file']} | {r['backend']} | {r['ctx']} | {r['tokens_equal_llama_cpp']} | "
        f"{r['ftlab_perplexity']:.6g} | {r['llama_cpp_perplexity']:.6g} | "
        f"{math.log(r['ftlab_perplexity']):.5f} | {math.log(r['llama_cpp_perplexity']):.5f} | "
        f"{100 * r['relative_difference']:+.3f}% |"
        for r in head["rows"]
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="+", type=Path)
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp's build/bin")
    ap.add_argument("--text", type=Path)
    ap.add_argument("--chars", type=int, default=20000)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--backend", nargs="+", default=["reference"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--name", default="perplexity-vs-llama-cpp")
    args = ap.parse_args(argv)
    from ftlab import eval as fteval
    from ftlab.formats.gguf import open_gguf
    from ftlab.models.pipeline import Pipeline
    from ftlab.models.tokenizer import Tokenizer

    text = args.text.read_text() if args.text else held_out_text(args.chars)
    text_file = Path(tempfile.mkdtemp()) / "text.txt"  # what the llama.cpp tools read
    text_file.write_text(text)
    rows = []
    try:
        for gguf in args.gguf:
            ours = Tokenizer.from_gguf(open_gguf(gguf)).encode(text)
            theirs = llama_tokens(args.bin, gguf, text_file)
            same = ours == theirs
            first = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None
            )
            ppl_llama = llama_perplexity(args.bin, gguf, text_file, args.ctx)
            for backend in args.backend:
                pipe = Pipeline.load(str(gguf), args.device, backends=backend, max_seq_len=args.ctx)
                got = fteval.evaluate(pipe, ours, ctx=args.ctx, progress=False)
                rows.append(
                    {
                        "file": f"{gguf.parent.name}/{gguf.name}",
                        "backend": backend,
                        "tokens": len(ours),
                        "tokens_equal_llama_cpp": same,
                        "first_differing_token": first,
                        "llama_cpp_tokens": len(theirs),
                        "ctx": args.ctx,
                        "windows": got.windows,
                        "ftlab_perplexity": got.perplexity,
                        "llama_cpp_perplexity": ppl_llama,
                        "relative_difference": got.perplexity / ppl_llama - 1,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(text_file.parent, ignore_errors=True)
    date = datetime.date.today().isoformat()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    head = {
        "name": args.name,
        "date": date,
        # as the bench reports describe theirs (benchmarks/results/*.json)
        "device": {
            "name": args.device if args.device != "cpu" else f"CPU ({platform.machine()})",
            "arch": args.device,
            "date": date,
            "torch": torch.__version__,
            "commit": commit,
        },
        "ftlab_commit": commit,
        "llama_cpp": "llama-cpp-python 0.3.36's vendored source, CPU build",
        "text_chars": len(text),
        "rows": rows,
        "results": [],  # no bench measurements (a bench report's key): the comparison is in rows
    }
    stem = ROOT / "benchmarks" / "results" / f"{date}-{args.device}-{args.name}"
    stem.with_suffix(".json").write_text(json.dumps(head, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(head))
    print(stem.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

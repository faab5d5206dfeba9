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
import os
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


def _llama_perplexity_run(bin_dir: Path, gguf: Path, ctx: int, *extra: str) -> str:
    """llama-perplexity's output. Its log is written by a thread of its own, which at exit may
    not have written the last lines (the summary: llama.cpp leaks its logger, issue #22142) when
    the compute threads hold every core: it computes on one core fewer than the machine has, and
    runs again, up to 3 times, until the output holds its summary."""
    threads = str(max(1, (os.cpu_count() or 2) - 1))
    for _ in range(3):
        res = subprocess.run(
            [str(bin_dir / "llama-perplexity"), "-m", str(gguf), "-c", str(ctx), "-b", str(ctx)]
            + ["-t", threads, *extra],
            capture_output=True,
            text=True,
        )
        out = res.stdout + res.stderr
        if "Final estimate" in out or "Same top p" in out:
            break
    return out


def llama_kl_divergence(bin_dir: Path, gguf: Path, base: Path, ctx: int) -> dict:
    """``llama-perplexity --kl-divergence`` of ``gguf`` against the logits saved in ``base``
    (``--kl-divergence-base``, of the reference file over the same text): mean KLD and the share
    of positions with the same top token."""
    out = _llama_perplexity_run(
        bin_dir, gguf, ctx, "--kl-divergence-base", str(base), "--kl-divergence"
    )
    kld = re.search(r"Mean\s+KLD:\s+([-0-9.e]+)", out)
    top = re.search(r"Same top p:\s+([0-9.]+)", out)
    if not (kld and top):
        raise RuntimeError(f"llama-perplexity gave no KL divergence:\n{out[-2000:]}")
    return {"kl_divergence": float(kld.group(1)), "top1_agreement": float(top.group(1)) / 100}


def llama_perplexity(
    bin_dir: Path, gguf: Path, text_file: Path, ctx: int, save_base: Path | None = None
) -> float:
    """``llama-perplexity``'s final estimate over windows of ``ctx`` tokens (CPU);
    ``save_base``: its logits saved there too (``--kl-divergence-base``)."""
    extra = ["--kl-divergence-base", str(save_base)] if save_base else []
    out = _llama_perplexity_run(bin_dir, gguf, ctx, "-f", str(text_file), *extra)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", out)
    if not found:
        raise RuntimeError(f"llama-perplexity gave no estimate:\n{out[-2000:]}")
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
    kld = [r for r in head["rows"] if "llama_cpp_kl_divergence" in r]
    if kld:
        lines += [
            "",
            f"Against {head['reference']} (ftlab.eval with the reference backend on it; "
            "llama-perplexity --kl-divergence over its saved logits):",
            "",
            "| file | backend | ftlab KLD | llama.cpp KLD | KLD ratio | ftlab top-1 | "
            "llama.cpp top-1 |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['file']} | {r['backend']} | {r['ftlab_kl_divergence']:.6f} | "
            f"{r['llama_cpp_kl_divergence']:.6f} | "
            f"{r['ftlab_kl_divergence'] / max(r['llama_cpp_kl_divergence'], 1e-12):.3f} | "
            f"{r['ftlab_top1_agreement']:.2%} | {r['llama_cpp_top1_agreement']:.2%} |"
            for r in kld
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
    ap.add_argument(
        "--reference",
        type=Path,
        help="a full-precision GGUF of the same model: each file's KL divergence and top-1 "
        "agreement against it, by ftlab.eval and by llama-perplexity --kl-divergence",
    )
    args = ap.parse_args(argv)
    from ftlab import eval as fteval
    from ftlab.formats.gguf import open_gguf
    from ftlab.models.pipeline import Pipeline
    from ftlab.models.tokenizer import Tokenizer

    text = args.text.read_text() if args.text else held_out_text(args.chars)
    text_file = Path(tempfile.mkdtemp()) / "text.txt"  # what the llama.cpp tools read
    text_file.write_text(text)
    rows = []
    base = text_file.parent / "base.kld"  # the reference's logits, as llama-perplexity saves them
    try:
        if args.reference:
            llama_perplexity(args.bin, args.reference, text_file, args.ctx, save_base=base)
        ref = (
            Pipeline.load(
                str(args.reference), args.device, backends="reference", max_seq_len=args.ctx
            )
            if args.reference
            else None
        )
        for gguf in args.gguf:
            ours = Tokenizer.from_gguf(open_gguf(gguf)).encode(text)
            theirs = llama_tokens(args.bin, gguf, text_file)
            same = ours == theirs
            first = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None
            )
            ppl_llama = llama_perplexity(args.bin, gguf, text_file, args.ctx)
            kld_llama = (
                llama_kl_divergence(args.bin, gguf, base, args.ctx) if args.reference else None
            )
            for backend in args.backend:
                pipe = Pipeline.load(str(gguf), args.device, backends=backend, max_seq_len=args.ctx)
                got = fteval.evaluate(pipe, ours, ctx=args.ctx, reference=ref, progress=False)
                rows.append(
                    {
                        "file": f"{gguf.resolve().parent.name}/{gguf.name}",
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
                if kld_llama:
                    rows[-1] |= {
                        "ftlab_kl_divergence": got.kl_divergence,
                        "llama_cpp_kl_divergence": kld_llama["kl_divergence"],
                        "ftlab_top1_agreement": got.top1_agreement,
                        "llama_cpp_top1_agreement": kld_llama["top1_agreement"],
                    }
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
        "reference": str(args.reference.name) if args.reference else None,
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

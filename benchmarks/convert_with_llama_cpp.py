"""An HF checkpoint directory into a GGUF file by llama.cpp's own converter
(``convert_hf_to_gguf.py``), for checking ftlab's reader and numerics on files ftlab did not write.

llama.cpp's converter names a byte-level BPE tokenizer's pre-tokenizer (``tokenizer.ggml.pre``) by
a hash of the ids its tokenizer gives a fixed text, from a table of published models; a tokenizer
of ftlab's own (the tiny and trained models' vocabularies) is in no table, and the converter stops
("BPE pre-tokenizer was not recognized"). Here the name comes instead from the tokenizer's own
pre-tokenizer, read as ftlab reads it (:func:`ftlab.models.tokenizer.pre_name`: the expression
that splits the text), and the converter runs unchanged otherwise.

    python benchmarks/convert_with_llama_cpp.py --llama-cpp /path/to/llama.cpp \\
        HF_DIR --outfile model-f32.gguf [--outtype f32|f16|bf16|q8_0]

Everything after the llama.cpp directory is the converter's own arguments.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pre_tokenizer_of(hf_dir: Path) -> str:
    """The ``tokenizer.ggml.pre`` name of ``hf_dir/tokenizer.json``."""
    from tokenizers import Tokenizer

    sys.path.insert(0, str(ROOT))
    from ftlab.models.tokenizer import pre_name

    return pre_name(Tokenizer.from_file(str(hf_dir / "tokenizer.json")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp's source directory")
    ap.add_argument("model", type=Path, help="the HF checkpoint directory")
    args, rest = ap.parse_known_args(argv)
    script = args.llama_cpp / "convert_hf_to_gguf.py"
    if not script.is_file():
        ap.error(f"--llama-cpp must hold convert_hf_to_gguf.py, got {args.llama_cpp}")
    if not (args.model / "tokenizer.json").is_file():
        ap.error(f"model must be an HF directory with a tokenizer.json, got {args.model}")
    name = pre_tokenizer_of(args.model)
    # the converter's own imports: its gguf-py (not the gguf package ftlab imported) and its
    # conversion package
    for mod in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
        del sys.modules[mod]
    sys.path[:0] = [str(args.llama_cpp / "gguf-py"), str(args.llama_cpp)]
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: name
    print(f"tokenizer.ggml.pre: {name} (from {args.model / 'tokenizer.json'})", flush=True)
    sys.argv = [str(script), str(args.model), *rest]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

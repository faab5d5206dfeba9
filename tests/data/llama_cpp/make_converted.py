"""Writes the GGUF fixtures of this directory that llama.cpp's own converter made (see README.md).

One small HF checkpoint of each family -- Qwen3-MoE, Qwen3.5-MoE, Qwen3-Next -- with deterministic
random weights that bf16 holds exactly (:func:`checkpoint`, which the tests call again to rebuild
the same directory) and the tiny models' BPE tokenizer, converted by llama.cpp's
``convert_hf_to_gguf.py`` (through ``benchmarks/convert_with_llama_cpp.py``, which names the
tokenizer's pre-tokenizer: llama.cpp's table of hashes knows published vocabularies only) into a
BF16 GGUF, then quantized by ``llama-quantize`` into Q4_K_M. ``llama-tokenize``'s ids of
:data:`TEXT` in each file go to ``converted.json``, beside each checkpoint's weights digest. Run
from the repository root:

    python tests/data/llama_cpp/make_converted.py /path/to/llama.cpp /path/to/llama.cpp/build/bin
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
#: a text whose splits differ between byte-level BPE pre-tokenizers: digit runs, contractions,
#: whitespace runs, punctuation, non-ASCII letters and an emoji
TEXT = (
    'def ratio(a, b):\n    """Return a / b, rounded to 3 places: 1234567 / 89 = 13871.539."""\n'
    "\n\n   It's what we'd call a 'well-formed' case -- naïve café, Größe, 東京 🚀!\t\tDone.\n"
)
#: family -> (tiny model it takes its shape from, shape changes, converter arguments)
FAMILIES = {
    "qwen3moe": ("tiny-qwen3-moe", {}, []),
    "qwen35moe": (
        "tiny-qwen35-moe",
        dict(num_hidden_layers=2, num_experts=4, shared_expert_intermediate_size=64),
        ["--no-mtp"],
    ),
    "qwen3next": (
        "tiny-qwen3-next",
        dict(num_hidden_layers=2, full_attention_interval=2, num_experts=4),
        ["--no-mtp"],
    ),
}


def checkpoint(family: str, path: Path) -> str:
    """The HF checkpoint of ``family`` into directory ``path`` (config, bf16-exact f32 weights,
    tokenizer); returns the SHA-256 of its weights' bytes in name order."""
    from safetensors.torch import save_file

    from ftlab.models import tiny
    from ftlab.models.qwen3_next.tiny import HYBRID_MODELS, hybrid_config, hybrid_weights

    name, changes, _ = FAMILIES[family]
    if name in HYBRID_MODELS:
        spec = {**HYBRID_MODELS[name], **changes}
        config = hybrid_config(name, tiny.VOCAB_SIZE, spec)
        weights = hybrid_weights(name, tiny.VOCAB_SIZE, spec)
    else:
        config, weights = tiny.hf_config(name), tiny.random_weights(name)
    weights = {k: v.to(torch.bfloat16).float().contiguous() for k, v in sorted(weights.items())}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    tiny.train_tokenizer().save(str(path / "tokenizer.json"))
    digest = hashlib.sha256()
    for k, v in weights.items():
        digest.update(k.encode() + v.numpy().tobytes())
    return digest.hexdigest()


def tokens(bin_dir: Path, gguf: Path, text: Path) -> list[int]:
    """``llama-tokenize``'s ids (benchmarks/perplexity_vs_llama_cpp.py's call)."""
    spec = importlib.util.spec_from_file_location(
        "perplexity_vs_llama_cpp", ROOT / "benchmarks" / "perplexity_vs_llama_cpp.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.llama_tokens(bin_dir, gguf, text)


def main(llama_cpp: Path, bin_dir: Path) -> None:
    record = {"text": TEXT, "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text.txt"
        text.write_text(TEXT, encoding="utf-8")
        for family, (_, _, extra) in FAMILIES.items():
            hf = Path(tmp) / family
            digest = checkpoint(family, hf)
            bf16 = HERE / f"converted-{family}-bf16.gguf"
            subprocess.run(
                [sys.executable, ROOT / "benchmarks/convert_with_llama_cpp.py"]
                + ["--llama-cpp", llama_cpp, hf, "--outfile", bf16, "--outtype", "bf16", *extra],
                check=True,
            )
            q4km = HERE / f"converted-{family}-q4_k_m.gguf"
            subprocess.run([bin_dir / "llama-quantize", bf16, q4km, "Q4_K_M", "1"], check=True)
            for f in (bf16, q4km):
                record["files"][f.name] = {
                    "family": family,
                    "checkpoint_sha256": digest,
                    "llama_tokenize_ids": tokens(bin_dir, f, text),
                }
    (HERE / "converted.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

"""The trained small models ftlab ships: one of each family, trained on the Python standard
library's docstrings and documentation by ``benchmarks/train_tiny.py`` (its docstring says how),
each in ``ftlab/models/trained/<name>/``: ``weights.safetensors`` (bf16; every expert bank
``[E, M, K]`` stored as its rank-r factors ``A [E, M, r]`` and ``B [E, r, K]``), ``config.json``,
``tokenizer.json``; ``heldout.txt`` beside them is the text the training never saw.

:func:`checkpoint` expands a shipped model into a HF checkpoint (per-expert tensors fp32, the
products ``A @ B`` -- the full matrices every file and backend is measured against);
:func:`write_files` writes its HF directory and GGUF files (fp32 and Q4_0), as
:mod:`ftlab.models.tiny` does for the random tiny models, which registers the trained ones found
here under their names (:data:`TRAINED_MODELS`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import sysconfig
from pathlib import Path

import torch

__all__ = [
    "HELD_OUT",
    "ROOT",
    "TRAINED_MODELS",
    "checkpoint",
    "corpus",
    "digest",
    "held_out_text",
    "write_files",
]

ROOT = Path(__file__).resolve().parent / "trained"
#: the held-out text (the documents the training never saw)
HELD_OUT = ROOT / "heldout.txt"
#: the trained models shipped: name -> its directory (those whose weights are here)
TRAINED_MODELS: dict[str, Path] = {
    p.parent.name: p.parent for p in sorted(ROOT.glob("*/weights.safetensors"))
}
TEXT_PREFIX = "model.language_model."
ARCHITECTURES = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen3_next": "Qwen3NextForCausalLM"}
#: standard-library folders whose docstrings are not read (tests, tools, vendored code)
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo", "__pycache__"}


def _held_out(key: str) -> bool:
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % 20 == 0


def corpus() -> tuple[list[str], list[str]]:
    """(training documents, held-out documents) of the trained models' text: the standard
    library's docstrings (over 40 characters) module by module in path order, then the
    documentation topics (``pydoc_data``); held out: every module whose path hashes to 0 mod 20,
    every 20th topic."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train, held = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if SKIP_DIRS & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        docs = [ast.get_docstring(n) for n in ast.walk(tree) if isinstance(n, kinds)]
        text = "\n\n".join(d for d in docs if d and len(d) > 40)
        if text:
            (held if _held_out(rel) else train).append(text)
    from pydoc_data import topics

    for i, name in enumerate(sorted(topics.topics)):
        (held if i % 20 == 0 else train).append(topics.topics[name])
    return train, held


def held_out_text() -> str:
    """The held-out text: :data:`HELD_OUT` where the trained models are shipped (what their
    training left out on the machine that trained them), else the held-out documents of this
    Python's standard library (:func:`corpus`), joined by blank lines."""
    if HELD_OUT.is_file():
        return HELD_OUT.read_text(encoding="utf-8")
    return "\n\n".join(corpus()[1])


def digest(src: Path) -> str:
    """A hash of a shipped model's files, of this expansion and of the GGUF writers."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for code in (
        here / "trained.py",
        here / "qwen3_moe" / "gguf.py",
        here / "qwen3_next" / "gguf_write.py",
        here / "qwen3_next" / "gguf_layout.py",
        here / "qwen3_next" / "tiny.py",
    ):
        h.update(code.read_bytes())
    for name in ("weights.safetensors", "config.json", "tokenizer.json"):
        h.update((src / name).read_bytes())
    return h.hexdigest()[:12]


def checkpoint(src: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(HF ``config.json`` dict, checkpoint-named fp32 weights) of the shipped model in ``src``:
    each expert bank's factors multiplied out and cut into per-expert ``gate_proj``, ``up_proj``
    (the bank's first and second halves of rows) and ``down_proj``; a Qwen3.5-MoE's text model
    under ``model.language_model.`` in a ``Qwen3_5MoeForConditionalGeneration`` config."""
    from safetensors.torch import load_file

    config = json.loads((src / "config.json").read_text())
    shipped = load_file(str(src / "weights.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for key, value in shipped.items():
        if key.endswith(".lr_b"):
            continue
        if not key.endswith(".lr_a"):
            out[key] = value.float()
            continue
        bank_name = key[: -len(".lr_a")]
        bank = value.float() @ shipped[bank_name + ".lr_b"].float()  # [E, M, K]
        experts, kind = bank_name.rsplit(".", 1)
        for j in range(bank.shape[0]):
            if kind == "gate_up_proj":
                gate, up = bank[j].chunk(2, dim=0)
                out[f"{experts}.{j}.gate_proj.weight"] = gate.contiguous()
                out[f"{experts}.{j}.up_proj.weight"] = up.contiguous()
            else:
                out[f"{experts}.{j}.down_proj.weight"] = bank[j].contiguous()
    if config["model_type"] == "qwen3_5_moe_text":
        out = {
            (k if k.startswith("lm_head.") else TEXT_PREFIX + k[len("model.") :]): v
            for k, v in out.items()
        }
        config = {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            "tie_word_embeddings": config["tie_word_embeddings"],
            "torch_dtype": "float32",
            "text_config": config,
        }
    # the class a checkpoint names (a config saved from a config object names none): what
    # transformers' Auto classes and llama.cpp's converter read
    if "architectures" not in config:
        config["architectures"] = [ARCHITECTURES[config["model_type"]]]
    config["torch_dtype"] = "float32"
    return config, out


def write_files(src: Path, path: Path) -> None:
    """The shipped model in ``src`` as the files a tiny model has, into ``path``: its HF directory
    (``config.json``, ``model.safetensors``, ``tokenizer.json``) and ``model-f32.gguf``,
    ``model-q4_0.gguf`` (the tokenizer in their metadata)."""
    from gguf import GGMLQuantizationType as QT
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    config, weights = checkpoint(src)
    tokenizer = Tokenizer.from_file(str(src / "tokenizer.json"))
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    if config["model_type"] == "qwen3_moe":
        from ftlab.models.loader import load_hf, save_gguf
        from ftlab.models.tokenizer import gguf_metadata

        cfg, loaded = load_hf(path, dtype=torch.float32, progress=False)
        meta = gguf_metadata(tokenizer)
        save_gguf(path / "model-f32.gguf", cfg, loaded, metadata=meta)
        save_gguf(path / "model-q4_0.gguf", cfg, loaded, quantize=True, metadata=meta)
        return
    from ftlab.models.qwen3_next.tiny import write_hybrid_gguf

    write_hybrid_gguf(path / "model-f32.gguf", config, weights, tokenizer, QT.F32)
    write_hybrid_gguf(path / "model-q4_0.gguf", config, weights, tokenizer, QT.Q4_0)

"""Tokenizers for the models: HF ``tokenizer.json`` (through the ``tokenizers`` package) or a
GGUF file's ``tokenizer.ggml.*`` metadata (byte-level BPE: tokens + merges), with the chat
template when the checkpoint has one."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers


class Tokenizer:
    """Text <-> token ids."""

    def __init__(
        self,
        backend: HFTokenizer,
        eos_token_id: int | None = None,
        chat_template: str | None = None,
    ):
        self.backend = backend
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """``tokenizer.json`` (+ ``tokenizer_config.json`` for eos and the chat template)."""
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{path}: no tokenizer.json")
        backend = HFTokenizer.from_file(str(file))
        extra = {}
        if (path / "tokenizer_config.json").is_file():
            extra = json.loads((path / "tokenizer_config.json").read_text())
        eos = extra.get("eos_token")
        eos_id = backend.token_to_id(eos if isinstance(eos, str) else "<|endoftext|>")
        return cls(backend, eos_id, extra.get("chat_template"))

    @classmethod
    def from_gguf(cls, reader) -> Tokenizer:
        """From a GGUFReader's ``tokenizer.ggml.*`` fields (model ``gpt2``: byte-level BPE)."""
        from ftlab.models.loader import CheckpointError

        def field(key: str):
            f = reader.fields.get(key)
            if f is None:
                return None
            return [bytes(f.parts[i]).decode("utf-8") if f.types[-1].name == "STRING" else f.parts[i].tolist()[0]
                    for i in f.data]  # fmt: skip

        kind = field("tokenizer.ggml.model")
        if kind is None:
            raise CheckpointError("GGUF file has no tokenizer (tokenizer.ggml.model)")
        if kind[0] != "gpt2":
            raise CheckpointError(
                f"tokenizer.ggml.model {kind[0]!r} is not supported (byte-level BPE 'gpt2' only)"
            )
        tokens = field("tokenizer.ggml.tokens")
        merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges") or []]
        bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
        backend = HFTokenizer(bpe)
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        eos = field("tokenizer.ggml.eos_token_id")
        template = field("tokenizer.chat_template")
        return cls(backend, eos[0] if eos else None, template[0] if template else None)


def gguf_metadata(tokenizer: HFTokenizer) -> dict:
    """``tokenizer.ggml.*`` metadata of a byte-level BPE tokenizer, as llama.cpp reads it."""
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    special = {a["content"] for a in data.get("added_tokens", []) if a.get("special")}
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": [
            3 if t in special else 1 for t in tokens
        ],  # 3: control, 1: normal
    }
    eos = tokenizer.token_to_id("<|endoftext|>")
    if eos is not None:
        meta["tokenizer.ggml.eos_token_id"] = eos
    return meta

"""Tokenizers for the models: HF ``tokenizer.json`` (through the ``tokenizers`` package) or a
GGUF file's ``tokenizer.ggml.*`` metadata (byte-level BPE: tokens + merges), with the chat
template when the checkpoint has one."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from ftlab.formats import CheckpointError
from ftlab.formats.gguf import GGUFError, field_value
from ftlab.formats.gguf_read import GGUFFile

#: llama.cpp's regular expressions of the byte-level BPE pre-tokenizers (``tokenizer.ggml.pre``),
#: applied in turn, each splitting the pieces the one before made (llama-vocab.cpp)
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "gpt-2": (GPT2,),
    "qwen2": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "qwen35": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?"
        r"[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    # what llama.cpp takes for a file that names none
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
}


#: the expressions HF ``tokenizer.json`` files of these models split by (a ``Split`` before a
#: ``ByteLevel`` without its own expression): their ``tokenizer.ggml.pre`` names
HF_SPLITS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen35",
    **{regexes[0]: name for name, regexes in PRE_TOKENIZERS.items() if len(regexes) == 1},
}


def pre_name(tokenizer: HFTokenizer) -> str:
    """The ``tokenizer.ggml.pre`` of a byte-level BPE tokenizer: ``"gpt-2"`` for a ``ByteLevel``
    pre-tokenizer with its own expression, else the name of the one ``Split`` expression before a
    ``ByteLevel`` without (:data:`HF_SPLITS`); ValueError naming what it is otherwise."""
    pre = json.loads(tokenizer.to_str()).get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if (
        len(parts) == 2
        and parts[0].get("type") == "Split"
        and parts[1].get("type") == "ByteLevel"
        and not parts[1].get("use_regex", True)
        and parts[0].get("pattern", {}).get("Regex") in HF_SPLITS
    ):
        return HF_SPLITS[parts[0]["pattern"]["Regex"]]
    raise ValueError(
        "the tokenizer's pre-tokenizer must be byte-level BPE's (GPT-2's expression) or a Split "
        f"by one of Qwen's expressions before a ByteLevel, got {json.dumps(pre)[:200]}"
    )


def byte_level_pre(kind: str) -> pre_tokenizers.PreTokenizer:
    """The byte-level BPE pre-tokenizer ``kind`` (:data:`PRE_TOKENIZERS`): its expressions'
    splits (matches and the text between kept), then the bytes mapped to the BPE's alphabet."""
    from tokenizers import Regex

    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[kind]]
    return pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


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
        """``tokenizer.json`` (+ ``tokenizer_config.json`` for eos and the chat template);
        CheckpointError naming the file when one is missing or unreadable."""
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise CheckpointError(f"{path}: no tokenizer.json")
        try:
            backend = HFTokenizer.from_file(str(file))
        except Exception as e:  # the tokenizers package raises a plain Exception
            raise CheckpointError(f"{file}: not a readable tokenizer: {e}") from e
        extra = {}
        config_file = path / "tokenizer_config.json"
        if config_file.is_file():
            try:
                extra = json.loads(config_file.read_bytes())
            except (ValueError, RecursionError) as e:
                raise CheckpointError(f"{config_file}: not valid JSON: {e}") from e
            if not isinstance(extra, dict):
                raise CheckpointError(f"{config_file}: must hold a JSON object")
        eos = extra.get("eos_token")
        eos_id = backend.token_to_id(eos if isinstance(eos, str) else "<|endoftext|>")
        template = extra.get("chat_template")
        return cls(backend, eos_id, template if isinstance(template, str) else None)

    @classmethod
    def from_gguf(cls, reader: GGUFFile) -> Tokenizer:
        """From a GGUF file's ``tokenizer.ggml.*`` fields (model ``gpt2``: byte-level BPE).
        GGUFError naming the file and the field for a value of the wrong type, a token that is
        not UTF-8 or appears twice, a merge not of the form ``"a b"`` over tokens of the
        vocabulary, an eos id out of range."""
        path = reader.path
        kind = field_value(reader, "tokenizer.ggml.model", "str")
        if kind is None:
            raise GGUFError(f"{path}: no tokenizer (metadata 'tokenizer.ggml.model')")
        if kind != "gpt2":
            raise GGUFError(
                f"{path}: metadata 'tokenizer.ggml.model' {kind!r} is not supported "
                "(byte-level BPE 'gpt2' only)"
            )
        tokens = field_value(reader, "tokenizer.ggml.tokens", "str[]")
        if not tokens:
            raise GGUFError(f"{path}: metadata 'tokenizer.ggml.tokens' is missing or empty")
        vocab = {}
        for i, t in enumerate(tokens):
            if vocab.setdefault(t, i) != i:
                raise GGUFError(
                    f"{path}: metadata 'tokenizer.ggml.tokens': token {t!r} appears "
                    f"twice (ids {vocab[t]} and {i})"
                )
        merges, stored = [], field_value(reader, "tokenizer.ggml.merges", "str[]")
        if stored is None:  # a BPE without its merges splits every word into bytes
            raise GGUFError(f"{path}: metadata 'tokenizer.ggml.merges' is missing")
        for i, m in enumerate(stored):
            pair = tuple(m.split(" "))
            if (
                len(pair) != 2
                or not all(pair)
                or any(t not in vocab for t in (*pair, m.replace(" ", "")))
            ):
                raise GGUFError(
                    f"{path}: metadata 'tokenizer.ggml.merges': merge {i} {m!r} must "
                    "be 'a b' with a, b and ab tokens of the vocabulary"
                )
            merges.append(pair)
        eos = field_value(reader, "tokenizer.ggml.eos_token_id", "int")
        if eos is not None and not 0 <= eos < len(tokens):
            raise GGUFError(
                f"{path}: metadata 'tokenizer.ggml.eos_token_id' must be in "
                f"[0, {len(tokens)}), got {eos}"
            )
        pre = field_value(reader, "tokenizer.ggml.pre", "str") or "default"
        if pre not in PRE_TOKENIZERS:
            raise GGUFError(
                f"{path}: metadata 'tokenizer.ggml.pre' must be one of {sorted(PRE_TOKENIZERS)} "
                f"(the pre-tokenizers ftlab splits text as llama.cpp does), got {pre!r}"
            )
        backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
        backend.pre_tokenizer = byte_level_pre(pre)
        backend.decoder = decoders.ByteLevel()
        return cls(backend, eos, field_value(reader, "tokenizer.chat_template", "str"))


def gguf_metadata(tokenizer: HFTokenizer) -> dict:
    """``tokenizer.ggml.*`` metadata of a byte-level BPE tokenizer, as llama.cpp reads it."""
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    special = {a["content"] for a in data.get("added_tokens", []) if a.get("special")}
    meta = {
        "tokenizer.ggml.model": "gpt2",
        # how llama.cpp splits text before the merges: as this tokenizer does
        "tokenizer.ggml.pre": pre_name(tokenizer),
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        # 3: control, 1: normal
        "tokenizer.ggml.token_type": [3 if t in special else 1 for t in tokens],
    }
    eos = tokenizer.token_to_id("<|endoftext|>")
    if eos is not None:
        meta["tokenizer.ggml.eos_token_id"] = eos
    return meta

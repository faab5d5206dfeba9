"""``tokenizer.ggml.pre``: a GGUF file's tokenizer splits text before the merges as llama.cpp
does for the name the file gives (llama-vocab.cpp's expressions: GPT-2's, Qwen2's, Qwen3.5's, and
its default for a file that names none), and ftlab's writer names the one its tokenizer uses -- so
a tokenizer written to a GGUF file and read back tokenizes any text as the HF tokenizer did,
Qwen's digit-by-digit splits included."""

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from ftlab.formats.gguf import GGUFError, open_gguf
from ftlab.models import tiny
from ftlab.models.tokenizer import HF_SPLITS, gguf_metadata, pre_name
from ftlab.models.tokenizer import Tokenizer as FtTokenizer

QWEN2 = next(r for r, name in HF_SPLITS.items() if name == "qwen2" and r.startswith("(?i:"))
QWEN35 = next(r for r, name in HF_SPLITS.items() if name == "qwen35" and r.startswith("(?i:"))
TEXT = (
    "It's 12345 apples, 3.14 and CAN'T stop!\n\n  def f(x):\n\treturn x ** 2  # ¿Qué? "
    "naïve café 2026-12-07 I'M HERE you'LL see\r\n"
) * 8


def qwen_style(regex: str) -> Tokenizer:
    """A byte-level BPE split as Qwen's HF tokenizer.json files split (a Split by ``regex``, then
    a ByteLevel without its own expression), trained on TEXT."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer=trainer)
    return tok


def through_gguf(tok: Tokenizer, path, pre: str | None = "keep") -> FtTokenizer:
    """``tok`` written as a GGUF file's ``tokenizer.ggml.*`` and read back by ftlab
    (``pre``: "keep" the written name, None to leave it out, or another name)."""
    meta = gguf_metadata(tok)
    if pre != "keep":
        meta.pop("tokenizer.ggml.pre")
        if pre is not None:
            meta["tokenizer.ggml.pre"] = pre
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    for key, value in meta.items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_array(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return FtTokenizer.from_gguf(open_gguf(path))


CASES = {"gpt-2": tiny.train_tokenizer(), "qwen2": qwen_style(QWEN2), "qwen35": qwen_style(QWEN35)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_writer_names_the_split_and_the_reader_splits_so(name, tmp_path):
    tok = CASES[name]
    assert pre_name(tok) == name
    back = through_gguf(tok, tmp_path / "t.gguf")
    assert back.encode(TEXT) == tok.encode(TEXT).ids


text = st.lists(
    st.sampled_from(list("aZ é9 0'sStTlL\n\r\t.,!?¿_-#") + ["'ll", "'RE", "12", " \n"]),
    max_size=30,
).map("".join)


@settings(max_examples=60, deadline=None)
@given(st.one_of(text, st.text(max_size=40)))
def test_any_text_tokenizes_as_the_hf_tokenizer_did(tmp_path_factory, s):
    for name, tok in CASES.items():
        back = _read_back(name, tok, tmp_path_factory)
        assert back.encode(s) == tok.encode(s).ids, (name, s)


_BACK: dict = {}


def _read_back(name, tok, tmp_path_factory):
    if name not in _BACK:
        _BACK[name] = through_gguf(tok, tmp_path_factory.mktemp("pre") / f"{name}.gguf")
    return _BACK[name]


def test_qwen_splits_digits_one_by_one_and_a_file_without_a_name_takes_llama_cpps_default(
    tmp_path,
):
    tok = CASES["qwen2"]
    pieces = [tok.id_to_token(i) for i in tok.encode("x 2026").ids]
    assert pieces[-4:] == ["2", "0", "2", "6"]
    default = through_gguf(tok, tmp_path / "d.gguf", pre=None)
    split = default.backend.pre_tokenizer.pre_tokenize_str("x 123456")
    assert [p for p, _ in split][-2:] == ["123", "456"]  # llama.cpp's default: digits in threes


def test_an_unknown_pre_tokenizer_is_refused_naming_it(tmp_path):
    with pytest.raises(GGUFError, match=r"'tokenizer.ggml.pre' must be one of .* got 'llama-bpe'"):
        through_gguf(CASES["gpt-2"], tmp_path / "u.gguf", pre="llama-bpe")

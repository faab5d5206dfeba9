"""What a tensor-parallel rank's loader reads, from a checkpoint's config alone (a HF directory's
``config.json``, a GGUF file's metadata): its routed experts (:func:`rank_experts`), its
vocabulary rows (:func:`rank_ranges`) and, of a Qwen3-MoE model, its attention heads
(:func:`rank_heads`). ``Pipeline.load(tp=N)`` passes them to the loaders
(:mod:`ftlab.models.pipeline` re-exports them). Each takes a path, or a GGUF file already open
(:class:`~ftlab.formats.gguf_read.GGUFFile`: the header parsed once for the whole load)."""

from __future__ import annotations

from pathlib import Path


def _counts(path) -> tuple[int, int, tuple[int, int] | None] | None:
    """``(num_experts, vocab_size, heads)`` of a checkpoint's config alone: a HF directory's
    ``config.json`` (Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE), a GGUF file's metadata (``qwen3moe``,
    ``qwen3next``, ``qwen35moe``); ``heads``: ``(num_attention_heads, num_key_value_heads)`` of a
    Qwen3-MoE model, None for a hybrid one (its attention is read whole). None for any other path
    (the load refuses it)."""
    from ftlab.formats.gguf import as_gguf
    from ftlab.formats.gguf_read import GGUFFile
    from ftlab.formats.hf import read_hf_config
    from ftlab.models.loader import GGUF_ARCH, gguf_architecture
    from ftlab.models.qwen3_moe import gguf as qwen3_moe_gguf
    from ftlab.models.qwen3_moe import hf as qwen3_moe_hf
    from ftlab.models.qwen3_next import gguf_metadata as qwen3_next_gguf
    from ftlab.models.qwen3_next.hf import is_next, read_next_config

    if not isinstance(path, GGUFFile) and path.is_dir():
        if is_next(read_hf_config(path)):
            c = read_next_config(path)
            return c.num_experts, c.vocab_size, None
        c = qwen3_moe_hf.read_config(path)[0]
    elif isinstance(path, GGUFFile) or path.suffix == ".gguf":
        reader = as_gguf(path)
        if gguf_architecture(reader) != GGUF_ARCH:
            hf = qwen3_next_gguf.read_config(reader, reader.path)
            return hf["num_experts"], hf["vocab_size"], None
        c = qwen3_moe_gguf.read_config(reader, reader.path)
    else:
        return None
    return c.num_experts, c.vocab_size, (c.num_attention_heads, c.num_key_value_heads)


def rank_experts(path: Path, tp) -> tuple[int, int] | None:
    """``(start, stop)``: the routed experts a tensor-parallel rank reads (the router stays
    whole), its equal share of the config's ``num_experts`` (:func:`rank_ranges`; None for a path
    that is neither a directory nor a ``.gguf`` file). ValueError when tp does not divide them."""
    counts = _counts(path)
    return None if counts is None else tp.shard(counts[0], "num_experts")


def rank_ranges(path: Path, tp) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """``(experts, vocab)``, each ``(start, stop)``, of a tensor-parallel rank: the routed experts
    (:func:`rank_experts`) and the rows of the embedding and lm_head (its equal share of
    ``vocab_size``) its loader reads -- from the config alone: a HF directory's ``config.json``, a
    GGUF file's metadata; None for any other path (the load refuses it). ValueError naming the
    count tp does not divide."""
    counts = _counts(path)
    return (
        None
        if counts is None
        else (tp.shard(counts[0], "num_experts"), tp.shard(counts[1], "vocab_size"))
    )


def rank_heads(path: Path, tp) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """``(query heads, key/value heads)``, each ``(start, stop)``, of a tensor-parallel rank of a
    Qwen3-MoE checkpoint: its equal share of ``num_attention_heads`` and its kv heads
    (:meth:`TensorParallel.kv_heads`: one replicated when there are fewer than ranks), the heads
    whose q/k/v rows and o_proj columns its loader reads -- from the config alone
    (:func:`rank_ranges`).
    None for a Qwen3-Next / Qwen3.5-MoE checkpoint (its attention is read whole) and for any other
    path. ValueError naming the count tp does not divide."""
    counts = _counts(path)
    if counts is None or counts[2] is None:
        return None
    heads, kv = counts[2]
    return tp.shard(heads, "num_attention_heads"), tp.kv_heads(kv, heads)

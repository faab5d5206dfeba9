"""What the loaders of both model families check of a checkpoint and of the part of it they are
asked to read: a tensor-parallel rank's ranges of experts, vocabulary rows and heads
(:func:`row_range`, :func:`expert_range`, :func:`head_ranges`: ValueError naming the argument),
and of a HF directory's shards, the layers and experts stored against the config's counts
(:func:`check_count`) and no attention bias (:func:`refuse_attention_biases`: CheckpointError
naming the file and the key or tensor)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ftlab.formats import CheckpointError

# a bias of a layer's attention (a Qwen3.5 checkpoint's text model under model.language_model.)
_ATTENTION_BIAS = re.compile(r"model\.(language_model\.)?layers\.\d+\.(self|linear)_attn\..+\.bias")


def row_range(span: tuple[int, int] | None, total: int, what: str) -> tuple[int, int]:
    """``span``, ``(start, stop)`` of ``total`` rows (experts of a bank, vocabulary rows of an
    embedding), checked (None: all of them); ValueError naming ``what``, the expectation and what
    came for anything but two ints with ``0 <= start < stop <= total``."""
    if span is None:
        return 0, total
    ok = isinstance(span, tuple) and len(span) == 2 and all(type(v) is int for v in span)
    if not ok or not 0 <= span[0] < span[1] <= total:
        raise ValueError(
            f"{what} must be (start, stop) with 0 <= start < stop <= {total}, got {span!r}"
        )
    return span


def head_ranges(
    heads, num_heads: int, num_kv_heads: int
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """``heads``, ``((start, stop), (start, stop))`` of the query heads of ``num_heads`` and the
    key/value heads of ``num_kv_heads`` (a tensor-parallel rank's: :func:`TensorParallel.shard`,
    :meth:`TensorParallel.kv_heads`), checked (None stays None: every head); ValueError naming
    ``heads``, the expectation and what came otherwise (:func:`row_range`)."""
    if heads is None:
        return None
    if not (
        isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(h, tuple) for h in heads)
    ):
        raise ValueError(
            "heads must be ((start, stop), (start, stop)) of the query and key/value heads, got "
            f"{heads!r}"
        )
    return (
        row_range(heads[0], num_heads, "heads[0] (the query heads)"),
        row_range(heads[1], num_kv_heads, "heads[1] (the key/value heads)"),
    )


def expert_range(experts: tuple[int, int] | None, num_experts: int) -> tuple[int, int]:
    """``experts`` checked against ``num_experts`` (None: all of them; :func:`row_range`)."""
    return row_range(experts, num_experts, "experts")


def check_count(
    config_file: Path, path: Path, key: str, count: int, stored: set[int], what: str
) -> None:
    """CheckpointError naming config key ``key`` unless the indices ``stored`` (ints >= 0: of
    the layers or experts that the shards in ``path`` hold) are ``0 .. count - 1``, checked
    without building that range."""
    if len(stored) != count or max(stored) != count - 1:  # i.e. stored != {0..count-1}
        have = f"{what} {min(stored)}..{max(stored)} ({len(stored)})" if stored else f"no {what}"
        raise CheckpointError(
            f"{config_file}: {key} is {count}, but the shards in {path} hold {have}"
        )


def refuse_attention_biases(stored: Iterable[str], path: Path) -> None:
    """CheckpointError naming the first of the tensors ``stored`` (in the shards in ``path``) that
    is a bias of a layer's attention (``self_attn.q_proj.bias``, any ``.bias`` under
    ``self_attn.`` or ``linear_attn.``): ftlab's attention has none (a config's
    ``attention_bias`` must be false), and a bias left unread would compute another model."""
    for name in stored:
        if _ATTENTION_BIAS.fullmatch(name):
            raise CheckpointError(
                f"{path}: tensor {name!r} is an attention bias, which ftlab does not apply (its "
                "attention projections have no bias)"
            )

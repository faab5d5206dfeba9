"""What :meth:`Pipeline.load <ftlab.models.pipeline.Pipeline.load>` does once its arguments are
checked: find the checkpoint (a tiny model's, built on first use, or the path given), join the
tensor-parallel process group when ``tp > 1``, and read the model -- a rank only its share of the
checkpoint, on the host, then cut and moved to its device (:mod:`ftlab.models.tensor_parallel`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ftlab.formats.gguf import open_gguf
from ftlab.models import tiny
from ftlab.models.loader import load_gguf_model, load_hf
from ftlab.models.qwen3_moe.config import Qwen3MoeConfig
from ftlab.models.qwen3_moe.model_weights import ModelWeights
from ftlab.models.qwen3_next.config import Qwen3NextConfig
from ftlab.models.qwen3_next.model_weights import NextWeights
from ftlab.models.tensor_parallel import shard_qwen3_moe, shard_qwen3_next
from ftlab.models.tokenizer import Tokenizer
from ftlab.models.tp_group import TensorParallel, close, process_group
from ftlab.models.tp_ranges import rank_heads, rank_ranges

__all__ = ["joined_group", "model_file", "read_model"]


def model_file(path_or_tiny: str | Path, quant: str) -> tuple[Path, bool]:
    """``(path, tiny)``: the checkpoint that ``path_or_tiny`` names -- a tiny model's
    (:data:`tiny.TINY_MODELS`, built on first use: its HF directory for ``quant == "hf"``, else
    its GGUF file of that quant; ``tiny`` True) or the path itself -- and whether it is a tiny
    model's. FileNotFoundError when nothing is there, ValueError for a file that is not a
    ``.gguf``."""
    name = str(path_or_tiny)
    is_tiny = name in tiny.TINY_MODELS
    if is_tiny:
        root = tiny.ensure(name)
        path = root if quant == "hf" else root / f"model-{quant}.gguf"
    else:
        path = Path(path_or_tiny)
    expected = f"a tiny model name {sorted(tiny.TINY_MODELS)}, a HF directory or a .gguf file"
    if not path.exists():
        raise FileNotFoundError(f"model must be {expected}; {name!r} is none of these")
    if not path.is_dir() and path.suffix != ".gguf":
        raise ValueError(f"model must be {expected}, got the file {name!r}")
    return path, is_tiny


@contextmanager
def joined_group(
    tp: int, device: torch.device
) -> Iterator[tuple[TensorParallel | None, torch.device]]:
    """``(group, device)`` for the body: with ``tp > 1`` this process's tensor-parallel group
    (:func:`~ftlab.models.tp_group.process_group`, started here if none is) and its rank's device
    (``"cuda"`` without an index is ``cuda:LOCAL_RANK``), the group closed again, without waiting
    for the other ranks, when the body raises; ``(None, device)`` for ``tp == 1``."""
    if tp == 1:
        yield None, device
        return
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    group = process_group(tp, device)
    try:
        yield group, device
    except BaseException:
        close(wait=False)  # no process group left behind by a failed load
        raise


def read_model(
    path: Path,
    device: torch.device,
    dtype: torch.dtype,
    group: TensorParallel | None,
    progress: bool,
) -> tuple[Qwen3MoeConfig | Qwen3NextConfig, ModelWeights | NextWeights, Tokenizer]:
    """``(config, weights, tokenizer)`` of the checkpoint at ``path`` (a HF directory or a
    ``.gguf`` file: :func:`model_file`), dense weights in ``dtype``, on ``device``. With ``group``,
    this rank's shard: the loader reads only the rank's experts, vocabulary rows and (Qwen3-MoE)
    attention heads, on the host, then the weights are cut and moved to ``device``.
    ``progress``: a bar over the layers."""
    at = device if group is None else torch.device("cpu")  # tp: read on the host, shard moved
    source = path if path.is_dir() else open_gguf(path)  # a GGUF header is parsed once, here
    share = {"experts": None, "vocab": None, "heads": None}
    if group is not None:  # tp: its rows and (Qwen3-MoE) its attention heads only
        share["experts"], share["vocab"] = rank_ranges(source, group) or (None, None)
        share["heads"] = rank_heads(source, group)
    if path.is_dir():
        config, weights = load_hf(path, device=at, dtype=dtype, progress=progress, **share)
        tokenizer = Tokenizer.from_dir(path)
    else:
        config, weights, tokenizer = load_gguf_model(
            source, device=at, dtype=dtype, progress=progress, **share
        )
    if group is not None:
        shard = shard_qwen3_next if isinstance(config, Qwen3NextConfig) else shard_qwen3_moe
        weights = shard(config, weights, group, device)
    return config, weights, tokenizer

"""Load a checkpoint: a HF directory of Qwen3-MoE (:mod:`ftlab.models.qwen3_moe.hf`, into
:class:`~ftlab.models.qwen3_moe.model_weights.ModelWeights`) or of Qwen3-Next / Qwen3.5-MoE
(:mod:`ftlab.models.qwen3_next.hf`, into
:class:`~ftlab.models.qwen3_next.model_weights.NextWeights`), chosen by its config's
``model_type``; or a llama.cpp GGUF file, chosen by its ``general.architecture``: ``qwen3moe``
(:mod:`ftlab.models.qwen3_moe.gguf`), ``qwen35moe`` (Qwen3.5 / Qwen3.6) or ``qwen3next``
(:mod:`ftlab.models.qwen3_next.gguf`, read into the HF state dict, then built as a HF directory's
is). A checkpoint ftlab cannot use raises :class:`~ftlab.formats.CheckpointError` (GGUF files: its
subclass :class:`~ftlab.formats.gguf.GGUFError`) naming the file and the key or tensor.
"""

from pathlib import Path

import torch
from tqdm import tqdm

from ftlab import argcheck
from ftlab.formats import CheckpointError, DequantizedWarning
from ftlab.formats.gguf import GGUFError, as_gguf, field_value
from ftlab.formats.gguf_read import GGUFFile
from ftlab.formats.hf import read_hf_config
from ftlab.models.qwen3_moe import hf as qwen3_moe_hf
from ftlab.models.qwen3_moe.config import Qwen3MoeConfig
from ftlab.models.qwen3_moe.gguf import GGUF_ARCH, load_gguf, save_gguf
from ftlab.models.qwen3_moe.model_weights import ModelWeights
from ftlab.models.qwen3_next.config import Qwen3NextConfig
from ftlab.models.qwen3_next.gguf import read_gguf_hf
from ftlab.models.qwen3_next.gguf_layout import ARCHS as NEXT_GGUF_ARCHS
from ftlab.models.qwen3_next.gguf_metadata import read_gguf_tokenizer
from ftlab.models.qwen3_next.hf import is_next, load_hf_next
from ftlab.models.qwen3_next.model_weights import NextWeights
from ftlab.models.qwen3_next.weights import build_weights
from ftlab.models.tokenizer import Tokenizer

__all__ = [
    "GGUF_ARCH",
    "GGUF_ARCHS",
    "CheckpointError",
    "DequantizedWarning",
    "GGUFError",
    "gguf_architecture",
    "load_gguf",
    "load_gguf_model",
    "load_hf",
    "save_gguf",
]

#: The ``general.architecture`` values of the GGUF files ftlab loads.
GGUF_ARCHS = (GGUF_ARCH, *NEXT_GGUF_ARCHS)


def load_hf(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    progress: bool = True,
    quantize: bool = False,
    experts: tuple[int, int] | None = None,
    vocab: tuple[int, int] | None = None,
    heads: tuple[tuple[int, int], tuple[int, int]] | None = None,
):
    """Config and weights of a HF directory (module docstring: which model), on ``device``, dense
    weights in ``dtype`` (default: the config's stored dtype, else bf16). ``quantize``: a hybrid
    model's projections and expert banks quantized to Q4_0 at load. ``experts``: ``(start,
    stop)``, routed banks with only those experts, only their tensors read (a tensor-parallel
    rank's share: :func:`qwen3_moe_hf.load_hf`, :func:`load_hf_next`). ``vocab``: ``(start,
    stop)``, the embedding and an untied lm_head ``[stop - start, H]`` of only those vocabulary
    rows, a safetensors slice of them read (a tensor-parallel rank's vocabulary shard).
    ``heads``: ``((q_start, q_stop), (kv_start, kv_stop))``, a Qwen3-MoE model's attention of
    only those heads (q/k/v rows, o_proj columns: :func:`qwen3_moe_hf.load_hf`; a hybrid model's
    attention is read whole, and refuses it). CheckpointError naming the file and the key or
    tensor for anything ftlab cannot load."""
    if is_next(read_hf_config(Path(path))):
        _whole_attention(heads)
        return load_hf_next(path, device, dtype, progress, quantize, experts, vocab)
    if quantize:
        raise ValueError(
            "quantize=True is for Qwen3-Next / Qwen3.5-MoE directories (Qwen3-MoE's Q4_0 form is a "
            "GGUF file)"
        )
    return qwen3_moe_hf.load_hf(path, device, dtype, progress, experts, vocab, heads)


def _whole_attention(heads) -> None:
    """ValueError for ``heads`` given to a Qwen3-Next / Qwen3.5-MoE loader (its attention is read
    whole)."""
    if heads is not None:
        raise ValueError(
            f"heads must be None for a Qwen3-Next / Qwen3.5-MoE checkpoint (its attention is read "
            f"whole), got {heads!r}"
        )


def gguf_architecture(path: str | Path | GGUFFile) -> str:
    """The ``general.architecture`` of a GGUF file (``path``, its structure validated first, or
    a :class:`~ftlab.formats.gguf_read.GGUFFile` already open), one of :data:`GGUF_ARCHS`;
    GGUFError naming the file and the architecture otherwise."""
    reader = as_gguf(path)
    path = reader.path
    arch = field_value(reader, "general.architecture", "str")
    if arch not in GGUF_ARCHS:
        got = "no 'general.architecture'" if arch is None else f"architecture {arch!r}"
        raise GGUFError(
            f"{path}: {got}; ftlab loads GGUF files of the architectures {sorted(GGUF_ARCHS)} "
            "(Qwen3-MoE, Qwen3.5-MoE / Qwen3.6, Qwen3-Next)"
        )
    return arch


def load_gguf_model(
    path: str | Path | GGUFFile,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
    experts: tuple[int, int] | None = None,
    vocab: tuple[int, int] | None = None,
    heads: tuple[tuple[int, int], tuple[int, int]] | None = None,
) -> tuple[Qwen3MoeConfig | Qwen3NextConfig, ModelWeights | NextWeights, Tokenizer]:
    """Config, weights and tokenizer of a llama.cpp GGUF file (``path``, or the
    :class:`~ftlab.formats.gguf_read.GGUFFile` already open), its header parsed once for all
    three, by its ``general.architecture``:
    ``qwen3moe`` as :func:`load_gguf` loads it (Q4_0 packed, the tokenizer of
    :meth:`Tokenizer.from_gguf`); ``qwen35moe`` / ``qwen3next`` as :func:`read_gguf_hf` reads
    them (the types ftlab computes on stay packed) into a :class:`Qwen3NextConfig` and
    :class:`NextWeights` on ``device``, dense weights in ``dtype``, the tokenizer of
    :func:`read_gguf_tokenizer` (CONTROL tokens special). ``progress``: a bar over the layers.
    ``experts``: ``(start, stop)``, routed banks with only those experts, cut from the
    memory-mapped file as read (a tensor-parallel rank's share: :func:`load_gguf`,
    :func:`read_gguf_hf`). ``vocab``: ``(start, stop)``, the embedding and an untied lm_head
    ``[stop - start, H]`` of only those vocabulary rows, cut from the mapped file before the
    embedding is dequantized (a tensor-parallel rank's vocabulary shard). ``heads``: ``((q_start,
    q_stop), (kv_start, kv_stop))``, a ``qwen3moe`` file's attention of only those heads, cut from
    the mapped file as read (:func:`load_gguf`; the hybrid architectures read it whole and refuse
    it). GGUFError naming the file and the architecture for any other, and the file and the key
    or tensor for anything ftlab cannot load."""
    argcheck.float_dtype("dtype", dtype)
    reader = as_gguf(path)
    path = reader.path
    arch = gguf_architecture(reader)
    if arch == GGUF_ARCH:
        config, weights = load_gguf(
            reader,
            device=device,
            dtype=dtype,
            progress=progress,
            experts=experts,
            vocab=vocab,
            heads=heads,
        )
        return config, weights, Tokenizer.from_gguf(reader)
    _whole_attention(heads)
    hf, tensors, input_perms = read_gguf_hf(reader, device, dtype, experts, vocab)
    try:
        config = Qwen3NextConfig.from_hf(hf)
    except ValueError as e:
        raise GGUFError(f"{path}: {e}") from e
    bar = (lambda r: tqdm(r, desc=f"loading {path.name}", unit="layer")) if progress else None
    weights = build_weights(
        config,
        tensors,
        device=device,
        dtype=dtype,
        where=str(path),
        input_perms=input_perms,
        progress=bar,
        experts=experts,
        vocab=vocab,
    )
    return config, weights, read_gguf_tokenizer(reader)

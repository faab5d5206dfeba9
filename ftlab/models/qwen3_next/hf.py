"""Load a HF Qwen3-Next (``Qwen3NextForCausalLM``) or Qwen3.5-MoE directory
(``Qwen3_5MoeForCausalLM``, or the text model of ``Qwen3_5MoeForConditionalGeneration``) into
:class:`~ftlab.models.qwen3_next.model_weights.NextWeights`.

Shards as :class:`~ftlab.formats.hf.SafetensorsShards` reads them (memory-mapped, by the
index when there is one). The text model's tensors under ``model.language_model.`` are read as
``model.``; the vision tower (``model.visual.``) and the multi-token-prediction head (``mtp.``)
are not read. Tensors become weights through :func:`~ftlab.models.qwen3_next.weights.build_weights`.
With ``experts=(start, stop)`` (a tensor-parallel rank's share) only those routed experts are read:
their per-expert tensors, or their rows of a stored bank (a safetensors slice: the other experts'
bytes are not read); with ``vocab=(start, stop)`` only those rows of the embedding and of an untied
``lm_head``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from tqdm import tqdm

from ftlab import ops
from ftlab.formats import CheckpointError
from ftlab.formats.hf import SafetensorsShards, read_hf_config, stored_dtype
from ftlab.models.checkpoint_checks import (
    check_count,
    expert_range,
    refuse_attention_biases,
    row_range,
)
from ftlab.models.qwen3_next.config import MODEL_TYPES, Qwen3NextConfig
from ftlab.models.qwen3_next.model_weights import NextWeights
from ftlab.models.qwen3_next.weights import build_weights

TEXT_PREFIX = "model.language_model."
SKIPPED = ("model.visual.", "mtp.")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_EXPERT = re.compile(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\.")
_Q4_0_NAMES = re.compile(r"(_proj(\.weight)?|lm_head\.weight)$")
_BANK = re.compile(r"\.mlp\.experts\.(gate_up|gate|up|down)_proj$")  # a routed bank [E, ...]
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")  # [V, H]


def is_next(hf: dict) -> bool:
    """Whether a HF config dict is of a model this module loads."""
    model_type = hf.get("model_type")
    return isinstance(model_type, str) and model_type in MODEL_TYPES


class HFTensors(Mapping):
    """The text model's tensors of a directory's shards under their ``model.`` names, read when
    asked for. ``quantize``: projections (``*_proj``, ``lm_head``) of whole Q4_0 blocks are
    returned quantized to Q4_0 (what a tiny model's ``q4_0`` form is). ``experts``: ``(start,
    stop)`` of ``num_experts`` -- a stored routed bank (``mlp.experts.gate_up_proj``,
    ``gate_proj``, ``up_proj``, ``down_proj``, ``[num_experts, ...]``) is returned as its experts
    ``start .. stop`` (``[stop - start, ...]`` in the stored dtype, its own memory), only their
    bytes read; None: whole. ``vocab``: ``(start, stop)`` of ``vocab_size`` -- the embedding and
    ``lm_head`` (``[vocab_size, H]``) likewise as their rows ``start .. stop``; None: whole."""

    def __init__(
        self,
        shards: SafetensorsShards,
        quantize: bool = False,
        experts: tuple[int, int] | None = None,
        num_experts: int | None = None,
        vocab: tuple[int, int] | None = None,
        vocab_size: int | None = None,
    ):
        self.shards, self.quantize, self.experts, self.num_experts = (
            shards,
            quantize,
            experts,
            num_experts,
        )
        self.vocab, self.vocab_size = vocab, vocab_size
        self.names: dict[str, str] = {}
        for stored in shards.where:
            if stored.startswith(SKIPPED):
                continue
            name = (
                "model." + stored.removeprefix(TEXT_PREFIX)
                if stored.startswith(TEXT_PREFIX)
                else stored
            )
            if name in self.names:
                raise CheckpointError(
                    f"{shards.path}: tensors '{self.names[name]}' and '{stored}' are both "
                    f"'{name}' of the text model"
                )
            self.names[name] = stored

    def __getitem__(self, name: str):
        stored = self.names[name]
        if self.experts is not None and _BANK.search(name) is not None:
            t = self._rows(stored, self.experts, self.num_experts, "experts")
        elif self.vocab is not None and name in _VOCAB:
            t = self._rows(stored, self.vocab, self.vocab_size, "rows (the vocabulary)")
        else:
            t = self.shards.read(stored)[0]
        if self.quantize and t.dtype.is_floating_point and t.dim() >= 2 and t.shape[-1] % 32 == 0:
            if _Q4_0_NAMES.search(name):
                return ops.quantize_q4_0(t.float(), backend="reference")
        return t

    def _rows(self, stored: str, rows: tuple[int, int], count: int, what: str) -> torch.Tensor:
        """Rows ``start .. stop`` of the stored tensor ``[count, ...]`` (experts of a bank,
        vocabulary rows), ``[stop - start, ...]`` in its stored dtype, of its own memory: only
        their bytes are read (:meth:`SafetensorsShards.read`)."""
        t, shape, file = self.shards.read(stored, rows)
        if not shape or shape[0] != count:
            raise CheckpointError(
                f"{file}: tensor {stored!r} has shape {shape}, expected {count} {what} along "
                "its first dim"
            )
        return t

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def check_counts(self, config: Qwen3NextConfig, config_file: Path) -> None:
        """The layers and experts stored are those the config counts."""
        path, n = self.shards.path, config.num_hidden_layers
        layers = {int(m[1]) for t in self.names if (m := _LAYER.match(t))}
        check_count(config_file, path, "num_hidden_layers", n, layers, "layers")
        experts = {int(m[1]) for t in self.names if (m := _EXPERT.match(t))}
        if experts:  # else the experts are stored as banks [num_experts, ...]
            check_count(config_file, path, "num_experts", config.num_experts, experts, "experts")


def read_next_config(path: Path) -> Qwen3NextConfig:
    config_file = path / "config.json"
    try:
        return Qwen3NextConfig.from_hf(read_hf_config(path))
    except ValueError as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{config_file}: {e}") from e


def load_hf_next(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    progress: bool = True,
    quantize: bool = False,
    experts: tuple[int, int] | None = None,
    vocab: tuple[int, int] | None = None,
) -> tuple[Qwen3NextConfig, NextWeights]:
    """Config and weights of a HF Qwen3-Next / Qwen3.5-MoE directory on ``device``, dense weights
    in ``dtype`` (default: the config's ``torch_dtype``/``dtype``, else bf16); ``quantize``: the
    projections and expert banks as Q4_0. ``experts``: ``(start, stop)`` (None: all) -- the
    routed banks ``w_gate_up [stop - start, 2I, H]``, ``w_down [stop - start, H, I]`` hold only
    those experts, and only their tensors (or bank rows) are read (a tensor-parallel rank's
    share; the router ``[E, H]`` and the shared expert whole). ``vocab``: ``(start, stop)``
    (None: all) -- the embedding ``[stop - start, H]`` and an untied ``lm_head`` (a tied one is
    the embedding) hold only those vocabulary rows, only their bytes read (a rank's vocabulary
    shard). ValueError naming ``experts`` or ``vocab`` for a range that is not ``0 <= start <
    stop <= count``. CheckpointError naming the file and the key or tensor for anything ftlab
    cannot load."""
    path = Path(path)
    config = read_next_config(path)
    if experts is not None:
        experts = expert_range(experts, config.num_experts)
    if vocab is not None:
        vocab = row_range(vocab, config.vocab_size, "vocab")
    if dtype is None:
        dtype = stored_dtype(read_hf_config(path), path / "config.json")
    tensors = HFTensors(
        SafetensorsShards(path), quantize, experts, config.num_experts, vocab, config.vocab_size
    )
    tensors.check_counts(config, path / "config.json")
    refuse_attention_biases(tensors.names.values(), path)
    bar = (lambda r: tqdm(r, desc=f"loading {path.name}", unit="layer")) if progress else None
    return config, build_weights(
        config,
        tensors,
        device=device,
        dtype=dtype,
        where=str(path),
        progress=bar,
        experts=experts,
        vocab=vocab,
    )

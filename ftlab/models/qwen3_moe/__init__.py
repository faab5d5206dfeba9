"""Qwen3-MoE (the ``qwen3_moe`` architecture of Qwen3-30B-A3B): its config
(:mod:`~ftlab.models.qwen3_moe.config`), the model over ftlab ops
(:mod:`~ftlab.models.qwen3_moe.model`) and the weights it reads
(:mod:`~ftlab.models.qwen3_moe.model_weights`), its loader of a HF directory
(:mod:`~ftlab.models.qwen3_moe.hf`) and its reader and writer of llama.cpp GGUF files
(:mod:`~ftlab.models.qwen3_moe.gguf`). :mod:`ftlab.models.loader` picks a checkpoint's loader."""

from ftlab.models.qwen3_moe.config import Qwen3MoeConfig
from ftlab.models.qwen3_moe.gguf import GGUF_ARCH, load_gguf, save_gguf
from ftlab.models.qwen3_moe.hf import load_hf
from ftlab.models.qwen3_moe.model import Qwen3Moe
from ftlab.models.qwen3_moe.model_weights import LayerWeights, ModelWeights

__all__ = [
    "GGUF_ARCH",
    "LayerWeights",
    "ModelWeights",
    "Qwen3Moe",
    "Qwen3MoeConfig",
    "load_gguf",
    "load_hf",
    "save_gguf",
]

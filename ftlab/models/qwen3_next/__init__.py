"""The hybrid Qwen MoE models, Qwen3-Next and Qwen3.5-MoE / Qwen3.6 (one code path, the config's
``arch`` tells them apart): their config (:mod:`~ftlab.models.qwen3_next.config`), the model
over ftlab ops (:mod:`~ftlab.models.qwen3_next.model`), the weights it reads
(:mod:`~ftlab.models.qwen3_next.model_weights`) and its state between forward passes
(:mod:`~ftlab.models.qwen3_next.state`), the weights built from HF-named tensors of any source
(:mod:`~ftlab.models.qwen3_next.weights`), the loader of a HF directory
(:mod:`~ftlab.models.qwen3_next.hf`), llama.cpp's GGUF files read back into the HF state dict
(:mod:`~ftlab.models.qwen3_next.gguf`; their config and tokenizer:
:mod:`~ftlab.models.qwen3_next.gguf_metadata`) and written from it
(:mod:`~ftlab.models.qwen3_next.gguf_write`) by the converter's tables
(:mod:`~ftlab.models.qwen3_next.gguf_layout`), and the tiny built-in checkpoints' recipes
(:mod:`~ftlab.models.qwen3_next.tiny`). :mod:`ftlab.models.loader` picks a checkpoint's loader."""

from ftlab.models.qwen3_next.config import Qwen3NextConfig
from ftlab.models.qwen3_next.gguf import read_gguf_hf
from ftlab.models.qwen3_next.gguf_metadata import read_gguf_tokenizer
from ftlab.models.qwen3_next.gguf_write import write_gguf_hf
from ftlab.models.qwen3_next.hf import is_next, load_hf_next
from ftlab.models.qwen3_next.model import Qwen3Next
from ftlab.models.qwen3_next.model_weights import (
    AttentionWeights,
    DeltaNetWeights,
    MoeWeights,
    NextLayerWeights,
    NextWeights,
)
from ftlab.models.qwen3_next.weights import build_weights

__all__ = [
    "AttentionWeights",
    "DeltaNetWeights",
    "MoeWeights",
    "NextLayerWeights",
    "NextWeights",
    "Qwen3Next",
    "Qwen3NextConfig",
    "build_weights",
    "is_next",
    "load_hf_next",
    "read_gguf_hf",
    "read_gguf_tokenizer",
    "write_gguf_hf",
]

"""Load a Qwen3-MoE checkpoint into :class:`~ftlab.models.qwen3_moe.ModelWeights`: a HF
directory (:mod:`ftlab.models.hf_loader`) or a llama.cpp GGUF file
(:mod:`ftlab.models.gguf_loader`). A checkpoint ftlab cannot use raises
:class:`~ftlab.formats.CheckpointError` (GGUF files: its subclass
:class:`~ftlab.formats.gguf.GGUFError`) naming the file and the key or tensor.
"""

from ftlab.formats import CheckpointError
from ftlab.formats.gguf import GGUFError
from ftlab.models.gguf_loader import GGUF_ARCH, DequantizedWarning, load_gguf, save_gguf
from ftlab.models.hf_loader import load_hf

__all__ = ["GGUF_ARCH", "CheckpointError", "DequantizedWarning", "GGUFError", "load_gguf", "load_hf", "save_gguf"]

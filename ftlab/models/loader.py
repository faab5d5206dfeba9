"""Load a checkpoint: a HF directory of Qwen3-MoE (:mod:`ftlab.models.hf_loader`, into
:class:`~ftlab.models.qwen3_moe.ModelWeights`) or of Qwen3-Next / Qwen3.5-MoE
(:mod:`ftlab.models.hf_next_loader`, into :class:`~ftlab.models.qwen3_next.NextWeights`), chosen
by its config's ``model_type``; or a llama.cpp Qwen3-MoE GGUF file
(:mod:`ftlab.models.gguf_loader`). A checkpoint ftlab cannot use raises
:class:`~ftlab.formats.CheckpointError` (GGUF files: its subclass
:class:`~ftlab.formats.gguf.GGUFError`) naming the file and the key or tensor.
"""

from pathlib import Path

import torch

from ftlab.formats import CheckpointError
from ftlab.formats.gguf import GGUFError
from ftlab.models import hf_loader
from ftlab.models.gguf_loader import GGUF_ARCH, DequantizedWarning, load_gguf, save_gguf
from ftlab.models.hf_next_loader import is_next, load_hf_next

__all__ = ["GGUF_ARCH", "CheckpointError", "DequantizedWarning", "GGUFError", "load_gguf", "load_hf", "save_gguf"]


def load_hf(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
            progress: bool = True, quantize: bool = False):  # fmt: skip
    """Config and weights of a HF directory (module docstring: which model), on ``device``, dense
    weights in ``dtype`` (default: the config's stored dtype, else bf16). ``quantize``: a hybrid
    model's projections and expert banks quantized to Q4_0 at load. CheckpointError naming the
    file and the key or tensor for anything ftlab cannot load."""
    if is_next(hf_loader.read_hf_config(Path(path))):
        return load_hf_next(path, device, dtype, progress, quantize)
    if quantize:
        raise ValueError("quantize=True is for Qwen3-Next / Qwen3.5-MoE directories (Qwen3-MoE's Q4_0 form is a "
                         "GGUF file)")  # fmt: skip
    return hf_loader.load_hf(path, device, dtype, progress)

"""index / store through the HIP kernels of ``csrc/index_store.hip`` (JIT-built, cached).

The same source runs on ROCm (hipcc) and NVIDIA (nvcc). Launches go to torch's current
stream, so the ops compose with side streams and CUDA/HIP graph capture.
"""

from __future__ import annotations

import torch

from ftlab.bitview import as_bits
from ftlab.hip import loader


def _module(device: torch.device):
    from ftlab import platform as ftplatform

    return loader.load("index_store", ftplatform.current(device))


def index(
    weights: torch.Tensor, indices: torch.Tensor, out: torch.Tensor, mask_start: int, mask_len: int
) -> None:
    """Backend entry of :func:`ftlab.ops.index` (arguments already validated)."""
    module = _module(weights.device)
    with torch.cuda.device(weights.device):
        module.index_rows(as_bits(weights), indices, as_bits(out), mask_start, mask_len)


def store(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Backend entry of :func:`ftlab.ops.store` (arguments already validated)."""
    module = _module(k_cache.device)
    with torch.cuda.device(k_cache.device):
        module.store_rows(as_bits(k_cache), as_bits(v_cache), indices, as_bits(k), as_bits(v))

"""index / store through the HIP kernels of ``csrc/index_store.hip`` (JIT-built, cached).

The same source runs on ROCm (hipcc) and NVIDIA (nvcc). Launches go to torch's current
stream, so the ops compose with side streams and CUDA/HIP graph capture.
"""

from __future__ import annotations

import torch

from ftlab import jit
from ftlab.bitview import as_bits


def _dl(t: torch.Tensor) -> torch.Tensor:
    # The kernels move bytes; fp8 goes through DLPack as same-width integers.
    return as_bits(t) if t.element_size() == 1 else t


def index(
    weights: torch.Tensor, indices: torch.Tensor, out: torch.Tensor, mask_start: int, mask_len: int
) -> None:
    """Backend entry of :func:`ftlab.ops.index` (arguments already validated)."""
    module = jit.module_for("index_store", weights.device)
    jit.on_device(
        weights.device,
        lambda: module.index_rows(_dl(weights), indices, _dl(out), mask_start, mask_len),
    )


def store(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Backend entry of :func:`ftlab.ops.store` (arguments already validated)."""
    module = jit.module_for("index_store", k_cache.device)
    jit.on_device(
        k_cache.device,
        lambda: module.store_rows(_dl(k_cache), _dl(v_cache), indices, _dl(k), _dl(v)),
    )

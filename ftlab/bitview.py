"""Views of float tensors as same-width integers, for kernels that only move bits."""

from __future__ import annotations

import torch

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """The same memory (same shape and strides) viewed as integers of the element's width.

    A copy through this view is bit-exact for any dtype: bf16 in Triton's interpreter and
    fp8 through DLPack included.
    """
    return t.view(_INT_OF_WIDTH[t.element_size()])

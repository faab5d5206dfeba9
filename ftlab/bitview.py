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


def random_rows(
    gen: torch.Generator, rows: int, d: int, pad: int, dtype: torch.dtype
) -> torch.Tensor:
    """A ``[rows, d]`` view with row stride ``d + pad`` whose bits are random, NaN, inf,
    -0.0 and denormals included (a copy must move every bit pattern)."""
    width = torch.empty((), dtype=dtype).element_size()
    base = torch.randint(
        -(2 ** (8 * width - 1)),
        2 ** (8 * width - 1) - 1,
        (rows, d + pad),
        generator=gen,
        dtype=torch.int64,
    )
    ints = base.to(_INT_OF_WIDTH[width])
    return ints.view(dtype)[:, :d]


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(as_bits(a.cpu()), as_bits(b.cpu()))

"""Dequantizing GGUF blocks (docs/OPS.md section 7): Q8_0 and the K-quants (Q4_K, Q5_K, Q6_K),
and Q4_0 through its own op."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends
from ftlab.ops.q4_0 import dequantize_q4_0
from ftlab.quant import Q4_0Weight, QuantWeight


def dequantize(w: QuantWeight, dtype: torch.dtype = torch.float32, *, backend: str = "auto") -> torch.Tensor:
    """``[..., N, K]`` values of the packed weight ``w`` (any :data:`ftlab.quant.QTYPES` type), in
    ``dtype`` (fp32 / fp16 / bf16).

    The fp32 values are bit-identical to ``gguf.quants.dequantize`` (and llama.cpp's
    ``dequantize_row_*``) in every backend, for any bytes, NaN and infinite block scales
    included (NaN compared as NaN); fp16 / bf16 outputs are those values rounded to nearest
    even. A :class:`~ftlab.quant.Q4_0Weight` goes to :func:`ftlab.ops.dequantize_q4_0`.
    """
    if not isinstance(w, QuantWeight):
        raise TypeError(f"w must be a ftlab.quant.QuantWeight, got {type(w).__name__}")
    argcheck.float_dtype("dtype", dtype)
    if isinstance(w, Q4_0Weight):
        return dequantize_q4_0(w, dtype, backend=backend)
    impl = backends.resolve("dequantize", backend, w.device, dtype)
    if w.data.numel() == 0:
        return torch.empty(w.shape, dtype=dtype, device=w.device)
    return impl.fn(w, dtype)

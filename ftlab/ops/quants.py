"""GGUF blocks beside Q4_0 (docs/OPS.md section 7): dequantizing Q8_0 and the K-quants (Q4_K,
Q5_K, Q6_K; Q4_0 through its own op), and quantizing to Q8_0."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends
from ftlab.ops.q4_0 import dequantize_q4_0, quantize_q4_0
from ftlab.quant import QTYPES, Q4_0Weight, QuantWeight

#: the types :func:`quantize` writes (the K-quants' quantizers are llama.cpp's search, not here)
QUANTIZE_TYPES = ("Q4_0", "Q8_0")


def quantize(w: torch.Tensor, qtype: str = "Q8_0", *, backend: str = "auto") -> QuantWeight:
    """``w [..., N, K]`` (fp32 / fp16 / bf16, K a multiple of 32) as GGUF blocks of ``qtype``:
    ``"Q8_0"`` (per 32-block ``d = amax / 127``, ``q = round(x / d)`` as a multiply by the
    reciprocal, halves away from zero) or ``"Q4_0"`` (:func:`~ftlab.ops.quantize_q4_0`).
    Byte-identical to ``gguf.quants.quantize(w, qtype)`` in every backend. Non-finite values
    are refused for Q8_0 (ValueError naming the first): an infinite block's values become NaN
    times zero, which no platform casts to int8 alike."""
    if qtype not in QUANTIZE_TYPES:
        raise ValueError(f"qtype must be one of {QUANTIZE_TYPES}, got {qtype!r}")
    if qtype == "Q4_0":
        return quantize_q4_0(w, backend=backend)
    argcheck.float_tensor("w", w)
    block = QTYPES[qtype].block
    if w.dim() < 2 or w.shape[-1] % block:
        raise ValueError(
            f"w must be [..., N, K] with K a multiple of {block}, got shape {tuple(w.shape)}"
        )
    if w.numel():
        argcheck.data_checks_allowed(
            "quantize", "its finiteness check reads w", "quantize before capturing"
        )
        bad = ~torch.isfinite(w)
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(f"w must be finite for {qtype}, got {float(w[where])} at {where}")
    impl = backends.resolve("quantize", backend, w.device, w.dtype)
    return impl.fn(w.contiguous(), qtype)


def dequantize(
    w: QuantWeight, dtype: torch.dtype = torch.float32, *, backend: str = "auto"
) -> torch.Tensor:
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

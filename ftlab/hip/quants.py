"""Dequantizing GGUF Q8_0 / Q4_K / Q5_K / Q6_K blocks, and quantizing to Q8_0, through the HIP
kernels of ``csrc/quants.hip`` (JIT-built, cached).

One thread per 8 consecutive outputs, each computed in fp32 in the reference's order with
every product rounded on its own (no FMA), so fp32 outputs equal ``ftlab.reference.quants``
bit for bit and fp16 / bf16 outputs are those values rounded to nearest even. Launches go to
torch's current stream.
"""

from __future__ import annotations

import torch

from ftlab import jit
from ftlab.quant import QTYPES, QuantWeight

#: the module's entry point of each block type (csrc/quants_launch.hip)
_ENTRY = {
    "Q8_0": "dequantize_q8_0",
    "Q4_K": "dequantize_q4_k",
    "Q5_K": "dequantize_q5_k",
    "Q6_K": "dequantize_q6_k",
}


def quantize(w: torch.Tensor, qtype: str) -> QuantWeight:
    """Backend entry of :func:`ftlab.ops.quantize` (``qtype`` "Q8_0"; w contiguous, finite)."""
    qt = QTYPES[qtype]
    out = torch.empty(
        (*w.shape[:-1], qt.row_bytes(w.shape[-1])), dtype=torch.uint8, device=w.device
    )
    module = jit.module_for("quants", w.device)
    jit.on_device(w.device, lambda: module.quantize_q8_0(w, out))
    return QuantWeight(out, tuple(w.shape), qtype)


def dequantize(w: QuantWeight, dtype: torch.dtype) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.dequantize` (w one of Q8_0, Q4_K, Q5_K, Q6_K, with
    blocks; arguments already validated)."""
    out = torch.empty(w.shape, dtype=dtype, device=w.device)
    # The kernels read 16-bit words: an odd view (a slice of a larger byte buffer) is copied.
    data = w.data if w.data.data_ptr() % 2 == 0 else w.data.clone()
    fn = getattr(jit.module_for("quants", w.device), _ENTRY[w.qtype])
    jit.on_device(w.device, lambda: fn(data, out))
    return out

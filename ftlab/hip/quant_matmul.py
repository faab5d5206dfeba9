"""Matmul on GGUF Q8_0 and the K-quants through the HIP kernels of ``csrc/quant_matmul.hip``
(JIT-built, cached); docs/OPS.md section 11.

The int8 path only: x is quantized to Q8_1 by the Q4_0 family's kernel, then up to 8 rows
(decode) go to the int8-dot matvec (one 32-thread group per weight row, dp4a / sudot4 / sdot4)
and more (prefill) to the dp4a-tiled GEMM (64x64 output tiles, the weight units decoded into
LDS).
"""

from __future__ import annotations

import torch

from ftlab import jit
from ftlab.hip.q4_0 import quantize_q8_1
from ftlab.quant import QuantWeight

#: rows quant_mv_kernel is instantiated for (1..8); more go to quant_gemm_kernel
MATVEC_ROWS = 8
_SUFFIX = {"Q8_0": "q8_0", "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k"}


def quant_matmul(x: torch.Tensor, w: QuantWeight, path: str) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.quant_matmul` (``path == "int8"``)."""
    if path != "int8":
        raise ValueError(
            f"the hip backend implements quant_matmul's int8 path only, got path={path!r}"
        )
    m, n = x.shape[0], w.shape[0]
    x8 = quantize_q8_1(x)
    y = torch.empty((m, n), dtype=torch.float32, device=x.device)
    # the kernels read 32-bit words of the blocks: an unaligned view is copied
    data = w.data if w.data.data_ptr() % 4 == 0 else w.data.clone()
    module = jit.module_for("quant_matmul", x.device)
    kernel = "quant_mv_" if m <= MATVEC_ROWS else "quant_gemm_"
    fn = getattr(module, kernel + _SUFFIX[w.qtype])
    jit.on_device(x.device, lambda: fn(data, x8.q, x8.d, x8.s, y))
    return y if x.dtype == torch.float32 else y.to(x.dtype)

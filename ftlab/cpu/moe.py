"""Routed SwiGLU experts on the CPU (``csrc/moe_cpu.cc``): the ``cpu`` backend of
``ops.moe_experts``, what the hybrid executor runs for the routes it sends to the CPU (the
others carry id -1 and cost nothing).

Q4_0 banks take the int8 path (x and h quantized to Q8_1, int8 block dots: AVX2 where the host
has it, else scalar); dense fp32 / bf16 / fp16 banks are computed in fp32. The result is in x's
dtype. Tested against the reference within ``ftlab.testing.experts_tolerance``.
"""

from __future__ import annotations

import torch

from ftlab import jit
from ftlab.quant import Q4_0Weight

MODULE = "moe_cpu"


def moe_experts(x: torch.Tensor, w_gate_up, w_down, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                path: str) -> torch.Tensor:  # fmt: skip
    """Backend entry of :func:`ftlab.ops.moe_experts` (arguments validated there: CPU tensors,
    banks both Q4_0 or both dense, Q4_0 on the int8 path). Dense banks of two dtypes are
    computed in w_gate_up's."""
    q4 = isinstance(w_gate_up, Q4_0Weight)
    gu = w_gate_up.data if q4 else w_gate_up
    dn = w_down.data if q4 else w_down.to(w_gate_up.dtype)
    y = torch.empty(x.shape, dtype=torch.float32)
    if x.shape[0]:
        jit.load_cpu(MODULE).moe_experts_cpu(x.float().contiguous(), gu.contiguous(), dn.contiguous(),
                                             topk_ids.to(torch.int32).contiguous(),
                                             topk_weights.float().contiguous(), y)  # fmt: skip
    return y.to(x.dtype)


def job_entry() -> int:
    """Address of the plain-C entry ``ftlab_cpu_moe_job`` (``csrc/cpu_job.h``) that the hybrid
    handshakes' worker thread calls."""
    return int(jit.load_cpu(MODULE).moe_job_entry())

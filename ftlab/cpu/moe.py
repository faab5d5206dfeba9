"""Routed SwiGLU experts on the CPU (``csrc/moe_cpu.cc``): the ``cpu`` backend of
``ops.moe_experts``, what the hybrid executor runs for the routes it sends to the CPU (the
others carry id -1 and cost nothing).

Quantized banks (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K; gate_up and down may differ, as Q4_K_M's Q4_K /
Q6_K) take the int8 path (x and h quantized to Q8_1, exact integer sub-block dots: AVX2 where the
host has it, else scalar); dense fp32 / bf16 / fp16 banks are computed in fp32. The result is in x's
dtype. Tested against the reference within ``ftlab.testing.experts_tolerance``.
"""

from __future__ import annotations

import torch

from ftlab import jit
from ftlab.quant import QuantWeight

MODULE = "moe_cpu"
#: ``FtlabCpuBankKind`` of ``csrc/cpu_job.h``, by quantized type and by dense dtype
QUANT_KINDS = {"Q4_0": 0, "Q8_0": 4, "Q4_K": 5, "Q5_K": 6, "Q6_K": 7}
DENSE_KINDS = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}


def bank_kind(w) -> int:
    """The ``FtlabCpuBankKind`` of a bank (a QuantWeight or a dense tensor)."""
    return QUANT_KINDS[w.qtype] if isinstance(w, QuantWeight) else DENSE_KINDS[w.dtype]


def job_kind(w_gate_up, w_down) -> int:
    """A job's ``kind`` (``FTLAB_CPU_JOB_KIND``): gate_up's bank kind, down's in bits 8..15."""
    return bank_kind(w_gate_up) | bank_kind(w_down) << 8


def moe_experts(
    x: torch.Tensor,
    w_gate_up,
    w_down,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    path: str,
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.moe_experts` (arguments validated there: CPU tensors,
    banks both quantized or both dense, quantized on the int8 path). Dense banks of two dtypes
    are computed in w_gate_up's."""
    quant = isinstance(w_gate_up, QuantWeight)
    gu = w_gate_up.data if quant else w_gate_up
    dn = w_down.data if quant else w_down.to(w_gate_up.dtype)
    gate_kind = bank_kind(w_gate_up)
    down_kind = bank_kind(w_down) if quant else gate_kind
    y = torch.empty(x.shape, dtype=torch.float32)
    if x.shape[0]:
        jit.load_cpu(MODULE).moe_experts_cpu(
            x.float().contiguous(),
            gu.contiguous(),
            dn.contiguous(),
            topk_ids.to(torch.int32).contiguous(),
            topk_weights.float().contiguous(),
            y,
            gate_kind,
            down_kind,
        )
    return y.to(x.dtype)


def job_entry() -> int:
    """Address of the plain-C entry ``ftlab_cpu_moe_job`` (``csrc/cpu_job.h``) that the hybrid
    handshakes' worker thread calls."""
    return int(jit.load_cpu(MODULE).moe_job_entry())

"""Hybrid CPU/GPU MoE decode (OPS.md section 4): some experts resident on the GPU, the rest run
on the CPU, summed.

- :class:`LruResidency`: which experts occupy the GPU's slots; least recently used out; updated
  between steps only, with hit / miss counters.
- :class:`HybridDecodeExecutor`: the schedule, one place: router ids -> the live
  ``expert -> slot | -1`` table -> CPU routes (ids of GPU-resident experts set to -1) through
  ``ftlab.cpu.moe`` -> GPU routes (ids mapped to slots, CPU-routed ones -1) through
  ``ops.moe_experts`` on the slot banks -> ``y = y_gpu + y_cpu``.

Mechanism so far: eager (``executor.mechanism == "eager"``). The graph handshakes (host-function
node, stream memory operations) and the capability probe are not built yet.
"""

from ftlab.hybrid.executor import HybridDecodeExecutor
from ftlab.hybrid.residency import LruResidency

__all__ = ["HybridDecodeExecutor", "LruResidency"]

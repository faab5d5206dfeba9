"""Hybrid CPU/GPU MoE decode (docs/OPS.md section 4): some experts resident on the GPU, the rest run
on the CPU, summed.

- :class:`LruResidency`: which experts occupy the GPU's slots; least recently used out; updated
  between steps only, with hit / miss counters. :class:`StaticResidency`: a fixed set, nothing
  moved between steps. :func:`layer_executors`: one executor (or None) a layer under a placement --
  ``lru``, ``static``, or ``layers`` (whole layers' experts on the CPU, as llama.cpp's
  ``--n-cpu-moe``, at the share of the bytes :func:`cpu_layers` gives).
- :class:`HybridDecodeExecutor`: the schedule, one place: router ids -> the live ``expert -> slot |
  -1`` table -> CPU routes (ids of GPU-resident experts set to -1) through ``ops.moe_experts(...,
  backend="cpu")`` -> GPU routes (ids mapped to slots, CPU-routed ones -1) through
  ``ops.moe_experts`` on the slot banks -> ``y = y_gpu + y_cpu``.
- The handshakes (``ftlab.hybrid.handshake``), one interface, three classes: host-function
  nodes, stream memory operations with a step counter (both capturable in a CUDA/HIP graph,
  through :class:`CpuMoeExecutor`'s pinned per-batch-size staging and CPU worker thread), and
  eager. A capability probe at construction (capture, replay with changing inputs and splits,
  compare with eager) picks the first that passes; ``executor.mechanism`` says which and why.
  ``FTLAB_HYBRID_MECHANISM`` forces one, ``FTLAB_HYBRID_PROBE_FAIL`` fails probes (tests).
"""

from ftlab.hybrid.executor import (
    PLACEMENTS,
    HybridDecodeExecutor,
    choose_mechanism,
    layer_executors,
    probe,
)
from ftlab.hybrid.handshake import (
    CpuMoeExecutor,
    EagerHandshake,
    HandshakeError,
    HostFuncHandshake,
    StreamMemOpHandshake,
)
from ftlab.hybrid.residency import LruResidency, StaticResidency, cpu_layers

__all__ = [
    "PLACEMENTS",
    "CpuMoeExecutor",
    "EagerHandshake",
    "HandshakeError",
    "HostFuncHandshake",
    "HybridDecodeExecutor",
    "LruResidency",
    "StaticResidency",
    "StreamMemOpHandshake",
    "choose_mechanism",
    "cpu_layers",
    "layer_executors",
    "probe",
]

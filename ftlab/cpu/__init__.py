"""Native CPU kernels (C++, OpenMP) in ``csrc/``, built on first use by :mod:`ftlab.jit`.

- ``moe.py``: the ``cpu`` backend of ``ops.moe_experts`` (``csrc/moe_cpu.cc``), what the hybrid
  executor runs for the routes it sends to the CPU; also called by name:
  ``ops.moe_experts(..., backend="cpu")`` on CPU tensors.
- ``csrc/cpu_job.h``: the plain-C job the hybrid handshakes' worker thread hands to that kernel.
"""

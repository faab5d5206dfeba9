"""ftlab: kernels of a hybrid CPU/GPU Mixture-of-Experts inference engine -- each op as a
PyTorch reference, a Triton kernel and a HIP kernel, held together by property tests.

Public surface: :mod:`ftlab.ops` (the ops), :mod:`ftlab.platform` (what we run on),
:mod:`ftlab.backends` (routing, ``register``), :mod:`ftlab.quant` (Q4_0Weight), and
:mod:`ftlab.models` (Qwen3-MoE and its pipeline, imported on first use).
"""

from ftlab import backends, ops, platform, quant

__version__ = "0.1.0"
__all__ = ["backends", "ops", "platform", "quant", "__version__"]


def __getattr__(name: str):
    if name == "models":  # loads tokenizers and safetensors: only when asked for
        import importlib

        return importlib.import_module("ftlab.models")
    raise AttributeError(f"module 'ftlab' has no attribute {name!r}")

"""Test setup shared by every test module.

Without a GPU, Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET must be set
before any kernel module is imported, hence here. Hypothesis profiles: ``ci`` (the gate:
derandomized, bounded) and ``deep`` (many random examples; HYPOTHESIS_PROFILE=deep).
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "deep",
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA or ROCm GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _transformers_torch_delta_rule():
    """transformers' Qwen3-Next / Qwen3.5-MoE models bind fla's Triton kernels in place of their
    own torch ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule`` when fla
    is importable; those run on CUDA only and are not the spec. The comparisons with transformers
    run its torch functions (kept by the decorator as ``__wrapped__``) whatever is installed."""
    patched = []
    for name in ("qwen3_next", "qwen3_5_moe"):
        try:
            module = __import__(f"transformers.models.{name}.modeling_{name}", fromlist=["_"])
        except ImportError:
            continue
        for fn in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
            bound = getattr(module, fn, None)
            torch_fn = getattr(bound, "__wrapped__", None)
            if torch_fn is not None and torch_fn is not bound:
                patched.append((module, fn, bound))
                setattr(module, fn, torch_fn)
    yield
    for module, fn, bound in patched:
        setattr(module, fn, bound)


@pytest.fixture(scope="module")
def module_cache_dir(tmp_path_factory):
    """FTLAB_CACHE_DIR pointed at a fresh directory for one module's tests (the tiny models they
    build land there, not in the user's cache), restored afterwards. Modules take it with
    ``pytestmark = pytest.mark.usefixtures("module_cache_dir")``."""
    old = os.environ.get("FTLAB_CACHE_DIR")
    os.environ["FTLAB_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("FTLAB_CACHE_DIR")
    else:
        os.environ["FTLAB_CACHE_DIR"] = old

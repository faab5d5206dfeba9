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

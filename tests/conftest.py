"""Test setup shared by every test module.

Without a GPU, Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET must be set
before any kernel module is imported, hence here. Hypothesis profiles: ``ci`` (the gate:
derandomized, bounded) and ``deep`` (many random examples; HYPOTHESIS_PROFILE=deep).
"""

import importlib
import inspect
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


DELTA_RULE_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")


def torch_delta_rule(module, name: str):
    """transformers' own torch function ``name`` of ``module`` (a modeling module), behind the
    wrappers that may bind fla's kernels in its place: ``use_kernel_func_from_hub_with_fallback``'s
    function (which keeps the torch one as ``__wrapped__``), and, where the ``kernels`` package is
    installed, the ``nn.Module`` its ``use_kernel_forward_from_hub`` makes of that function (which
    calls it as ``func`` from its ``forward``). AssertionError naming what it looked for when the
    name or the torch function behind it is not found (a transformers that binds them otherwise)."""
    bound = getattr(module, name, None)
    fn = bound
    if isinstance(bound, torch.nn.Module):
        fn = inspect.getclosurevars(type(bound).forward).nonlocals.get("func")
    fn = inspect.unwrap(fn) if callable(fn) else None
    if not (inspect.isfunction(fn) and fn.__module__ == module.__name__ and fn.__name__ == name):
        raise AssertionError(
            f"{module.__name__}.{name}: expected transformers' torch function {name} (a function "
            "of that module, or one behind its __wrapped__ or a kernels Func module's forward), "
            f"got {bound!r} -> {fn!r}: the patch that keeps fla's kernels out of the comparisons "
            "with transformers must learn how this transformers binds it"
        )
    return fn


@pytest.fixture(autouse=True, scope="session")
def _transformers_torch_delta_rule():
    """transformers' Qwen3-Next / Qwen3.5-MoE models bind fla's Triton kernels in place of their
    own torch ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule`` when fla
    is importable; those run on CUDA only and are not the spec. The comparisons with transformers
    run its torch functions (:func:`torch_delta_rule` finds them) whatever is installed: the
    modules' names are bound to them for the session, checked to have taken effect."""
    patched = []
    for family in ("qwen3_next", "qwen3_5_moe"):
        try:
            module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        except ImportError:  # no transformers, or one without this model
            continue
        for name in DELTA_RULE_FUNCTIONS:
            torch_fn = torch_delta_rule(module, name)
            patched.append((module, name, getattr(module, name)))
            setattr(module, name, torch_fn)
            assert getattr(module, name) is torch_fn, f"{module.__name__}.{name} was not patched"
    yield
    for module, name, bound in patched:
        setattr(module, name, bound)


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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (make test's), except that each notebook of tests/test_notebooks.py
    is a unit of its own: one file holds every notebook, minutes of work that one worker would
    otherwise run back to back at the end of the suite."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class NotebooksApart(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith("tests/test_notebooks.py::"):
                return nodeid
            return super()._split_scope(nodeid)

    return NotebooksApart(config, log)

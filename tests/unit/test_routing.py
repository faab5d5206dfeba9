import pytest
import torch

from ftlab import backends, ops
from ftlab import platform as ftplatform

GPU = torch.device("cuda")
CPU = torch.device("cpu")
ROCM_ARCHS = [a for a, i in ftplatform.ARCHS.items() if i.vendor == "amd"]


def fake(name):
    return lambda *a: name


@pytest.fixture
def fake_op():
    """An op 'fake' with controllable built-in backends and an NVIDIA-only extra."""
    state = {"hip": None, "triton": None}
    backends.register("fake", "reference", fake("reference"), dtypes=[torch.float16, torch.float32])
    backends.register("fake", "triton", fake("triton"), available=lambda p, d: state["triton"])
    backends.register(
        "fake", "hip", fake("hip"), platforms=("cuda", "rocm"), available=lambda p, d: state["hip"]
    )
    backends.register("fake", "marlin", fake("marlin"), platforms=("cuda",), nvidia_only=True)
    yield state
    del backends.SPECS["fake"]


def plat(arch):
    return ftplatform.platform_from_arch(arch, faked=True)


def test_auto_prefers_hip_then_triton_then_reference(fake_op):
    p = plat("sm_90")
    assert backends.resolve("fake", "auto", GPU, torch.float16, p).backend == "hip"
    fake_op["hip"] = "not built"
    assert backends.resolve("fake", "auto", GPU, torch.float16, p).backend == "triton"
    fake_op["triton"] = "no triton"
    assert backends.resolve("fake", "auto", GPU, torch.float16, p).backend == "reference"


def test_auto_on_cpu_is_reference(fake_op):
    assert backends.resolve("fake", "auto", CPU, torch.float16, plat("cpu")).backend == "reference"


def test_explicit_backend_never_falls_back(fake_op):
    fake_op["hip"] = "arch gfx1103 is not built"
    with pytest.raises(
        backends.BackendUnavailable, match="'hip' cannot serve.*gfx1103 is not built"
    ):
        backends.resolve("fake", "hip", GPU, torch.float16, plat("sm_90"))


def test_explicit_hip_on_cpu_tensor(fake_op):
    with pytest.raises(backends.BackendUnavailable, match="does not run on CPU tensors"):
        backends.resolve("fake", "hip", CPU, torch.float16, plat("cpu"))


def test_unsupported_dtype_is_named(fake_op):
    with pytest.raises(backends.BackendUnavailable, match="dtype torch.bfloat16 is unsupported"):
        backends.resolve("fake", "reference", CPU, torch.bfloat16, plat("cpu"))


def test_unknown_backend(fake_op):
    with pytest.raises(ValueError, match="backend must be 'auto' or one of"):
        backends.resolve("fake", "cutlass", GPU, torch.float16, plat("sm_90"))


def test_unknown_op():
    with pytest.raises(KeyError, match="op must be one of"):
        backends.resolve("nope", "auto", CPU)


@pytest.mark.parametrize("arch", ROCM_ARCHS)
def test_rocm_never_selects_nvidia_only(fake_op, arch, monkeypatch):
    p = plat(arch)
    with pytest.raises(backends.BackendUnavailable, match="NVIDIA-only"):
        backends.resolve("fake", "marlin", GPU, torch.float16, p)
    monkeypatch.setenv("FTLAB_BACKEND", "marlin")
    with pytest.raises(backends.BackendUnavailable, match="NVIDIA-only"):
        backends.resolve("fake", "auto", GPU, torch.float16, p)
    # an NVIDIA-only kernel registered under a built-in name is skipped by auto on ROCm
    backends.register(
        "fake", "hip", fake("nv-hip"), platforms=("cuda", "rocm"), nvidia_only=True, replace=True
    )
    monkeypatch.delenv("FTLAB_BACKEND")
    chosen = backends.resolve("fake", "auto", GPU, torch.float16, p)
    assert not chosen.caps.nvidia_only and chosen.backend == "triton"


def test_nvidia_only_is_usable_on_cuda(fake_op, monkeypatch):
    monkeypatch.setenv("FTLAB_BACKEND", "marlin")
    assert backends.resolve("fake", "auto", GPU, torch.float16, plat("sm_90")).backend == "marlin"


def test_env_override_is_explicit(fake_op, monkeypatch):
    monkeypatch.setenv("FTLAB_BACKEND", "triton")
    assert backends.resolve("fake", "auto", GPU, torch.float16, plat("gfx1201")).backend == "triton"
    fake_op["triton"] = "no triton"
    with pytest.raises(backends.BackendUnavailable, match="no triton"):
        backends.resolve("fake", "auto", GPU, torch.float16, plat("gfx1201"))


def test_experimental_backends_are_never_auto(fake_op):
    fake_op["hip"] = fake_op["triton"] = "off"
    backends.register("fake", "mine", fake("mine"))
    assert (
        backends.resolve("fake", "auto", GPU, torch.float16, plat("sm_90")).backend == "reference"
    )
    assert backends.resolve("fake", "mine", GPU, torch.float16, plat("sm_90")).fn() == "mine"


def test_register_rules(fake_op):
    with pytest.raises(ValueError, match="already has a backend"):
        backends.register("fake", "hip", fake("x"))
    with pytest.raises(ValueError, match="reserved"):
        backends.register("fake", "auto", fake("x"))
    with pytest.raises(ValueError, match="cannot be removed"):
        backends.unregister("fake", "hip")


@pytest.mark.parametrize("op", ["index", "store"])
def test_real_table_has_three_backends(op):
    assert set(backends.backends_of(op)) >= {"reference", "triton", "hip"}
    assert not any(
        backends.spec(op).impls[b].caps.nvidia_only for b in ("reference", "triton", "hip")
    )


def test_unknown_gfx_arch_is_not_built(monkeypatch):
    p = plat("gfx1103")
    with pytest.raises(backends.BackendUnavailable, match="gfx1103 is not built"):
        backends.resolve("index", "hip", GPU, torch.float16, p)


def test_ops_route_explicit_errors_through_public_api():
    w = torch.zeros(4, 8)
    with pytest.raises(backends.BackendUnavailable, match="index: backend 'hip'"):
        ops.index(w, torch.tensor([0]), backend="hip")


def test_researcher_registers_a_variant():
    calls = []

    def my_index(weights, indices, out, mask_start, mask_len):
        calls.append(indices.numel())
        out.copy_(weights[indices.long()])

    backends.register("index", "my_index", my_index)
    try:
        w = torch.randn(10, 4)
        got = ops.index(w, torch.tensor([3, 1]), backend="my_index")
        assert calls == [2] and torch.equal(got, w[[3, 1]])
        assert "my_index" in backends.available_backends("index", CPU, torch.float32)
    finally:
        backends.unregister("index", "my_index")


def test_by_name_only_backends_are_not_auto(fake_op):
    fake_op["hip"] = "off"
    backends.register("fake", "triton", fake("gpu-unverified"), auto=False, replace=True)
    assert (
        backends.resolve("fake", "auto", GPU, torch.float16, plat("sm_90")).backend == "reference"
    )
    assert (
        backends.resolve("fake", "triton", GPU, torch.float16, plat("sm_90")).fn()
        == "gpu-unverified"
    )


def test_every_op_spec_is_complete():
    """Each built-in op: a family, reference + triton + hip implementations whose targets
    import, capability records with consistent paths."""
    for name in backends.ops():
        spec = backends.spec(name)
        assert spec.family and spec.summary, name
        assert {"reference", "triton", "hip"} <= set(spec.impls), name
        for impl in spec.impls.values():
            assert callable(impl.fn), (name, impl.backend)
            assert set(impl.caps.paths) <= set(spec.paths), (name, impl.backend)
            if spec.paths:
                assert impl.caps.prefill_path in impl.caps.paths, (name, impl.backend)


def test_only_kernels_are_capturable():
    """A graph may capture the Triton and HIP kernels; the reference (host reads) and the CPU
    kernels may not -- Pipeline decides its graphs from this."""
    for op in backends.ops():
        caps = {name: impl.caps.capturable for name, impl in backends.spec(op).impls.items()}
        assert caps["reference"] is False and caps["triton"] and caps["hip"], op
        assert caps.get("cpu", False) is False


def test_registered_paths_are_honoured():
    """A backend that implements only some Q4_0 paths gets only those: auto takes its prefill path
    for every row count when it has no int8 path, and an explicit path it lacks is refused."""
    backends.register("q4_0_matmul", "dq_only", lambda x, w, path: path, paths=("dequant",))
    try:
        impl = backends.spec("q4_0_matmul").impls["dq_only"]
        assert (
            impl.caps.path_for(1, "auto") == "dequant"
            and impl.caps.path_for(512, "auto") == "dequant"
        )
        assert (
            backends.resolve_path("q4_0_matmul", "dq_only", CPU, torch.float32, 2)[1] == "dequant"
        )
        with pytest.raises(backends.BackendUnavailable, match="implements the dequant path"):
            backends.resolve_path("q4_0_matmul", "dq_only", CPU, torch.float32, 2, "int8")
        with pytest.raises(ValueError, match="paths must name at least one"):
            backends.register("q4_0_matmul", "none", lambda x, w, path: path, paths=())
    finally:
        backends.unregister("q4_0_matmul", "dq_only")


def test_registered_q4_0_matmul_with_the_three_argument_signature():
    """A backend registered with ``(x, w, path)`` (the signature before ``x_q8``) is still called
    with three arguments; given ``x_q8``, ops passes it as a fourth."""
    seen = []

    def mine(x, w, path, *rest):
        seen.append(len(rest))
        return torch.zeros(x.shape[0], w.shape[0])

    backends.register(
        "q4_0_matmul", "three_args", lambda x, w, path: mine(x, w, path), platforms=("cpu",)
    )
    backends.register("q4_0_matmul", "four_args", mine, platforms=("cpu",))
    try:
        w = ops.quantize_q4_0(torch.randn(4, 64))
        x = torch.randn(2, 64)
        assert ops.q4_0_matmul(x, w, backend="three_args").shape == (2, 4)
        ops.q4_0_matmul(x, w, backend="four_args", x_q8=ops.quantize_q8_1(x))
        assert seen == [0, 1]
    finally:
        backends.unregister("q4_0_matmul", "three_args")
        backends.unregister("q4_0_matmul", "four_args")


def test_cpu_backend_is_by_name_for_cpu_tensors_only():
    """The native CPU experts are moe_experts' ``cpu`` backend: never auto, never on a GPU
    tensor."""
    cpu_impl = backends.spec("moe_experts").impls["cpu"]
    assert (
        cpu_impl.caps.platforms == {"cpu"}
        and cpu_impl.caps.paths == ("int8",)
        and not cpu_impl.caps.auto
    )
    assert (
        backends.resolve("moe_experts", "auto", CPU, torch.float32, plat("cpu")).backend
        == "reference"
    )
    with pytest.raises(backends.BackendUnavailable, match="does not run on cuda devices"):
        backends.resolve("moe_experts", "cpu", GPU, torch.float32, plat("sm_90"))
    with pytest.raises(backends.BackendUnavailable, match="int8 path"):
        backends.resolve("moe_experts", "cpu", CPU, torch.float32, plat("cpu"), path="dequant")


def test_triton_on_cpu_says_how_and_that_it_is_slow(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    why = backends.triton_unavailable(plat("cpu"), "cpu")
    assert "TRITON_INTERPRET=1" in why and "slow" in why and "reference" in why


def test_the_decode_boundary_fits_the_matvec_kernels():
    """The int8 path is taken for up to DECODE_MAX_TOKENS rows: both matvecs must take that many."""
    from ftlab.hip.q4_0 import MATVEC_ROWS as HIP_ROWS
    from ftlab.triton.q4_0_matvec import MATVEC_ROWS as TRITON_ROWS

    assert backends.DECODE_MAX_TOKENS <= min(HIP_ROWS, TRITON_ROWS)

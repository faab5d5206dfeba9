"""The planner (``ftlab.backends.plan``): its measured rules, variant tables and reasons, on faked
platforms (``platform=``: planned as if that GPU and its toolchain were here)."""

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ftlab import backends
from ftlab.backends import Call, calls, plan, rules
from ftlab.backends.registry import forget
from ftlab.platform import platform_from_arch

ROOT = Path(__file__).resolve().parents[2]
BF16, F32 = torch.bfloat16, torch.float32


def gpu(dims, dtype=BF16, **facts) -> Call:
    return Call("cuda", 0, dtype, dims, **facts)


def planned(op, call, arch, **kw):
    p = plan(op, call, platform=platform_from_arch(arch), **kw)
    return p.backend, p.path, p.variant


@pytest.mark.parametrize(
    "arch, dims, qtype, want",
    [
        ("sm_90", (512, 2048, 4096), "Q4_K", ("triton", "dequant", "gemm")),  # prefill on NVIDIA
        ("sm_80", (512, 2048, 4096), "Q8_0", ("triton", "dequant", "gemm")),
        ("gfx942", (512, 2048, 4096), "Q4_K", ("hip", "int8", "gemm")),  # ROCm keeps hip
        ("gfx1100", (512, 2048, 4096), "Q6_K", ("hip", "int8", "gemm")),
        ("sm_90", (4, 2048, 4096), "Q4_K", ("hip", "int8", "tiled")),  # small batch: hip's tiles
        ("sm_90", (1, 2048, 151936), "Q4_K", ("hip", "int8", "mv1")),  # one row: one launch
        ("sm_90", (1, 2048, 151936), "Q6_K", ("hip", "int8", "mv1")),
        ("sm_90", (1, 14336, 4096), "Q5_K", ("hip", "int8", "mv1")),
        ("sm_90", (1, 16640, 4096), "Q4_K", ("triton", "int8", "words")),  # hip would take vec
        ("sm_90", (1, 2048, 4096), "Q8_0", ("triton", "int8", "words")),  # hip would take lanes
        ("gfx942", (1, 2048, 151936), "Q6_K", ("hip", "int8", "mv1")),
        ("gfx1201", (1, 2048, 151936), "Q4_K", ("hip", "int8", "mv1")),
        ("gfx1201", (1, 2048, 4096), "Q8_0", ("hip", "int8", "lanes")),
    ],
)
def test_quant_matmul_plans(arch, dims, qtype, want):
    assert planned("quant_matmul", gpu(dims, qtype=qtype), arch, path="auto") == want


@pytest.mark.parametrize(
    "arch, dims, qtype, staging",
    [
        # asynchronous copies, rows of 16-byte pieces
        (
            "sm_90",
            (1, 2048, 151936),
            "Q6_K",
            "staged",
        ),
        ("gfx942", (1, 2048, 151936), "Q6_K", "held"),  # no asynchronous copies there
        ("sm_90", (1, 4096, 4096), "Q6_K", "held"),  # past staged's K
        ("sm_90", (1, 2048, 151936), "Q4_K", "held"),
        ("sm_90", (1, 14336, 4096), "Q5_K", "sliced_q8"),  # past held's K
    ],
)
def test_the_one_row_matvec_staging(arch, dims, qtype, staging):
    got = plan(
        "quant_matmul",
        gpu(dims, qtype=qtype),
        backend="hip",
        path="int8",
        platform=platform_from_arch(arch),
    )
    assert (got.variant, dict(got.options)) == ("mv1", {"staging": staging})
    assert f"staging {staging}" in got.describe().splitlines()[0]


def test_no_more_than_three_kernels_a_regime():
    """A backend ships at most three kernel variants for any one regime and weight type of an op
    (the rest fold into a variant's options, or go to benchmarks/dev/)."""
    sm90 = platform_from_arch("sm_90")
    dims = {
        "quant_matmul": (1, 2048, 4096),
        "q4_0_matmul": (1, 2048, 4096),
        "moe_experts": (1, 2048, 768, 128, 8),
        "decode_attention": (1, 32, 4, 128, 4096),
        "gated_delta_rule": (1, 4096, 16, 32, 128, 128),
    }
    for (op, backend), kernels in rules.KERNELS.items():
        for where in calls.REGIMES:
            for qt in (None, "Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"):
                for path in (None, "int8", "dequant"):
                    call = gpu(
                        dims[op], qtype=qt, qtype_down=qt if op == "moe_experts" else None, chunk=64
                    )
                    sizes = dict(zip(backends.spec(op).shape, call.dims, strict=True))
                    serving = [
                        k.name
                        for k in kernels
                        if k.when.miss(call, sm90, where, path) is None
                        and (k.limit is None or k.limit(call, sizes, sm90) is None)
                    ]
                    assert len(serving) <= 3, (op, backend, where, qt, path, serving)


def test_an_explicit_backend_or_path_keeps_the_auto_order():
    call = gpu((512, 2048, 4096), qtype="Q4_K")
    assert planned("quant_matmul", call, "sm_90", path="int8") == ("hip", "int8", "gemm")
    assert planned("quant_matmul", call, "sm_90", backend="hip", path="auto") == (
        "hip",
        "int8",
        "gemm",
    )
    one = gpu((1, 2048, 4096), qtype="Q8_0")
    assert planned("quant_matmul", one, "sm_90", backend="hip", path="auto") == (
        "hip",
        "int8",
        "lanes",
    )


def test_unaligned_weights_move_the_one_row_plan():
    call = gpu((1, 2048, 4096), qtype="Q4_K", align=4)
    assert planned("quant_matmul", call, "sm_90", path="auto") == ("triton", "int8", "words")
    assert planned("quant_matmul", call, "gfx1201", path="auto") == ("hip", "int8", "lanes")


@pytest.mark.parametrize(
    "arch, dtype, want",
    [
        ("sm_90", BF16, ("triton", "dequant", None)),  # where Triton's Q4_0 tiles were timed
        ("sm_90", F32, ("hip", "int8", "gemm")),
        ("sm_80", BF16, ("hip", "int8", "gemm")),
        ("gfx942", BF16, ("hip", "int8", "gemm")),
    ],
)
def test_q4_0_prefill_plans(arch, dtype, want):
    call = gpu((512, 2048, 4096), dtype, qtype="Q4_0")
    assert planned("q4_0_matmul", call, arch, path="auto") == want


def test_q4_0_decode_plans():
    assert (
        planned("q4_0_matmul", gpu((1, 2048, 4096), qtype="Q4_0"), "sm_90", path="auto")[2]
        == "fused"
    )
    assert (
        planned("q4_0_matmul", gpu((8, 2048, 4096), qtype="Q4_0"), "sm_90", path="auto")[2]
        == "matvec"
    )
    odd = gpu((8, 2080, 4096), qtype="Q4_0")  # 65 blocks a row: no word pairs
    assert planned("q4_0_matmul", odd, "sm_90", path="auto")[2] == "gemm"


@pytest.mark.parametrize(
    "t, qtypes, arch, want",
    [
        (512, ("Q4_K", "Q6_K"), "sm_90", ("triton", "dequant", None)),
        (512, ("Q4_0", "Q4_0"), "sm_90", ("triton", "dequant", None)),
        (512, ("Q4_0", "Q4_K"), "sm_90", ("hip", "int8", "lanes")),  # a mix: untimed, hip keeps it
        (512, (None, None), "sm_90", ("hip", None, "gemm")),  # dense banks: no path
        (4, ("Q4_K", "Q6_K"), "sm_90", ("hip", "int8", "vec")),
        (4, ("Q8_0", "Q8_0"), "sm_90", ("hip", "int8", "lanes")),
        (4, ("Q4_0", "Q4_0"), "sm_90", ("hip", "int8", "decode")),
        (512, ("Q4_K", "Q6_K"), "gfx942", ("hip", "int8", "lanes")),
    ],
)
def test_moe_experts_plans(t, qtypes, arch, want):
    call = gpu((t, 2048, 768, 128, 8), qtype=qtypes[0], qtype_down=qtypes[1])
    assert planned("moe_experts", call, arch, path="auto") == want


def test_a_preferred_backend_that_cannot_serve_is_passed_over(monkeypatch):
    impl = backends.spec("quant_matmul").impls["triton"]
    monkeypatch.setattr(impl, "caps", replace(impl.caps, platforms=frozenset({"cpu"})))
    forget()
    try:
        call = gpu((512, 2048, 4096), qtype="Q4_K")
        assert planned("quant_matmul", call, "sm_90", path="auto") == ("hip", "int8", "gemm")
    finally:
        monkeypatch.undo()
        forget()


def test_decode_attention_and_delta_rule_variants():
    att = gpu((1, 32, 4, 128, 4096))
    assert planned("decode_attention", att, "sm_90")[2] == "tiles"
    assert planned("decode_attention", gpu((1, 32, 4, 96, 4096)), "sm_90")[2] == "split"
    assert planned("decode_attention", gpu((1, 32, 4, 128, 4096), F32), "sm_90")[2] == "split"
    dn = gpu((1, 4096, 16, 32, 128, 128), chunk=64)
    assert planned("gated_delta_rule", dn, "sm_90") == ("hip", None, "chunk")
    assert planned("gated_delta_rule", dn, "sm_90", backend="triton")[2] == "chunk64"
    assert planned("gated_delta_rule", dn, "gfx1100", backend="triton")[2] == "chunk"  # RDNA
    assert planned("gated_delta_rule", dn._replace(chunk=32), "sm_90")[2] == "scan"


def test_a_named_variant_is_checked_never_swapped():
    call = gpu((1, 4096, 4096), qtype="Q4_K")
    with pytest.raises(backends.BackendUnavailable, match="'mv1' cannot serve.*K = 16640"):
        plan(
            "quant_matmul",
            call._replace(dims=(1, 16640, 4096)),
            backend="hip",
            path="int8",
            variant="mv1",
            platform=platform_from_arch("sm_90"),
        )
    with pytest.raises(ValueError, match="variant must be one of"):
        plan(
            "quant_matmul",
            call,
            backend="hip",
            path="int8",
            variant="nope",
            platform=platform_from_arch("sm_90"),
        )
    with pytest.raises(ValueError, match="variant must be None"):
        plan(
            "add_rmsnorm",
            gpu((1, 2048)),
            backend="hip",
            variant="fused",
            platform=platform_from_arch("sm_90"),
        )


def test_precision_bf16_says_where_it_applies():
    dn = gpu((1, 4096, 16, 32, 128, 128), chunk=64, precision="bf16")
    assert (
        "bf16 operands" in plan("gated_delta_rule", dn, platform=platform_from_arch("sm_90")).reason
    )
    f32 = gpu((1, 4096, 16, 32, 128, 128), F32, chunk=64, precision="bf16")
    assert (
        "does not apply"
        in plan("gated_delta_rule", f32, platform=platform_from_arch("sm_90")).reason
    )
    cpu = Call("cpu", None, BF16, (1, 64, 2, 2, 16, 16), chunk=64, precision="bf16")
    assert "does not apply" in plan("gated_delta_rule", cpu).reason  # the reference: fp32


RULED = {op for row in rules.PREFER for op in row.ops} | {op for op, _ in rules.KERNELS}


@pytest.mark.parametrize("op", [op for op in backends.ops() if op not in RULED])
def test_ops_without_rules_plan_what_resolve_gives(op):
    """For an op the tables say nothing of, the plan is the auto order's first that serves."""
    names = backends.spec(op).shape
    call = Call(
        "cpu",
        None,
        F32,
        tuple(range(1, len(names) + 1)),
        qtype="Q4_0" if backends.spec(op).paths else None,
    )
    got = plan(op, call, path="auto" if backends.spec(op).paths else None)
    assert got.backend == backends.resolve(op, "auto", torch.device("cpu"), F32).backend
    assert got.variant is None


def test_every_rule_cites_results_that_exist():
    whys = [row.why for row in rules.PREFER] + [d.why for ds in rules.DEFAULTS.values() for d in ds]
    cited = {m for why in whys for m in re.findall(r"benchmarks/results/[\w.-]+", why)}
    assert cited, "the rules cite no results"
    missing = sorted(c for c in cited if not (ROOT / c).is_file())
    assert missing == []
    for row in rules.PREFER:
        assert "benchmarks/results/" in row.why, row


def test_the_tables_name_ops_backends_and_kernels_that_exist():
    for (op, backend), kernels in rules.KERNELS.items():
        assert backend in backends.spec(op).impls, (op, backend)
        names = {k.name for k in kernels}
        assert len(names) == len(kernels), (op, backend)
        assert {d.variant for d in rules.DEFAULTS[(op, backend)]} <= names, (op, backend)
    assert set(rules.DEFAULTS) == set(rules.KERNELS)
    for row in rules.PREFER:
        for op in row.ops:
            assert row.backend in backends.spec(op).impls


def test_plans_are_cached_until_the_table_changes():
    call = Call("cpu", None, F32, (2, 64, 8), qtype="Q8_0")
    first = plan("quant_matmul", call, path="auto")
    assert plan("quant_matmul", call, path="auto") is first
    backends.register("quant_matmul", "mine", lambda x, w, path: x, replace=True)
    try:
        assert plan("quant_matmul", call, path="auto") is not first
    finally:
        backends.unregister("quant_matmul", "mine")


def test_the_reason_reads_in_clauses():
    got = plan(
        "quant_matmul",
        gpu((1, 2048, 151936), qtype="Q4_K"),
        path="auto",
        platform=platform_from_arch("gfx1201"),
    )
    text = got.describe()
    assert text.splitlines()[0] == "quant_matmul: backend hip, path int8, variant mv1, staging held"
    assert "the first of the auto order" in text and "gfx1201" in text and "variant mv1" in text


def test_an_op_takes_a_plan_made_for_it():
    """``plan=``: the op runs the plan it is given (no planning of its own); a plan of another op
    or anything else is refused naming the argument."""
    from ftlab import ops
    from ftlab.testing.quant_matmul import random_quant_weight

    w = random_quant_weight(3, "Q4_K", 16, 256)
    x = torch.randn(2, 256)
    made = plan("quant_matmul", backends.calls.matmul(x, w), path="int8", backend="reference")
    torch.testing.assert_close(
        ops.quant_matmul(x, w, plan=made), ops.quant_matmul(x, w, path="int8")
    )
    other = plan("add_rmsnorm", Call("cpu", None, F32, (2, 256)))
    with pytest.raises(
        ValueError, match="plan must be a plan of quant_matmul, got one of add_rmsnorm"
    ):
        ops.quant_matmul(x, w, plan=other)
    with pytest.raises(TypeError, match="plan must be a ftlab.backends.Plan"):
        ops.quant_matmul(x, w, plan="reference")


def test_a_model_plans_each_call_once(monkeypatch):
    """A model keeps the plan of each weight's call (its ``op_plans``): a second forward pass over
    the same shapes plans nothing."""
    from ftlab.backends import planner as plan_module
    from ftlab.models.pipeline import Pipeline

    pipe = Pipeline.load("tiny-qwen3-moe", quant="q4_0")
    tokens, positions = torch.tensor([[3, 4]]), torch.tensor([[0, 1]])
    pipe.model.forward(tokens, positions)
    made = []
    real = plan_module.plan
    monkeypatch.setattr(plan_module, "plan", lambda *a, **k: made.append(a[0]) or real(*a, **k))
    monkeypatch.setattr(backends, "plan", plan_module.plan)
    pipe.model.forward(tokens, positions)
    assert made == [] and pipe.model.op_plans

"""Hybrid CPU/GPU MoE (docs/OPS.md section 4), the parts a CPU runs: the native CPU expert kernels
against the reference, the LRU residency policy as a state machine, and the split math (GPU
part + CPU part == all experts) with the GPU part simulated on the CPU."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import ftlab.testing as ft
from ftlab import ops
from ftlab.hybrid import HybridDecodeExecutor, LruResidency, StaticResidency
from ftlab.jit import cpu_unavailable_reason

needs_cpu_build = pytest.mark.skipif(
    cpu_unavailable_reason() is not None, reason=str(cpu_unavailable_reason())
)


@st.composite
def expert_case(draw):
    t = draw(st.sampled_from([1, 2, 5, 64]))
    e = draw(st.sampled_from([8, 60, 128]))
    k = draw(st.sampled_from([1, 2, 8]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    h = 32 * draw(st.sampled_from([1, 3, 5]))
    inter = 32 * draw(st.sampled_from([1, 2, 3]))
    logits = torch.randn(t, e, generator=gen)
    if draw(st.booleans()):
        logits = torch.randint(0, 3, (t, e), generator=gen).float()  # ties
    weights, ids = ops.route_topk(logits, k)
    ids[torch.rand(ids.shape, generator=gen) < 0.3] = -1
    ids[torch.rand(ids.shape, generator=gen) < 0.05] = e + 2
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    x = torch.randn(t, h, generator=gen).to(dtype)
    gu = torch.randn(e, 2 * inter, h, generator=gen) * h**-0.5
    dn = torch.randn(e, h, inter, generator=gen) * inter**-0.5
    if draw(st.booleans()):
        return x, ops.quantize_q4_0(gu), ops.quantize_q4_0(dn), weights, ids, "int8"
    return x, gu.to(dtype), dn.to(dtype), weights, ids, "dequant"


@needs_cpu_build
@settings(max_examples=40, deadline=None)
@given(expert_case())
def test_cpu_experts_match_reference(case):
    x, gu, dn, w, ids, path = case
    want = ops.moe_experts(x, gu, dn, w, ids, path=path, backend="reference")
    got = ops.moe_experts(x, gu, dn, w, ids, path=path, backend="cpu")
    assert got.dtype == x.dtype and got.shape == x.shape
    bound = ft.experts_tolerance(x, gu, dn, w, ids, path, want)
    err = (got.float() - want.float()).abs()
    assert bool((err <= bound).all()), (
        f"off by {float(err.max()):.3g}, bound {float(bound.max()):.3g}"
    )


@needs_cpu_build
def test_cpu_experts_read_nothing_for_invalid_ids():
    x = torch.randn(3, 64)
    gu, dn = torch.randn(6, 64, 64) * 0.1, torch.randn(6, 64, 32) * 0.1
    q_gu, q_dn = ops.quantize_q4_0(gu), ops.quantize_q4_0(dn)
    gu[2:4], dn[2:4] = float("nan"), float("nan")
    q_gu.data[2:4], q_dn.data[2:4] = 0xFF, 0xFF  # NaN scales
    ids = torch.tensor([[0, -1], [7, 1], [-1, -1]], dtype=torch.int32)
    for a, b in ((gu, dn), (q_gu, q_dn)):
        y = ops.moe_experts(x, a, b, torch.full((3, 2), 0.5), ids, path="int8", backend="cpu")
        assert torch.isfinite(y).all() and bool((y[2] == 0).all())


class LruMachine(RuleBasedStateMachine):
    """The policy against a plain model of LRU: residency within the slots, the table and the
    slot map agree, hits and misses counted per distinct expert a step, the loads are exactly
    the experts that became resident."""

    def __init__(self):
        super().__init__()
        self.policy = None

    @rule(experts=st.integers(1, 16), slots=st.integers(0, 16))
    def start(self, experts, slots):
        slots = min(slots, experts)
        self.policy = LruResidency(experts, slots)
        self.model: list[int] = []  # resident experts, least recent first
        self.hits = self.misses = 0

    @rule(data=st.data())
    def step(self, data):
        if self.policy is None:
            return
        e = self.policy.num_experts
        ids = data.draw(st.lists(st.integers(-1, e + 1), min_size=1, max_size=12))
        seen = list(dict.fromkeys(i for i in ids if 0 <= i < e))
        self.hits += sum(i in self.model for i in seen)
        self.misses += sum(i not in self.model for i in seen)
        before = set(self.model)
        window = seen[-self.policy.slots :] if self.policy.slots else []
        for i in window:  # the step's resident experts become the most recent
            if i in self.model:
                self.model.remove(i)
                self.model.append(i)
        for i in window:  # then each miss takes a free slot or the least recent one's
            if i not in self.model:
                if len(self.model) == self.policy.slots:
                    self.model.pop(0)
                self.model.append(i)
        loads = self.policy.update(torch.tensor(ids))
        assert {x for x, _ in loads} == set(self.model) - before
        assert self.policy.resident() == set(self.model)

    @invariant()
    def consistent(self):
        p = self.policy
        if p is None:
            return
        assert len(p.resident()) <= p.slots
        assert (p.hits, p.misses) == (self.hits, self.misses)
        table = p.table().tolist()
        for e, s in enumerate(table):
            assert (s >= 0) == (e in p.resident())
            if s >= 0:
                assert p.expert_in[s] == e
        assert sorted(s for s in table if s >= 0) == sorted(
            s for s, e in enumerate(p.expert_in) if e >= 0
        )


TestLru = LruMachine.TestCase
TestLru.settings = settings(max_examples=60, stateful_step_count=20, deadline=None)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), experts=st.integers(1, 16))
def test_static_residency_never_moves(data, experts):
    """A fixed set: the chosen experts hold their slots in order whatever the steps route, no step
    loads anything, and hits / misses count each step's distinct valid experts."""
    slots = data.draw(st.integers(0, experts))
    chosen = data.draw(
        st.one_of(st.none(), st.permutations(range(experts)).map(lambda p: p[:slots]))
    )
    policy = StaticResidency(experts, slots, chosen)
    want = list(range(slots)) if chosen is None else chosen
    hits = misses = 0
    for _ in range(data.draw(st.integers(1, 5))):
        ids = data.draw(st.lists(st.integers(-1, experts + 1), min_size=1, max_size=12))
        seen = {i for i in ids if 0 <= i < experts}
        hits += len(seen & set(want))
        misses += len(seen - set(want))
        assert policy.update(torch.tensor(ids)) == []
        assert policy.expert_in == want and policy.resident() == set(want)
        assert policy.table().tolist() == [
            want.index(e) if e in want else -1 for e in range(experts)
        ]
    assert (policy.hits, policy.misses) == (hits, misses)


def test_static_residency_arguments():
    with pytest.raises(
        ValueError, match=r"experts must be 2 distinct ids in \[0, 4\), got \[1, 1\]"
    ):
        StaticResidency(4, 2, [1, 1])
    with pytest.raises(
        ValueError, match=r"experts must be 2 distinct ids in \[0, 4\), got \[0, 4\]"
    ):
        StaticResidency(4, 2, [0, 4])
    with pytest.raises(ValueError, match=r"experts must be 2 distinct ids in \[0, 4\), got \[0\]"):
        StaticResidency(4, 2, [0])
    with pytest.raises(
        TypeError, match="experts must be a list or tuple of ints, got \\[0, 1.0\\]"
    ):
        StaticResidency(4, 2, [0, 1.0])
    with pytest.raises(ValueError, match="slots must be an int in \\[0, 4\\], got 5"):
        StaticResidency(4, 5)


def test_executor_with_static_residency_copies_its_experts_once():
    """The executor loads a static policy's experts into their slots at construction, and a step's
    end moves nothing: the slot banks hold the chosen experts' bytes, step after step."""
    gen = torch.Generator().manual_seed(5)
    e, h, inter = 6, 64, 32
    gu = ops.quantize_q4_0(torch.randn(e, 2 * inter, h, generator=gen))
    dn = ops.quantize_q4_0(torch.randn(e, h, inter, generator=gen))
    ex = HybridDecodeExecutor(
        gu, dn, 2, "cpu", policy=StaticResidency(e, 2, [4, 1]), backend="reference", path="int8"
    )
    for _ in range(3):
        assert torch.equal(ex.slot_gate_up.data, gu.data[[4, 1]]) and torch.equal(
            ex.slot_down.data, dn.data[[4, 1]]
        )
        assert ex.table.tolist() == [-1, 1, -1, -1, 0, -1]
        assert ex.end_step(torch.tensor([[0, 2], [3, 5]])) == []
    assert (ex.policy.hits, ex.policy.misses) == (0, 12)


@needs_cpu_build
@pytest.mark.parametrize(
    "cpu_share, banks",
    [(s, b) for b in ("Q4_0", "dense") for s in (0.0, 0.5, 1.0)] + [(0.5, "Q4_K_M")],
)
def test_split_math_equals_all_experts(cpu_share, banks):
    """GPU part (simulated: the reference on the CPU over the slot banks) + CPU part (native
    kernels) == all experts through the reference, within the experts bound, as routes move
    between the parts step by step. Q4_K_M: Q4_K gate_up, Q6_K down (a Q4_K_M file's layers)."""
    q4 = banks != "dense"
    gen = torch.Generator().manual_seed(int(cpu_share * 10) + q4)
    e, k, h, inter, t = 16, 4, 96, 64, 3
    if banks == "Q4_K_M":
        e, h, inter = 8, 256, 256
    gu = torch.randn(e, 2 * inter, h, generator=gen) * h**-0.5
    dn = torch.randn(e, h, inter, generator=gen) * inter**-0.5
    if banks == "Q4_0":
        gu, dn = ops.quantize_q4_0(gu), ops.quantize_q4_0(dn)
    elif banks == "Q4_K_M":
        gu = ft.random_quant_bank(e, "Q4_K", e, 2 * inter, h, magnitude=4 * h**-0.5)
        dn = ft.random_quant_bank(e + 1, "Q6_K", e, h, inter, magnitude=4 * inter**-0.5)
    slots = round(e * (1 - cpu_share))
    ex = HybridDecodeExecutor(
        gu, dn, slots, "cpu", backend="reference", path="int8" if q4 else "dequant"
    )
    for _ in range(3 if banks == "Q4_K_M" else 6):
        x = torch.randn(t, h, generator=gen)
        w, ids = ops.route_topk(torch.randn(t, e, generator=gen), k)
        ids[0, 0] = -1
        gpu_ids, cpu_ids = ex.split(ids)
        routed = (ids >= 0) & (ids < e)
        assert bool(((gpu_ids >= 0) ^ (cpu_ids >= 0) | ~routed).all()), (
            "each route goes to exactly one part"
        )
        assert bool(((gpu_ids < 0) & (cpu_ids < 0) | routed).all()), "invalid ids go to neither"
        got = ex(x, w, ids)
        path = "int8" if q4 else "dequant"
        want = ops.moe_experts(x, gu, dn, w, ids, path=path, backend="reference")
        bound = ft.experts_tolerance(x, gu, dn, w, ids, path, want)
        assert bool(((got - want).abs() <= bound).all())
        ex.end_step(ids)
    if cpu_share == 1.0:
        assert ex.policy.hits == 0


def _host_has(*flags: str) -> bool:
    try:
        line = next(line for line in open("/proc/cpuinfo") if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    have = set(line.split(":", 1)[1].split())
    return all(f in have for f in flags)


#: the CPU builds compared: native (AVX-512 VNNI block pairs where the host has them), avx2 (on a
#: host that runs x86-64-v3 code: the AVX2 block dots even where native takes AVX-512) and
#: portable (scalar)
X86_64_V3 = ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
ISAS = ("native", "avx2", "portable") if _host_has(*X86_64_V3) else ("native", "portable")


@needs_cpu_build
def test_portable_build_equals_native_on_q4_0(tmp_path):
    """The scalar code (a build without -march=native), the AVX2 one and the native one (AVX-512
    VNNI block pairs where the host has them, with an odd block count's last block by AVX2) all
    hold to the reference on Q4_0 banks."""
    import os
    import subprocess
    import sys

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 160, generator=gen)
    gu = ops.quantize_q4_0(torch.randn(8, 192, 160, generator=gen) * 0.1)
    dn = ops.quantize_q4_0(torch.randn(8, 160, 96, generator=gen) * 0.1)
    w, ids = ops.route_topk(torch.randn(4, 8, generator=gen), 2)
    torch.save({"x": x, "gu": gu.data, "dn": dn.data, "w": w, "ids": ids}, tmp_path / "case.pt")
    code = (
        "import sys, torch; from ftlab import ops; from ftlab.quant import Q4_0Weight; c = "
        "torch.load(sys.argv[1]); y = ops.moe_experts(c['x'], Q4_0Weight(c['gu'], (8, 192, 160)), "
        "Q4_0Weight(c['dn'], (8, 160, 96)), c['w'], c['ids'], path='int8', backend='cpu'); "
        "torch.save(y, sys.argv[2])"
    )
    outs = []
    for isa in ISAS:
        out = tmp_path / f"{isa}.pt"
        env = {**os.environ, "FTLAB_CPU_ISA": isa}
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "case.pt"), str(out)], env=env, check=True
        )
        outs.append(torch.load(out))
    want = ops.moe_experts(x, gu, dn, w, ids, path="int8", backend="reference")
    bound = ft.experts_tolerance(x, gu, dn, w, ids, "int8", want)
    for isa, got in zip(ISAS, outs, strict=True):
        assert bool(((got - want).abs() <= bound).all()), isa


@needs_cpu_build
def test_portable_build_equals_native_on_kquants(tmp_path):
    """The scalar K-quant / Q8_0 row dots and the AVX2 ones (native and x86-64-v3 builds) hold to
    the reference, Q4_K_M's Q4_K gate_up with Q6_K down and Q8_0 gate_up with Q5_K down."""
    import os
    import subprocess
    import sys

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(3, 256, generator=gen)
    w, ids = ops.route_topk(torch.randn(3, 4, generator=gen), 2)
    pairs = [("Q4_K", "Q6_K"), ("Q8_0", "Q5_K")]
    banks = [
        (ft.random_quant_bank(i, a, 4, 512, 256), ft.random_quant_bank(9 + i, b, 4, 256, 256))
        for i, (a, b) in enumerate(pairs)
    ]
    torch.save(
        {"x": x, "w": w, "ids": ids, "banks": [(a.data, b.data) for a, b in banks]},
        tmp_path / "case.pt",
    )
    code = (
        "import sys, torch; from ftlab import ops; from ftlab.quant import QuantWeight; c = "
        "torch.load(sys.argv[1]); ys = [ops.moe_experts(c['x'], QuantWeight(a, (4, 512, 256), "
        "ta), QuantWeight(b, (4, 256, 256), tb), c['w'], c['ids'], path='int8', backend='cpu') "
        f"for (a, b), (ta, tb) in zip(c['banks'], {pairs!r})]; torch.save(ys, sys.argv[2])"
    )
    for isa in ISAS:
        out = tmp_path / f"{isa}.pt"
        env = {**os.environ, "FTLAB_CPU_ISA": isa}
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "case.pt"), str(out)], env=env, check=True
        )
        for (gu, dn), got in zip(banks, torch.load(out), strict=True):
            want = ops.moe_experts(x, gu, dn, w, ids, path="int8", backend="reference")
            bound = ft.experts_tolerance(x, gu, dn, w, ids, "int8", want)
            assert bool(((got - want).abs() <= bound).all()), (isa, gu.qtype, dn.qtype)


@needs_cpu_build
def test_bench_hybrid_cpu_rows_are_validated():
    """``ftlab bench hybrid`` on a CPU: a row per residency with CPU routes, each checked against
    the reference before timing."""
    from ftlab.bench import hybrid

    report = hybrid.run(quick=True)
    rows = [m for m in report.measurements if m.backend == "cpu experts"]
    assert [m.case.split(":")[0] for m in rows] == ["T=1, 50% resident", "T=1, 25% resident"]
    assert all(m.validated and m.time_us > 0 and m.bytes_moved > 0 for m in rows)
    assert report.copy_what == "host memory" and report.copy_gbps > 0


def test_mechanism_on_cpu_is_eager_without_warning(monkeypatch):
    """No GPU: the probe fails with its reason, the executor runs eagerly, nothing is warned."""
    import warnings

    from ftlab.hybrid import executor as hx

    gu = torch.randn(4, 64, 32)
    dn = torch.randn(4, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ex = HybridDecodeExecutor(gu, dn, 2, "cpu", backend="reference", path="dequant")
    assert ex.mechanism == "eager" and not ex.capturable
    assert [(n, ok) for n, ok, _ in ex.probe_results] == [(n, False) for n in hx.PROBE_ORDER]
    assert all("no GPU" in why for _, _, why in ex.probe_results)
    monkeypatch.setenv(hx.ENV_PROBE_FAIL, "host_func")
    assert hx.probe("host_func", "cpu") == (False, f"forced to fail by {hx.ENV_PROBE_FAIL}")
    monkeypatch.setenv(hx.ENV_MECHANISM, "eager")
    ex = HybridDecodeExecutor(gu, dn, 2, "cpu", backend="reference", path="dequant")
    assert ex.mechanism == "eager" and "forced" in ex.mechanism_reason and ex.probe_results == []
    monkeypatch.setenv(hx.ENV_MECHANISM, "bogus")
    with pytest.raises(ValueError, match="mechanism must be"):
        HybridDecodeExecutor(gu, dn, 2, "cpu", backend="reference", path="dequant")


@needs_cpu_build
def test_cpu_job_entry_is_exported():
    """The handshakes' worker threads call the CPU kernel through a C entry point."""
    from ftlab.cpu.moe import job_entry

    assert job_entry() != 0


@needs_cpu_build
def test_cpu_job_entry_runs_q4_k_m_banks():
    """The handshakes' plain-C entry on a job of Q4_K gate_up and Q6_K down (cpu_job.h's two
    kinds) gives the cpu backend's answer; a job of a dense gate_up beside a quantized down, or
    of another version, is refused with nothing written."""
    import ctypes

    from ftlab.cpu.moe import job_entry, job_kind

    class Job(ctypes.Structure):
        _fields_ = (
            [(n, ctypes.c_int32) for n in ("version", "kind", "threads", "reserved")]
            + [(n, ctypes.c_int64) for n in ("tokens", "hidden", "top_k", "experts", "inter")]
            + [(n, ctypes.c_void_p) for n in ("x", "ids", "w", "y", "gate_up", "down")]
        )

    gu = ft.random_quant_bank(3, "Q4_K", 4, 512, 256)
    dn = ft.random_quant_bank(4, "Q6_K", 4, 256, 256)
    x = torch.randn(2, 256)
    w, ids = ops.route_topk(torch.randn(2, 4), 2)
    y = torch.full((2, 256), 7.0)
    args = [
        x.data_ptr(),
        ids.data_ptr(),
        w.data_ptr(),
        y.data_ptr(),
        gu.data.data_ptr(),
        dn.data.data_ptr(),
    ]
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Job))(job_entry())
    for version, kind in ((2, job_kind(gu, dn)), (3, 1 | job_kind(gu, dn) & ~0xFF)):
        assert fn(ctypes.byref(Job(version, kind, 0, 0, 2, 256, 2, 4, 256, *args))) == 1
    assert bool((y == 7.0).all())
    assert fn(ctypes.byref(Job(3, job_kind(gu, dn), 0, 0, 2, 256, 2, 4, 256, *args))) == 0
    assert torch.equal(y, ops.moe_experts(x, gu, dn, w, ids, path="int8", backend="cpu"))


def test_channel_handshake_marks_its_phases_in_order():
    """The graph handshakes' step (submit, GPU part, join) with the native calls stubbed: the
    phase marks the timeline records come before the submit, the GPU part and the join, and
    after it."""
    from types import SimpleNamespace

    from ftlab.hybrid.handshake import StreamMemOpHandshake

    calls = []
    module = SimpleNamespace(
        hs_submit=lambda *a: calls.append("submit"),
        hs_join=lambda h, y_gpu, y: (calls.append("join"), y.copy_(y_gpu)),
    )
    channel = SimpleNamespace(handle=1, gpu_ids=torch.full((2, 3), -1, dtype=torch.int32))
    hs = object.__new__(StreamMemOpHandshake)
    hs.cpu = SimpleNamespace(module=module, hidden=8, channel=lambda t, k: channel)

    def gpu_part(gpu_ids):
        calls.append("gpu")
        return torch.ones(2, 8)

    y = hs(
        torch.zeros(2, 8),
        torch.ones(2, 3),
        torch.zeros(2, 3, dtype=torch.int64),
        torch.zeros(4, dtype=torch.int32),
        gpu_part,
        mark=lambda i: calls.append(i),
    )
    assert calls == [0, "submit", 1, "gpu", 2, "join", 3]
    assert torch.equal(y, torch.ones(2, 8))
    with pytest.raises(ValueError, match="hidden size 8"):
        hs(torch.zeros(2, 4), torch.ones(2, 3), torch.zeros(2, 3), torch.zeros(4), gpu_part)

"""Launch schedules (ftlab.launches) and the eager decode step launched from one
(ftlab.models.decode_steps.DecodeLaunches).

CPU: the recording mechanism over stand-in modules (their functions compute on CPU tensors in
place, as a kernel writes its outputs): a schedule launched again after its inputs were rewritten
gives what running the work again gives; each thing a schedule cannot repeat is refused by name.
GPU: a static Qwen3-MoE's decode steps launched from the recorded schedule equal the same steps
launched op by op, bit for bit (logits and KV cache), at several positions and batches; the
pipeline takes the schedule with graphs off, and falls back to op by op (saying why) where the
layers do not record."""

import os

import pytest
import torch

from ftlab import jit, launches
from ftlab.backends.registry import forget
from ftlab.launches import NotReplayable, record


def _torch(t):
    """A tensor argument as torch's: the C++ runner hands a Python function tvm-ffi tensors."""
    return t if isinstance(t, torch.Tensor) else torch.from_dlpack(t)


class _Module:
    """A stand-in GPU module: each function writes its outputs in place and returns None."""

    @staticmethod
    def scale(x, out, factor):
        _torch(out).copy_(_torch(x) * factor)

    @staticmethod
    def add(a, b, out):
        torch.add(_torch(a), _torch(b), out=_torch(out))

    @staticmethod
    def answer(x):
        return 42

    @staticmethod
    def keep(*args):
        pass


@pytest.fixture
def fake_gpu(monkeypatch):
    """jit.module_for hands out _Module for any name (CPU tensors, no GPU)."""
    monkeypatch.setattr(jit, "_device_modules", {})
    monkeypatch.setattr(jit, "load_gpu", lambda name, plat=None: _Module())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return torch.device("cpu")


def test_schedule_launched_again_reads_rewritten_inputs(fake_gpu):
    x = torch.arange(6, dtype=torch.float32)

    def work():
        m = jit.module_for("fake", fake_gpu)
        y = x.new_empty(x.shape)  # allocations and views are allowed: the schedule keeps them
        m.scale(x, y, 2.0)
        z = x.new_empty((2, 3))
        m.add(y.view(2, 3), x.view(2, 3), z)
        return z

    schedule, z = record(work)
    assert len(schedule) == 2 and torch.equal(z, 3 * torch.arange(6.0).view(2, 3))
    assert schedule.native is None  # the C++ runner is built at the first launch
    for trial in range(6):  # from C++ (cpu/csrc/launch_runner.cc), then from a Python loop
        new = torch.randn(6, generator=torch.Generator().manual_seed(trial))
        x.copy_(new)
        schedule.launch() if trial < 3 else schedule.launch_each()
        assert torch.equal(z, (new * 2.0 + new).view(2, 3))
    assert schedule.native is True
    assert any(t is x for t in schedule.tensors())


@pytest.mark.parametrize("what", ["torch kernel", "returned value", "cpu module", "triton kernel"])
def test_record_refuses_what_a_schedule_cannot_repeat(fake_gpu, monkeypatch, tmp_path, what):
    x = torch.ones(4)
    if what == "triton kernel" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a Triton kernel on CPU tensors needs TRITON_INTERPRET=1 (as make test sets)")
    if what == "cpu module":  # load_cpu finding the module built (a stand-in: nothing is compiled)
        monkeypatch.setattr(jit, "cpu_flags", lambda: ("-O0",))
        monkeypatch.setattr(jit, "cpu_unavailable_reason", lambda: None)
        monkeypatch.setattr(jit, "cpu_build_dir", lambda name: tmp_path)
        monkeypatch.setattr(jit, "_load_cached", lambda key, path, build: _Module())

    def work():
        m = jit.module_for("fake", fake_gpu)
        y = x.new_empty(x.shape)
        m.scale(x, y, 2.0)
        if what == "torch kernel":
            return y + 1
        if what == "returned value":
            return m.answer(y)
        if what == "cpu module":
            return jit.load_cpu("moe")
        if what == "triton kernel":
            from ftlab.triton.index_store import index as triton_index

            out = torch.empty(2, 8)
            triton_index(torch.ones(4, 8), torch.tensor([1, 2]), out, 0, -1)
            return out
        return y

    with pytest.raises(NotReplayable) as err:
        record(work)
    expect = {
        "torch kernel": "aten.add",
        "returned value": "answer returned a value",
        "cpu module": "CPU module 'moe'",
        "triton kernel": "Triton kernel",
    }[what]
    assert any(expect in r for r in err.value.reasons), err.value.reasons
    schedule, _ = record(lambda: jit.module_for("fake", fake_gpu).scale(x, x.new_empty(4), 1.0))
    assert len(schedule) == 1  # nothing left recording: a new recording starts


def test_record_refuses_container_arguments(fake_gpu):
    """A call given a list (which could hold a per-step input no one refreshes) is refused."""
    x = torch.ones(4)
    with pytest.raises(NotReplayable, match="keep took arguments of type list"):
        record(lambda: jit.module_for("fake", fake_gpu).keep(x, [x], 1.0))


def test_record_refuses_no_launches_and_nesting(fake_gpu):
    with pytest.raises(NotReplayable, match="no launches"):
        record(lambda: torch.empty(3))
    with pytest.raises(RuntimeError, match="do not nest"):
        record(lambda: record(lambda: None))
    assert launches.Schedule([]).calls == []


def test_pipeline_launches_argument_is_checked():
    from ftlab.models.pipeline import Pipeline

    with pytest.raises(TypeError, match="launches must be True or False, got 'yes'"):
        Pipeline.load("tiny-qwen3-moe", launches="yes")
    assert Pipeline.load("tiny-qwen3-moe", launches=False).decode_path == "eager"


def test_decode_launches_refuses_models_it_cannot_record():
    """On the CPU the reference ops compute with torch: refused, naming a torch operation; a
    dynamic model, a batch past max_batch: ValueError; the pipeline decodes op by op there."""
    from ftlab.models.decode_steps import DecodeLaunches
    from ftlab.models.pipeline import Pipeline
    from ftlab.models.qwen3_moe import Qwen3Moe

    pipe = Pipeline.load("tiny-qwen3-moe")
    assert pipe.decode_path == "eager"
    model = Qwen3Moe(pipe.config, pipe.weights, max_batch=2, max_seq_len=16, static=True)
    with pytest.raises(NotReplayable, match="torch aten"):
        DecodeLaunches(model, 1)
    with pytest.raises(ValueError, match="batch must be in"):
        DecodeLaunches(model, 3)
    with pytest.raises(ValueError, match="static=True"):
        DecodeLaunches(Qwen3Moe(pipe.config, pipe.weights, max_seq_len=16), 1)
    logits = model.forward(torch.tensor([[3]]), torch.tensor([[0]]))
    assert torch.isfinite(logits).all()  # a refused recording leaves the model usable


@pytest.mark.parametrize("batch", [1, 3])
def test_update_geometry_equals_geometry(batch):
    """KVCache.update_geometry rewrites a static decode geometry in place to what geometry() gives
    for the new positions, bit for bit, entry by entry (rope rows from its tables)."""
    from ftlab.models.kv_cache import KVCache

    cache = KVCache(2, 64, 4, 40, True, torch.device("cpu"), torch.bfloat16)
    geo = cache.geometry(torch.full((batch, 1), 39), 24, 10_000.0, torch.bfloat16)
    keys = [k for k, v in geo.items() if isinstance(v, torch.Tensor)]
    for trial in range(3):
        positions = torch.randint(0, 40, (batch, 1), generator=torch.Generator().manual_seed(trial))
        cache.update_geometry(geo, positions, keys)
        fresh = cache.geometry(positions, 24, 10_000.0, torch.bfloat16)
        for k in keys:
            assert geo[k].dtype == fresh[k].dtype and torch.equal(geo[k], fresh[k]), k
    with pytest.raises(ValueError, match="cannot rewrite"):
        cache.update_geometry(geo, positions, ["span"])
    past = torch.full((batch, 1), 45)  # past the cache: the last rope row, no failed gather
    cache.update_geometry(geo, past, keys)
    fresh = cache.geometry(torch.full((batch, 1), 39), 24, 10_000.0, torch.bfloat16)
    assert torch.equal(geo["cos"], fresh["cos"]) and torch.equal(geo["sin"], fresh["sin"])
    assert torch.equal(geo["write"], cache.geometry(past, 24, 10_000.0, torch.bfloat16)["write"])
    dynamic = KVCache(2, 64, 4, 40, False, torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ValueError, match="static cache"):
        dynamic.update_geometry(
            dynamic.geometry(positions, 24, 10_000.0, torch.bfloat16), positions, keys
        )


class _Counting:
    """A stand-in GPU module of the hip backend on CPU tensors: every function launches nothing and
    is counted (outputs stay whatever memory held)."""

    calls = 0

    def __getattr__(self, name):
        def launch(*args):
            _Counting.calls += 1

        return launch


def test_decode_launches_records_the_hip_layers_on_cpu(monkeypatch):
    """The hip backend's Python on CPU tensors with its launches stubbed: DecodeLaunches records
    every launch a step makes op by op in its window (the embedding, each layer's, the final
    norm's), refreshes the geometry and runs the schedule from C++ each step."""
    from ftlab import backends
    from ftlab.models.decode_steps import DecodeLaunches
    from ftlab.models.pipeline import Pipeline
    from ftlab.models.qwen3_moe import Qwen3Moe

    monkeypatch.setattr(jit, "_device_modules", {})
    monkeypatch.setattr(jit, "load_gpu", lambda name, plat=None: _Counting())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    serve = backends.Impl.cannot_serve
    monkeypatch.setattr(
        backends.Impl,
        "cannot_serve",
        lambda self, *a, **k: None if self.backend == "hip" else serve(self, *a, **k),
    )
    forget()  # no plan of another test's, none of this one's left behind (below)
    try:
        _record_the_hip_layers(Pipeline, Qwen3Moe, DecodeLaunches, backends)
    finally:
        monkeypatch.undo()
        forget()


def _record_the_hip_layers(Pipeline, Qwen3Moe, DecodeLaunches, backends) -> None:
    pipe = Pipeline.load("tiny-qwen3-moe", quant="q4_0")
    names = {op: "hip" for op in Qwen3Moe.OPS if "hip" in backends.backends_of(op)}
    model = Qwen3Moe(
        pipe.config,
        pipe.weights,
        max_batch=2,
        max_seq_len=32,
        static=True,
        backends={**names, "decode_attention": "hip"},
    )
    launched = DecodeLaunches(model, 2)
    _Counting.calls = 0
    model.forward(torch.zeros((2, 1), dtype=torch.long), torch.full((2, 1), 31))
    op_by_op = _Counting.calls
    _Counting.calls = 0
    logits = launched(torch.tensor([[3], [4]]), torch.tensor([[5], [9]]))
    assert launched.schedule.native is True and logits.shape == (2, 1, pipe.config.vocab_size)
    window = launched.schedule_length
    # the lm_head's launches ran through the ops
    assert _Counting.calls == op_by_op and window < op_by_op
    assert sorted(launched.inputs) == sorted(
        ["cos", "sin", "write", "mask", "positions", "lengths"]
    )
    assert torch.equal(launched.geo["write"], torch.tensor([5, 32 + 9]))
    assert torch.equal(launched.geo["lengths"], torch.tensor([6, 10], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"must be \(2, 1\) \(the recorded batch\)"):
        launched(torch.tensor([[3]]), torch.tensor([[5]]))


def _model_pair(dev: torch.device, batch: int):
    """Two static models over one set of random Q4_0 weights of head dim 128 (the shape hip's
    one-launch decode attention takes), each with its own KV cache, filled by one prefill."""
    from ftlab.bench.model import random_model
    from ftlab.models.qwen3_moe import Qwen3Moe, Qwen3MoeConfig

    config = Qwen3MoeConfig(
        vocab_size=512,
        hidden_size=256,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
    )
    weights = random_model(config, dev)
    gen = torch.Generator(device=dev).manual_seed(5)
    tokens = torch.randint(0, config.vocab_size, (batch, 60), device=dev, generator=gen)
    models = [
        Qwen3Moe(config, weights, max_batch=batch, max_seq_len=96, static=True) for _ in range(2)
    ]
    for m in models:
        m.forward(tokens[:, :20], torch.arange(20, device=dev)[None].expand(batch, -1))
    return config, models, tokens


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_launched_steps_equal_op_by_op_gpu(batch):
    """Decode steps launched from the recorded schedule give the logits and KV cache of the same
    steps launched op by op, bit for bit, at 40 positions (the schedule recorded at the last slot,
    the steps' positions differing across sequences); the logits are a new tensor each step."""
    from ftlab.models.decode_steps import DecodeLaunches

    dev = torch.device("cuda")
    config, (a, b), tokens = _model_pair(dev, batch)
    launched = DecodeLaunches(a, batch)
    assert launched.schedule.native is None  # built at the first launch
    last = torch.full((batch, 1), b.max_seq_len - 1, device=dev)
    b.forward(torch.zeros_like(last), last)  # the recording's step (its slot is never read below)
    per_layer = launched.schedule_length / config.num_hidden_layers
    assert 4 <= per_layer <= 12, launched.schedule_length
    offsets = torch.arange(batch, device=dev)[:, None]  # sequence s at position p + s
    previous = None
    for p in range(20, 60):
        tok, pos = tokens[:, p : p + 1], (p + offsets).clamp(max=94)
        got = launched(tok, pos)
        want = b.forward(tok, pos)
        assert torch.equal(got, want), (p, float((got - want).abs().max()))
        assert previous is None or got.data_ptr() != previous.data_ptr()
        previous = got
    assert launched.schedule.native is True  # run from C++
    # on a side stream kept busy: the step's copies and launches must all wait there (a launch on
    # another stream would read the previous step's inputs)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for p in range(60, 64):
            torch.cuda._sleep(5_000_000)
            tok, pos = tokens[:, p - 40 : p - 39], (p + offsets).clamp(max=94)
            got, want = launched(tok, pos).clone(), b.forward(tok, pos)
            assert torch.equal(got, want), p
    torch.cuda.current_stream(dev).wait_stream(side)
    hidden = launched.hidden.clone()
    launched.schedule.launch_each()  # the Python loop launches the same calls: the same step again
    assert torch.equal(launched.hidden, hidden)
    for ka, kb in zip(a.cache.k + a.cache.v, b.cache.k + b.cache.v, strict=True):
        assert torch.equal(ka, kb)


@pytest.mark.gpu
def test_pipeline_graphs_off_launches_its_steps_gpu(monkeypatch):
    """graphs=False on a GPU: the decode path is "launches", and the greedy tokens and logits equal
    those of the same pipeline's steps op by op (its recording refused by hand); a bf16 model of
    head dim 16 (SDPA's attention, a torch kernel) is refused and decodes op by op, saying why."""
    from ftlab.bench.model import random_model
    from ftlab.models.pipeline import Pipeline
    from ftlab.models.qwen3_moe import Qwen3MoeConfig

    dev = torch.device("cuda")
    tiny = Pipeline.load("tiny-qwen3-moe")
    config = Qwen3MoeConfig(
        vocab_size=tiny.config.vocab_size,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
    )
    weights = random_model(config, dev)
    runs = []
    for refuse in (False, True):
        pipe = Pipeline(config, weights, tiny.tokenizer, graphs=False, max_seq_len=64)
        assert pipe.decode_path == "launches" and pipe.model.static
        if refuse:
            pipe.launches_refused = "by the test"
            assert pipe.decode_path == "eager"
        logits = [pipe.prefill(tiny.tokenizer.encode("Every operator has a reference"))]
        for _ in range(12):
            logits.append(pipe.decode_step(int(logits[-1].argmax())))
        runs.append(torch.stack(logits))
        assert pipe.decode_path == (
            "eager" if refuse else "launches"
        ) and pipe.launches_refused in (None, "by the test")
    assert torch.equal(runs[0], runs[1])
    small = Pipeline.load("tiny-qwen3-moe", "cuda", dtype=torch.bfloat16, graphs=False)
    assert small.decode_path == "launches"  # planned: the first step's recording decides
    first = small.prefill([1, 2, 3])
    small.decode_step(int(first.argmax()))
    assert small.decode_path == "eager" and "torch" in small.launches_refused
    assert not small.model.static  # refused: op by op on the dynamic model (live positions only)
    off = Pipeline(config, weights, tiny.tokenizer, graphs=False, max_seq_len=64, launches=False)
    assert off.decode_path == "eager" and not off.model.static
    dynamic = [off.prefill(tiny.tokenizer.encode("Every operator has a reference"))]
    for logits in runs[0][:-1]:
        dynamic.append(off.decode_step(int(logits.argmax())))
    # the static and dynamic attention: last bits apart
    for a, b in zip(runs[0], dynamic, strict=True):
        assert float((a - b).abs().max()) <= 1e-2 * float(a.abs().max())

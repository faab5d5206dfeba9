"""index / store: every available backend against the reference, bit-exact (docs/OPS.md section 1).

On a CPU machine the backends are the reference and Triton (interpreter); on a GPU the
``gpu`` tests run Triton and HIP, including launches on a side stream and replays of a
captured graph with new inputs.
"""

import pytest
import torch
from hypothesis import given

import ftlab.testing as ft
from ftlab import backends, ops

GPU_BACKENDS = ["triton", "hip"]
ALL_COPY_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn)


def cpu_backends(op):
    return backends.available_backends(op, torch.device("cpu"), torch.float32)


# ------------------------------------------------------------------ CPU (interpreter)


@given(ft.index_cases())
def test_index_cpu(case):
    assert "triton" in cpu_backends("index") or torch.cuda.is_available()
    ft.check_index_case(case, "cpu")


@given(ft.store_cases())
def test_store_cpu(case):
    ft.check_store_case(case, "cpu")


def test_index_semantics_by_example():
    w = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    idx = torch.tensor([5, 0, 5], dtype=torch.int32)
    for name in cpu_backends("index"):
        assert ops.index(w, idx, backend=name).tolist() == [[10, 11], [0, 1], [10, 11]]
        # shard [2, 6): positions 3, -2, 3 -> rows 3, zero, 3
        got = ops.index(w, idx, mask=(2, 4), backend=name).tolist()
        assert got == [[6, 7], [0, 0], [6, 7]], name


def test_store_semantics_by_example():
    for name in cpu_backends("store"):
        kc, vc = torch.zeros(4, 2), torch.zeros(4, 3)
        k, v = torch.ones(3, 2), torch.full((3, 3), 2.0)
        ops.store(kc, vc, torch.tensor([2, -1, 0]), k, v, backend=name)
        assert kc.sum(1).tolist() == [2, 0, 2, 0] and vc.sum(1).tolist() == [6, 0, 6, 0], name


@pytest.mark.parametrize("dtype", ALL_COPY_DTYPES)
def test_every_copy_dtype_cpu(dtype):
    case = ft.IndexCase(
        ft.random_rows(torch.Generator().manual_seed(1), 40, 33, 3, dtype),
        torch.tensor([39, 0, 7, 7]),
        None,
        2,
    )
    ft.check_index_case(case, "cpu")


# ------------------------------------------------------------------ bad input


def _store_args(dtype=torch.float16):
    return (
        torch.zeros(8, 4, dtype=dtype),
        torch.zeros(8, 4, dtype=dtype),
        torch.tensor([1, 3]),
        torch.ones(2, 4, dtype=dtype),
        torch.ones(2, 4, dtype=dtype),
    )


BAD_INDEX = [
    (
        "float indices",
        lambda w: (w, torch.tensor([0.0, 1.0])),
        {},
        TypeError,
        "indices must be int32 or int64",
    ),
    (
        "2-D indices",
        lambda w: (w, torch.zeros(2, 2, dtype=torch.int64)),
        {},
        ValueError,
        "indices must be 1-D",
    ),
    ("out of range", lambda w: (w, torch.tensor([0, 8])), {}, IndexError, r"indices\[1\] = 8"),
    ("negative", lambda w: (w, torch.tensor([-1])), {}, IndexError, r"indices\[0\] = -1"),
    ("1-D weights", lambda w: (w[0], torch.tensor([0])), {}, ValueError, "weights must be 2-D"),
    (
        "int weights",
        lambda w: (w.to(torch.int32), torch.tensor([0])),
        {},
        TypeError,
        "weights must be one of",
    ),
    ("column view", lambda w: (w.t(), torch.tensor([0])), {}, ValueError, "contiguous rows"),
    (
        "wrong out shape",
        lambda w: (w, torch.tensor([0])),
        {"out": torch.zeros(2, 4, dtype=torch.float16)},
        ValueError,
        "out must have shape",
    ),
    (
        "wrong out dtype",
        lambda w: (w, torch.tensor([0])),
        {"out": torch.zeros(1, 4)},
        TypeError,
        "out must have the dtype of weights",
    ),
    (
        "mask too long",
        lambda w: (w, torch.tensor([0])),
        {"mask": (0, 9)},
        ValueError,
        "mask length",
    ),
    (
        "mask not ints",
        lambda w: (w, torch.tensor([0])),
        {"mask": (0.5, 2)},
        TypeError,
        "mask must be a pair",
    ),
    ("not a tensor", lambda w: (w, [0, 1]), {}, TypeError, "indices must be a torch.Tensor"),
]


@pytest.mark.parametrize("backend", ["reference", "triton", "hip"])
@pytest.mark.parametrize("label, args, kwargs, exc, msg", BAD_INDEX, ids=[b[0] for b in BAD_INDEX])
def test_index_bad_input(backend, label, args, kwargs, exc, msg):
    w = torch.zeros(8, 4, dtype=torch.float16)
    with pytest.raises(exc, match=msg):
        ops.index(*args(w), backend=backend, **kwargs)


def _bad_store():
    def swap(i, value):
        def make():
            a = list(_store_args())
            a[i] = value(a)
            return a

        return make

    return [
        ("duplicate", swap(2, lambda a: torch.tensor([3, 3])), ValueError, "slot 3 more than once"),
        ("out of range", swap(2, lambda a: torch.tensor([1, 8])), IndexError, r"indices\[1\] = 8"),
        ("below -1", swap(2, lambda a: torch.tensor([-2, 1])), IndexError, r"indices\[0\] = -2"),
        ("float indices", swap(2, lambda a: torch.tensor([1.0, 2.0])), TypeError, "int32 or int64"),
        (
            "k dtype",
            swap(3, lambda a: torch.ones(2, 4)),
            TypeError,
            "k must have the dtype of k_cache",
        ),
        (
            "v_cache dtype",
            swap(1, lambda a: torch.zeros(8, 4, dtype=torch.bfloat16)),
            TypeError,
            "v_cache must have",
        ),
        (
            "k shape",
            swap(3, lambda a: torch.ones(3, 4, dtype=torch.float16)),
            ValueError,
            "k must have shape",
        ),
        (
            "v row size",
            swap(4, lambda a: torch.ones(2, 5, dtype=torch.float16)),
            ValueError,
            "v must have shape",
        ),
        (
            "slot counts",
            swap(1, lambda a: torch.zeros(7, 4, dtype=torch.float16)),
            ValueError,
            "as many slots",
        ),
        (
            "int cache",
            lambda: [t.to(torch.int16) if t.is_floating_point() else t for t in _store_args()],
            TypeError,
            "k_cache must be one of",
        ),
    ]


BAD_STORE = _bad_store()


@pytest.mark.parametrize("backend", ["reference", "triton", "hip"])
@pytest.mark.parametrize("label, make, exc, msg", BAD_STORE, ids=[b[0] for b in BAD_STORE])
def test_store_bad_input_writes_nothing(backend, label, make, exc, msg):
    args = make()
    before = [a.clone() for a in args[:2]]
    with pytest.raises(exc, match=msg):
        ops.store(*args, backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(args[:2], before, strict=True)), (
        "a failed store wrote to a cache"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["reference", "triton", "hip"])
def test_wrong_device_is_named(backend):
    w = torch.zeros(8, 4, device="cuda")
    with pytest.raises(ValueError, match="indices must be on the device of weights"):
        ops.index(w, torch.tensor([0]), backend=backend)
    kc = torch.zeros(8, 4, device="cuda")
    with pytest.raises(ValueError, match="k must be on the device of k_cache"):
        ops.store(
            kc,
            kc.clone(),
            torch.tensor([0], device="cuda"),
            torch.zeros(1, 4),
            torch.zeros(1, 4, device="cuda"),
            backend=backend,
        )


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@given(ft.index_cases(dtypes=ALL_COPY_DTYPES))
def test_index_gpu(case):
    ft.check_index_case(case, "cuda", backends=["reference", *GPU_BACKENDS])


@pytest.mark.gpu
@given(ft.store_cases(dtypes=ALL_COPY_DTYPES))
def test_store_gpu(case):
    ft.check_store_case(case, "cuda", backends=["reference", *GPU_BACKENDS])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_large_scatter_gpu(backend):
    """The benchmark's shape: 65536 rows x 1024 bf16 into a 1M-row cache at unique slots."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    slots = torch.randperm(1 << 20, device="cuda", generator=gen)[: 1 << 16]
    kc = torch.zeros(1 << 20, 1024, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    k = torch.randn(1 << 16, 1024, dtype=torch.bfloat16, device="cuda", generator=gen)
    v = torch.randn(1 << 16, 1024, dtype=torch.bfloat16, device="cuda", generator=gen)
    ops.store(kc, vc, slots, k, v, backend=backend)
    assert torch.equal(kc[slots], k) and torch.equal(vc[slots], v)
    assert int((kc.abs().sum(1) != 0).sum()) == (1 << 16)
    got = ops.index(kc, slots, backend=backend)
    assert torch.equal(got, k)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_side_stream_gpu(backend):
    """Kernels launch on torch's current stream: work queued behind a long side-stream
    kernel must see that kernel's result."""
    side = torch.cuda.Stream()
    w = torch.zeros(4096, 512, device="cuda")
    idx = torch.randint(0, 4096, (2048,), device="cuda")
    kc, vc = torch.zeros(8192, 512, device="cuda"), torch.zeros(8192, 512, device="cuda")
    slots = torch.randperm(8192, device="cuda")[:2048]
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        big = torch.randn(4096, 4096, device="cuda")
        for _ in range(8):  # keep the side stream busy so a wrong-stream launch would race
            big = big @ big / 64
        w.copy_(torch.randn(4096, 512, device="cuda") + big[:, :512].sum() * 0)
        out = ops.index(w, idx, check=False, backend=backend)
        k = out * 2
        ops.store(kc, vc, slots, k, out, check=False, backend=backend)
    side.synchronize()
    assert torch.equal(out, w[idx])
    assert torch.equal(kc[slots], w[idx] * 2) and torch.equal(vc[slots], w[idx])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_graph_capture_replay_gpu(backend):
    """Captured once, replayed with new indices and rows each time: every replay must
    match the reference on the new inputs."""
    n, d, length, slots = 1000, 96, 37, 3000
    w = torch.randn(n, d + 8, device="cuda", dtype=torch.bfloat16)[:, :d]
    idx = torch.zeros(length, dtype=torch.int32, device="cuda")
    kc = torch.zeros(slots, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros(slots, d, device="cuda", dtype=torch.bfloat16)
    slot_ids = torch.zeros(length, dtype=torch.int64, device="cuda")
    out = torch.empty(length, d, device="cuda", dtype=torch.bfloat16)
    # warm up (build, autotune) outside capture, on a side stream as torch recommends
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.index(w, idx, out=out, check=False, backend=backend)
        ops.store(kc, vc, slot_ids, out, out, check=False, backend=backend)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.index(w, idx, out=out, check=False, backend=backend)
        ops.store(kc, vc, slot_ids, out, out, check=False, backend=backend)
    for step in range(20):
        g = torch.Generator(device="cuda").manual_seed(step)
        idx.copy_(torch.randint(0, n, (length,), device="cuda", generator=g, dtype=torch.int32))
        new_slots = torch.randperm(slots, device="cuda", generator=g)[:length]
        new_slots[::5] = -1
        slot_ids.copy_(new_slots)
        w.copy_(torch.randn(n, d, device="cuda", generator=g).to(torch.bfloat16))
        kc.zero_()
        vc.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, w[idx.long()]), f"index replay {step}"
        ref_k = torch.zeros_like(kc)
        keep = new_slots >= 0
        ref_k[new_slots[keep]] = w[idx.long()][keep]
        assert torch.equal(kc, ref_k) and torch.equal(vc, ref_k), f"store replay {step}"


@pytest.mark.gpu
def test_checks_refuse_inside_capture():
    w = torch.randn(10, 8, device="cuda")
    idx = torch.zeros(3, dtype=torch.int64, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="check=False"):
        with torch.cuda.graph(graph):
            ops.index(w, idx, backend="triton")

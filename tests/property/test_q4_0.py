"""GGUF Q4_0: every available backend against the reference (docs/OPS.md section 2).

Quantizers byte-exact (and the reference byte-exact with gguf-py), dequantize bit-exact,
q4_0_matmul within ftlab.testing.matmul_tolerance. CPU: reference + Triton interpreter;
GPU (``gpu``): Triton and HIP, graph capture included.
"""

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ftlab.testing as ft
from ftlab import backends, ops
from ftlab import platform as ftplatform
from ftlab.quant import Q8_1, Q4_0Weight
from ftlab.reference import q4_0 as ref

gguf = pytest.importorskip("gguf")
GPU = ["triton", "hip"]


def gguf_bytes(w: torch.Tensor) -> np.ndarray:
    return gguf.quants.quantize(w.float().numpy(), gguf.GGMLQuantizationType.Q4_0)


# ------------------------------------------------------------------ reference == gguf-py


@given(ft.q4_0_weight_values())
def test_reference_quantize_matches_gguf(w):
    assert np.array_equal(ref.quantize_q4_0(w).data.numpy(), gguf_bytes(w))


@pytest.mark.parametrize(
    "block",
    [
        torch.zeros(32),
        -torch.zeros(32),
        torch.full((32,), 7.25),
        torch.full((32,), -1e-30),
        torch.tensor([3.0, -3.0] + [1.0] * 30),  # tie: the first (+3) wins
        torch.tensor([-3.0, 3.0] + [1.0] * 30),
        torch.linspace(-1e6, 1e6, 32),  # d overflows fp16 to inf
        torch.linspace(-1e-6, 2e-6, 32),  # subnormal fp16 scale
        torch.arange(32.0) - 16,
    ],
    ids=["zero", "neg-zero", "constant", "tiny-const", "tie+", "tie-", "huge", "tiny", "ramp"],
)
def test_reference_quantize_edge_blocks(block):
    w = block.view(1, 32)
    assert np.array_equal(ref.quantize_q4_0(w).data.numpy(), gguf_bytes(w))


@given(st.integers(0, 2**31 - 1))
def test_reference_dequantize_matches_gguf(seed):
    w = ref.quantize_q4_0(torch.randn(5, 96, generator=torch.Generator().manual_seed(seed)))
    ours = ref.dequantize_q4_0(w, torch.float32).numpy()
    theirs = gguf.quants.dequantize(w.data.numpy(), gguf.GGMLQuantizationType.Q4_0)
    assert np.array_equal(ours, theirs)


def test_int8_identity():
    """d4 * (d8 * sum(q4 * q8) - 8 * s8) equals the dot of the dequantized vectors."""
    g = torch.Generator().manual_seed(0)
    w = ref.quantize_q4_0(torch.randn(3, 64, generator=g))
    x8 = ref.quantize_q8_1(torch.randn(2, 64, generator=g))
    via_int = ref.q4_0_block_dots(x8, w).sum(-1).double()
    via_float = x8.dequantize().double() @ ref.dequantize_q4_0(w, torch.float32).double().T
    torch.testing.assert_close(via_int, via_float, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ every backend, CPU


@given(ft.q4_0_weight_values())
def test_quantize_cpu(w):
    ft.check_quantize_case(w, "cpu")


@given(ft.q4_0_weight_values(), st.sampled_from(ft.FLOAT_DTYPES))
def test_dequantize_cpu(w, dtype):
    ft.check_dequantize_case(ref.quantize_q4_0(w), dtype, "cpu")


@given(ft.q8_1_inputs())
def test_q8_1_cpu(x):
    ft.check_q8_1_case(x, "cpu")


@settings(max_examples=15)
@given(ft.matmul_cases())
def test_matmul_cpu(case):
    ft.check_matmul_case(case, "cpu")


def test_expert_bank_quantizes_per_expert():
    bank = torch.randn(3, 8, 64)
    q = ops.quantize_q4_0(bank)
    assert q.shape == (3, 8, 64) and q[1].shape == (8, 64)
    assert torch.equal(q[1].data, ops.quantize_q4_0(bank[1]).data)


# ------------------------------------------------------------------ bad input


BAD = [
    (
        "quantize int",
        lambda: ops.quantize_q4_0(torch.zeros(2, 32, dtype=torch.int32)),
        TypeError,
        "w must be one of",
    ),
    ("quantize K", lambda: ops.quantize_q4_0(torch.zeros(2, 33)), ValueError, "multiple of 32"),
    ("quantize 1-D", lambda: ops.quantize_q4_0(torch.zeros(64)), ValueError, r"\[\.\.\., N, K\]"),
    (
        "dequant not Q4",
        lambda: ops.dequantize_q4_0(torch.zeros(2, 18, dtype=torch.uint8)),
        TypeError,
        "Q4_0Weight",
    ),
    (
        "dequant dtype",
        lambda: ops.dequantize_q4_0(ref.quantize_q4_0(torch.zeros(1, 32)), torch.int8),
        TypeError,
        "dtype must be",
    ),
    ("q8 K", lambda: ops.quantize_q8_1(torch.zeros(2, 48)), ValueError, "multiple of 32"),
    (
        "matmul K",
        lambda: ops.q4_0_matmul(torch.zeros(2, 64), ref.quantize_q4_0(torch.zeros(3, 32))),
        ValueError,
        "K = 32 columns",
    ),
    (
        "matmul bank",
        lambda: ops.q4_0_matmul(torch.zeros(2, 32), ref.quantize_q4_0(torch.zeros(2, 3, 32))),
        ValueError,
        "2-D Q4_0Weight",
    ),
    (
        "matmul path",
        lambda: ops.q4_0_matmul(
            torch.zeros(2, 32), ref.quantize_q4_0(torch.zeros(3, 32)), path="int4"
        ),
        ValueError,
        "path must be",
    ),
    (
        "matmul x dtype",
        lambda: ops.q4_0_matmul(
            torch.zeros(2, 32, dtype=torch.int8), ref.quantize_q4_0(torch.zeros(3, 32))
        ),
        TypeError,
        "x must be one of",
    ),
    (
        "weight bytes",
        lambda: Q4_0Weight(torch.zeros(2, 17, dtype=torch.uint8), (2, 32)),
        ValueError,
        r"\(2, 18\)",
    ),
    (
        "weight K",
        lambda: Q4_0Weight(torch.zeros(2, 18, dtype=torch.uint8), (2, 31)),
        ValueError,
        "multiple of 32",
    ),
]


@pytest.mark.parametrize("label, call, exc, msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input(label, call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_hip_has_no_dequant_path():
    hip = backends.spec("q4_0_matmul").impls["hip"]
    gpu = torch.device("cuda")
    with pytest.raises(backends.BackendUnavailable, match="int8 path"):
        backends.resolve(
            "q4_0_matmul",
            "hip",
            gpu,
            torch.bfloat16,
            ftplatform.platform_from_arch("sm_90"),
            path="dequant",
        )
    assert hip.caps.path_for(512, "auto") == "int8"
    triton = backends.spec("q4_0_matmul").impls["triton"].caps
    assert triton.path_for(512, "auto") == "dequant"
    assert triton.path_for(backends.DECODE_MAX_TOKENS, "auto") == "int8"
    assert triton.path_for(backends.DECODE_MAX_TOKENS + 1, "auto") == "dequant"
    with pytest.raises(ValueError, match="path must be 'auto' or one of"):
        ops.q4_0_matmul(torch.zeros(1, 32), ops.quantize_q4_0(torch.zeros(4, 32)), path="fp8")


def test_auto_with_an_explicit_path_takes_the_first_that_implements_it():
    """backend="auto", path="dequant" on a GPU whose HIP backend serves: HIP lacks the dequant
    path, so Triton takes the call (the resolver folds the path into the choice)."""
    sm90 = ftplatform.platform_from_arch("sm_90")
    gpu = torch.device("cuda")
    hip = backends.spec("q4_0_matmul").impls["hip"]
    real = hip.caps
    hip.caps = dataclasses.replace(real, available=None)
    try:
        assert backends.resolve("q4_0_matmul", "auto", gpu, torch.bfloat16, sm90).backend == "hip"
        chosen = backends.resolve(
            "q4_0_matmul", "auto", gpu, torch.bfloat16, sm90, path="dequant"
        ).backend
        assert chosen == (
            "triton"
            if backends.spec("q4_0_matmul")
            .impls["triton"]
            .cannot_serve(sm90, "cuda", torch.bfloat16)
            is None
            else "reference"
        )
    finally:
        hip.caps = real


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@given(ft.q4_0_weight_values(max_rows=200, max_k=1024))
def test_quantize_gpu(w):
    ft.check_quantize_case(w, "cuda", backends=["reference", *GPU])


@pytest.mark.gpu
@given(ft.q4_0_weight_values(max_rows=200, max_k=1024), st.sampled_from(ft.FLOAT_DTYPES))
def test_dequantize_gpu(w, dtype):
    ft.check_dequantize_case(ref.quantize_q4_0(w), dtype, "cuda", backends=["reference", *GPU])


@pytest.mark.gpu
@given(ft.q8_1_inputs(max_rows=300, max_k=2048))
def test_q8_1_gpu(x):
    ft.check_q8_1_case(x, "cuda", backends=["reference", *GPU])


@pytest.mark.gpu
@settings(max_examples=40)
@given(ft.matmul_cases(max_n=700, max_k=1536))
def test_matmul_gpu(case):
    ft.check_matmul_case(case, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU)
@pytest.mark.parametrize("m", [1, 4, 64])
def test_matmul_graph_replay_gpu(backend, m):
    """A captured q4_0_matmul replayed with new activations matches the eager result."""
    g = torch.Generator(device="cuda").manual_seed(m)
    w = ops.quantize_q4_0(torch.randn(384, 512, device="cuda", generator=g))
    x = torch.randn(m, 512, device="cuda", generator=g, dtype=torch.float16)
    path = "int8"
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.q4_0_matmul(x, w, path=path, backend=backend)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.q4_0_matmul(x, w, path=path, backend=backend)
    for _ in range(5):
        x.copy_(torch.randn(m, 512, device="cuda", generator=g, dtype=torch.float16))
        graph.replay()
        torch.cuda.synchronize()
        eager = ops.q4_0_matmul(x, w, path=path, backend=backend)
        assert torch.equal(y, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [256, 768, 2048, 4096, 14336])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_decode_shapes_gpu(m, k):
    """Decode-size matmuls over the K of the model (the HIP one-launch matvec where M x K fits
    its LDS, the two-launch one where not), row counts that leave partial row sets."""
    gen = torch.Generator().manual_seed(m * k)
    for n, dtype in ((1, torch.float32), (37, torch.float16), (4103, torch.bfloat16)):
        x = (torch.randn(m, k + 32, generator=gen) * 3).to(dtype)[:, :k]
        case = ft.MatmulCase(x, torch.randn(n, k, generator=gen) * 0.02, "int8")
        ft.check_matmul_case(case, "cuda", backends=GPU)


@pytest.mark.gpu
def test_llama_shape_gpu():
    """The 4096 x 14336 shape of the benchmark, M = 1 and 512, against the reference."""
    g = torch.Generator(device="cuda").manual_seed(0)
    w = ops.quantize_q4_0(torch.randn(4096, 14336, device="cuda", generator=g) * 0.02)
    for m in (1, 512):
        case = ft.MatmulCase(
            torch.randn(m, 14336, generator=torch.Generator().manual_seed(m)).half(),
            ref.dequantize_q4_0(w.to("cpu"), torch.float32),
            "int8",
        )
        ft.check_matmul_case(case, "cuda", backends=["hip", "triton"])


@pytest.mark.gpu
@pytest.mark.parametrize("k", [8192, 8256, 9216, 14336, 18432])
def test_long_rows_gpu(k):
    """hip's matvecs on long rows (K of 256 to 576 blocks): the fused one given x's Q8_1 where
    M x K fits its LDS (8192 up to M = 4, 9216 up to M = 2, 14336 and 18432 at M = 1), the
    two-launch one elsewhere (M = 5, K = 8256; 64-block chunk counts even and odd, a partial last
    chunk at 8256): within the bound of the reference, row counts that leave partial row sets; the
    same bits on a second call and replayed from a graph."""
    if "hip" not in backends.available_backends(
        "q4_0_matmul", torch.device("cuda"), torch.bfloat16
    ):
        pytest.skip("hip cannot serve q4_0_matmul on this GPU")
    gen = torch.Generator().manual_seed(k)
    for m, n in ((1, 4103), (2, 37), (4, 1000), (5, 64), (1, 1)):
        x = (torch.randn(m, k, generator=gen) * 3).bfloat16()
        w = torch.randn(n, k, generator=gen) * 0.02
        ft.check_matmul_case(ft.MatmulCase(x, w, "int8"), "cuda", backends=["hip"])
        wq = ops.quantize_q4_0(w.cuda())
        xc = x.cuda()
        first = ops.q4_0_matmul(xc, wq, path="int8", backend="hip")
        assert torch.equal(first, ops.q4_0_matmul(xc, wq, path="int8", backend="hip"))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.q4_0_matmul(xc, wq, path="int8", backend="hip")
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, first)


@pytest.mark.parametrize("blocks_per_step", [2, 4])
def test_dequant_gemm_multi_block_steps_cpu(blocks_per_step, monkeypatch):
    """The GEMM's K step of several Q4_0 blocks (a tuning knob), tails included."""
    from ftlab.triton import q4_0 as triton_q4_0

    monkeypatch.setitem(
        triton_q4_0.CONFIGS["default"],
        "gemm",
        {**triton_q4_0.CONFIGS["default"]["gemm"], "BLOCK_KB": blocks_per_step},
    )
    g = torch.Generator().manual_seed(blocks_per_step)
    for k in (32, 96, 160):
        case = ft.MatmulCase(
            torch.randn(40, k, generator=g).half(), torch.randn(70, k, generator=g), "dequant"
        )
        ft.check_matmul_case(case, "cpu", backends=["triton"])


def test_x_q8_bad_arguments_name_themselves():
    w = ops.quantize_q4_0(torch.randn(8, 64))
    x = torch.randn(2, 64)
    x8 = ops.quantize_q8_1(x)
    with pytest.raises(TypeError, match="x_q8 must be a ftlab.quant.Q8_1, got tuple"):
        ops.q4_0_matmul(x, w, x_q8=(x8.q, x8.d, x8.s))
    with pytest.raises(ValueError, match=r"x_q8.q must have shape \(2, 64\), got \(1, 64\)"):
        ops.q4_0_matmul(x, w, x_q8=ops.quantize_q8_1(x[:1]))
    with pytest.raises(TypeError, match="x_q8.d must be float32, got torch.float16"):
        ops.q4_0_matmul(x, w, x_q8=Q8_1(x8.q, x8.d.half(), x8.s))
    with pytest.raises(ValueError, match="x_q8.s must be contiguous"):
        ops.q4_0_matmul(x, w, x_q8=Q8_1(x8.q, x8.d, torch.randn(2, 4)[:, ::2]))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU)
def test_x_q8_misaligned_and_captured_gpu(backend):
    """x's Q8_1 given: q at an odd byte offset and scales 4 bytes past an aligned base (hip copies
    them to aligned memory), at the fused matvec's M = 1 and the two-launch one's M = 6, and a
    graph-captured call replayed over new activations."""
    g = torch.Generator(device="cuda").manual_seed(5)
    w = ops.quantize_q4_0(torch.randn(300, 2048, device="cuda", generator=g) * 0.02)
    x = torch.randn(1, 2048, device="cuda", generator=g).bfloat16()
    for rows in (1, 6):
        xr = x.expand(rows, -1).contiguous()
        want = ops.q4_0_matmul(xr, w, backend=backend)
        x8 = ops.quantize_q8_1(xr)
        # odd address
        q = torch.empty(rows * 2048 + 1, dtype=torch.int8, device="cuda")[1:].view(rows, 2048)
        q.copy_(x8.q)
        d, s = torch.empty(rows, 65, device="cuda"), torch.empty(rows, 65, device="cuda")
        d[:, 1:], s[:, 1:] = x8.d, x8.s
        if rows == 1:  # contiguous views 4 bytes past an aligned base
            odd = Q8_1(q, d[:, 1:], s[:, 1:])
        else:
            odd = Q8_1(q, x8.d, x8.s)
        assert torch.equal(ops.q4_0_matmul(xr, w, backend=backend, x_q8=odd), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h8 = ops.quantize_q8_1(x)
        y = ops.q4_0_matmul(x, w, backend=backend, x_q8=h8)
    for _ in range(3):
        x.copy_(torch.randn(1, 2048, device="cuda", generator=g))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, ops.q4_0_matmul(x, w, backend=backend))


@pytest.mark.gpu
def test_dependent_launch_chain_gpu():
    """A decode-like chain of hip kernels that launch dependent on the one before (norm, matvec,
    norm, matvec: on sm_90 each may start while the one before runs, reading only weights until
    its grid-dependency wait): eagerly, replayed from a graph over new inputs, and with the host
    waiting after every kernel (no overlap), the same bits."""
    g = torch.Generator(device="cuda").manual_seed(11)
    w1 = ops.quantize_q4_0(torch.randn(5120, 2048, device="cuda", generator=g) * 0.02)
    w2 = ops.quantize_q4_0(torch.randn(2048, 4096, device="cuda", generator=g) * 0.02)
    nw = torch.rand(2048, device="cuda", generator=g).bfloat16() + 0.5
    x = torch.randn(1, 2048, device="cuda", generator=g).bfloat16()
    r = torch.randn(1, 2048, device="cuda", generator=g).bfloat16()

    def chain(sync: bool):
        outs = []
        h, s = ops.add_rmsnorm(x, r, nw, 1e-6, backend="hip")
        outs.append(h)
        for step in (
            lambda: ops.q4_0_matmul(h, w1, backend="hip")[:, :4096],
            lambda: ops.q4_0_matmul(outs[-1].contiguous(), w2, backend="hip"),
            lambda: ops.add_rmsnorm(outs[-1], s, nw, 1e-6, backend="hip")[0],
        ):
            if sync:
                torch.cuda.synchronize()
            outs.append(step())
        return outs

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(False)
    for _ in range(10):
        x.copy_(torch.randn(1, 2048, device="cuda", generator=g))
        r.copy_(torch.randn(1, 2048, device="cuda", generator=g))
        graph.replay()
        eager = chain(False)
        serial = chain(True)
        torch.cuda.synchronize()
        for a, b, c in zip(captured, eager, serial, strict=True):
            assert torch.equal(a, c) and torch.equal(b, c)

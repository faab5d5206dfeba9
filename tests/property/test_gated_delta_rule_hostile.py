"""The gated delta rule under hostile log decays (docs/OPS.md section 9, the docstring of
ftlab/reference/gated_delta_rule.py), one test per decay (ftlab.testing.HOSTILE_DECAYS): a NaN (or
+inf) g reaches its own token and the later ones only, the earlier ones the same bits; a g of -inf
or
-1e30 is a full forget, within the derived bound, with nothing before it weighing in. Every
prefill form through ftlab.testing.check_hostile_decays: the reference (chunked, every chunk
size, and the recurrence), Triton's general and chunk-64 kernels in the interpreter (both
precisions), the decode step token by token; on a GPU, Triton and both HIP variants. HIP's
kernels on the CPU: tests/unit/test_gated_delta_rule_chunk_host.py,
tests/unit/test_gated_delta_rule_hip_host.py."""

import pytest
import torch

import ftlab.testing as ft
from ftlab import backends, ops
from ftlab.reference import gated_delta_rule as ref

# NaN and inf through numpy in Triton's interpreter: what these tests are about
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
hostile = pytest.mark.parametrize("hostile", ft.HOSTILE_DECAYS)


def _inputs(seed, t, dk=32, dv=16, hk=1, hv=3, dtype=torch.float32, b=2):
    """q, k, v, g (<= 0), beta and an initial state, as the models make them."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    k = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    v = torch.randn(b, t, hv, dv, generator=gen).to(dtype)
    g = -torch.nn.functional.softplus(torch.randn(b, t, hv, generator=gen))
    beta = torch.sigmoid(torch.randn(b, t, hv, generator=gen))
    return q, k, v, g, beta, torch.randn(b, hv, dk, dv, generator=gen) * 0.5


def _op(backend, chunk, precision="fp32", device="cpu"):
    """``ops.gated_delta_rule`` as check_hostile_decays runs it (inputs moved to ``device``)."""

    def run(q, k, v, g, beta, state):
        *args, state = (x.to(device) for x in (q, k, v, g, beta, state))
        o, s = ops.gated_delta_rule(
            *args, state=state, chunk_size=chunk, precision=precision, backend=backend
        )
        return o.cpu(), s.cpu()

    return run


def _interpreted():
    if "triton" not in backends.available_backends(
        "gated_delta_rule", torch.device("cpu"), torch.float32
    ):
        pytest.skip("Triton's interpreter is off in this process")


@hostile
@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_chunks(hostile, chunk, dtype):
    """The spec's chunked form: three chunks of 64 (so the +inf at token 86 sits in a chunk's
    second 16-row block), nine of 16."""
    case = _inputs(chunk, 130, dtype=dtype)
    ft.check_hostile_decays(
        _op("reference", chunk), case, hostile, chunk_size=chunk, name=f"reference, chunk {chunk}"
    )


@hostile
def test_reference_recurrence(hostile):
    """The recurrence the chunks are held to (chunk size 1 in the bound)."""

    def run(q, k, v, g, beta, state):
        return ref.gated_delta_rule_recurrent(q, k, v, g, beta, state, 32**-0.5, True)

    ft.check_hostile_decays(run, _inputs(1, 40), hostile, chunk_size=1, name="recurrence")


def _steps(backend, device="cpu"):
    """The prefill as ``ops.gated_delta_step`` token after token, the state carried in place."""

    def run(q, k, v, g, beta, state):
        s = state.to(device).clone()
        outs = [
            ops.gated_delta_step(
                *(x[:, i].to(device) for x in (q, k, v, g, beta)), s, backend=backend
            )
            for i in range(q.shape[1])
        ]
        return torch.stack(outs, 1).cpu(), s.cpu()

    return run


@hostile
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_decode_steps(hostile, backend):
    if backend == "triton":
        _interpreted()
    case = _inputs(2, 9, dv=32, hv=2, b=1)
    ft.check_hostile_decays(_steps(backend), case, hostile, chunk_size=1, name=f"{backend} steps")


@pytest.mark.parametrize(
    "chunk, dtype, precision",
    [
        (16, torch.float32, "fp32"),  # the general kernels
        (32, torch.bfloat16, "fp32"),
        (64, torch.float32, "fp32"),  # the chunk-64 kernels
        (64, torch.bfloat16, "bf16"),  # their bf16 operands
    ],
)
@hostile
def test_triton_interpreted(hostile, chunk, dtype, precision):
    """One sequence, two heads (the interpreter's time goes by programs): the NaN in the first
    16-row block, the +inf in the third, so that the inverse's blocks below meet both."""
    _interpreted()
    case = _inputs(chunk + 1, 70 if chunk == 64 else 40, hv=2, dtype=dtype, b=1)
    ft.check_hostile_decays(
        _op("triton", chunk, precision),
        case,
        hostile,
        chunk_size=chunk,
        operands="bf16" if precision == "bf16" else "fp32",
        name=f"triton, chunk {chunk}, {precision}",
    )


@hostile
def test_triton_general_kernels_at_chunk_64(hostile):
    """The general kernels in chunks of 64, as RDNA runs them (the op takes the chunk-64 kernels
    here)."""
    _interpreted()
    from ftlab.triton import gated_delta_rule_chunk

    def run(q, k, v, g, beta, state):
        return gated_delta_rule_chunk.gated_delta_rule(q, k, v, g, beta, state, 32**-0.5, True, 64)

    ft.check_hostile_decays(
        run, _inputs(3, 70, hv=2, b=1), hostile, chunk_size=64, name="triton general, chunk 64"
    )


def test_the_bound_holds_the_forget_to_its_value():
    """The bound with a full forget (|g| floored in its cumulative-sum term) is still tight enough
    to fail the forget ignored (-inf read as 0) or the state let through at e^-5."""
    q, k, v, g, beta, state = _inputs(4, 100)
    g[:, 50] = float("-inf")
    exact_o, _ = ft.gated_delta_exact(q, k, v, g, beta, state)
    o_bound, _ = ft.gated_delta_tolerance(q, k, v, g, beta, state, chunk_size=64)
    right, _ = ops.gated_delta_rule(q, k, v, g, beta, state=state, backend="reference")
    assert bool(((right.double() - exact_o).abs() <= o_bound).all())
    for what, value in (("forget ignored", 0.0), ("e^-5 let through", -5.0)):
        wrong_g = g.clone()
        wrong_g[:, 50] = value
        o, _ = ops.gated_delta_rule(q, k, v, wrong_g, beta, state=state, backend="reference")
        assert not bool(((o.double() - exact_o).abs() <= 2 * o_bound).all()), what


@pytest.mark.gpu
@hostile
@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize(
    "dtype, precision",
    [(torch.float32, "fp32"), (torch.bfloat16, "fp32"), (torch.bfloat16, "bf16")],
)
@pytest.mark.parametrize("backend", ["triton", "hip"])
def test_prefill_gpu(hostile, backend, chunk, dtype, precision):
    """Every GPU prefill: Triton's kernels; HIP's chunks (bf16, chunk 64) and its token scan (the
    rest), their exps the GPU's own."""
    if precision == "bf16" and chunk != 64:
        pytest.skip("bf16 operands are a chunk-64 precision")
    case = _inputs(chunk, 200, dk=128, dv=64, hk=2, hv=4, dtype=dtype)
    ft.check_hostile_decays(
        _op(backend, chunk, precision, "cuda"),
        case,
        hostile,
        scale=128**-0.5,
        chunk_size=chunk,
        operands="bf16" if precision == "bf16" else "fp32",
        name=f"{backend}, chunk {chunk}, {dtype}, {precision}",
    )


@pytest.mark.gpu
@hostile
@pytest.mark.parametrize(
    "variant, precision", [("scan", "fp32"), ("chunk", "fp32"), ("chunk", "bf16")]
)
def test_hip_variants_gpu(hostile, variant, precision):
    """HIP's two prefill variants asked for by name, at Qwen3.6's heads."""
    from ftlab.hip import gated_delta_rule as hip_dn

    case = _inputs(7, 150, dk=128, dv=128, hk=2, hv=4, dtype=torch.bfloat16)

    def run(q, k, v, g, beta, state):
        args = (x.cuda() for x in (q, k, v, g, beta, state))
        o, s = hip_dn.gated_delta_rule(
            *args, 128**-0.5, True, 64, variant=variant, precision=precision
        )
        return o.cpu(), s.cpu()

    operands = "bf16" if variant == "chunk" and precision == "bf16" else "fp32"
    ft.check_hostile_decays(
        run,
        case,
        hostile,
        scale=128**-0.5,
        chunk_size=64,
        operands=operands,
        name=f"hip {variant}, {precision}",
    )


@pytest.mark.gpu
@hostile
@pytest.mark.parametrize("backend", ["triton", "hip"])
def test_decode_steps_gpu(hostile, backend):
    case = _inputs(8, 12, dk=128, dv=64, hk=2, hv=4, dtype=torch.bfloat16)
    ft.check_hostile_decays(
        _steps(backend, "cuda"),
        case,
        hostile,
        scale=128**-0.5,
        chunk_size=1,
        name=f"{backend} steps",
    )

"""Strategies and cross-backend case functions of GGUF Q4_0 (docs/OPS.md section 2).

Exactness per op: quantize_q4_0 and quantize_q8_1 bytes equal; dequantize_q4_0 bit-exact
(bf16 within one ulp in Triton's CPU interpreter, whose fp32 -> bf16 casts truncate);
q4_0_matmul within :func:`matmul_tolerance`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from ftlab import ops
from ftlab.bitview import bits_equal
from ftlab.quant import QK, Q4_0Weight
from ftlab.reference import q4_0 as ref
from ftlab.testing.common import FLOAT_DTYPES, assert_within, backends_for, restride, ulp

EPS32 = torch.finfo(torch.float32).eps
#: per-weight relative rounding of the dequant path's tile, by activation dtype: fp32 runs
#: as tf32 (10-bit mantissa) on GPUs, bf16 allows a truncating cast (the CPU interpreter)
DEQUANT_WEIGHT_ROUNDING = {
    torch.float32: 2.0**-10,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-7,
}


def _interpreted(device: torch.device) -> bool:
    return device.type == "cpu"


# ------------------------------------------------------------------ strategies


@st.composite
def q4_0_weight_values(
    draw, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES, max_rows: int = 64, max_k: int = 320
):
    """``[N, K]`` float weights whose blocks are random, zero, constant, tied (+a and -a),
    huge (fp16 scale overflows to inf) or tiny (subnormal scales)."""
    n = draw(st.integers(1, max_rows))
    k = QK * draw(st.sampled_from([1, 2, 3, 5, 7]) | st.integers(1, max_k // QK))
    dtype = draw(st.sampled_from(list(dtypes)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1.0, 1.0, 1e-3, 1e3, 1e-7, 3e5]))
    w = torch.randn(n, k, generator=gen) * scale
    blocks = w.view(n, k // QK, QK)
    kinds = torch.randint(0, 6, (n, k // QK), generator=gen)
    blocks[kinds == 1] = 0.0
    blocks[kinds == 2] = blocks[kinds == 2][:, :1].expand(-1, QK).clone()  # constant
    tie = kinds == 3
    blocks[tie, 5] = blocks[tie].abs().amax(1) * 2 + 1
    blocks[tie, 20] = -blocks[tie, 5]  # the same magnitude twice, opposite signs
    return w.to(dtype)


@st.composite
def q8_1_inputs(
    draw, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES, max_rows: int = 40, max_k: int = 320
):
    """``[M, K]`` activations, some blocks zero, some with exact halves after scaling."""
    m = draw(st.integers(1, max_rows))
    k = QK * draw(st.integers(1, max_k // QK))
    dtype = draw(st.sampled_from(list(dtypes)))
    pad = draw(st.sampled_from([0, 0, 32, 5]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(m, k + pad, generator=gen) * draw(st.sampled_from([1.0, 1e-4, 50.0]))
    blocks = x[:, :k].reshape(m, k // QK, QK)
    blocks[torch.rand(m, k // QK, generator=gen) < 0.15] = 0.0
    halves = torch.rand(m, k // QK, generator=gen) < 0.15  # amax 127 -> d = 1 -> q = x
    blocks[halves] = torch.randint(-254, 255, (int(halves.sum()), QK), generator=gen).float() / 2
    blocks[halves, 0] = 127.0
    return x.to(dtype)[:, :k]


@dataclass
class MatmulCase:
    x: torch.Tensor  # [M, K], row stride may exceed K
    w: torch.Tensor  # [N, K] float weights, quantized by the case function
    path: str

    def __repr__(self) -> str:
        return (
            f"MatmulCase(M={self.x.shape[0]}, N={self.w.shape[0]}, K={self.x.shape[1]}, "
            f"x={self.x.dtype}, stride={self.x.stride(0)}, path={self.path})"
        )


@st.composite
def matmul_cases(
    draw,
    ms: Sequence[int] = (1, 2, 3, 7, 16, 64, 257),
    paths: Sequence[str] = ("int8", "dequant"),
    max_n: int = 160,
    max_k: int = 288,
):
    """M from ``ms``; N and K multiples of 32 (odd multiples included); any x dtype; padded
    (non-contiguous) activation rows."""
    m = draw(st.sampled_from(list(ms)))
    n = draw(st.sampled_from([1, 31, 32, 96]) | st.integers(1, max_n))
    # 256 and 768: multiples of 8 blocks, the HIP fused matvec's unit
    k = QK * draw(st.sampled_from([1, 3, 5, 7, 8, 24]) | st.integers(1, max_k // QK))
    dtype = draw(st.sampled_from(list(FLOAT_DTYPES)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    pad = draw(st.sampled_from([0, 16, 32]))
    x = (torch.randn(m, k + pad, generator=gen) * draw(st.sampled_from([1.0, 0.01, 30.0]))).to(
        dtype
    )[:, :k]
    w = torch.randn(n, k, generator=gen) * draw(st.sampled_from([1.0, 0.02]))
    return MatmulCase(x, w, draw(st.sampled_from(list(paths))))


# ------------------------------------------------------------------ case functions


def check_quantize_case(
    w: torch.Tensor, device: torch.device | str = "cpu", backends: Sequence[str] | None = None
) -> Q4_0Weight:
    """Every backend's quantize_q4_0 must equal the reference byte for byte."""
    device = torch.device(device)
    w = w.to(device)
    expected = ops.quantize_q4_0(w, backend="reference")
    for name in backends_for("quantize_q4_0", device, w.dtype, backends):
        got = ops.quantize_q4_0(w, backend=name)
        assert got.shape == expected.shape, f"{name}: shape {got.shape} != {expected.shape}"
        if not torch.equal(got.data.cpu(), expected.data.cpu()):
            diff = (got.data.cpu() != expected.data.cpu()).nonzero()[:4].tolist()
            raise AssertionError(
                f"{name}: quantize_q4_0 bytes differ at {diff} for {tuple(w.shape)} {w.dtype}"
            )
    return expected


def check_dequantize_case(
    w: Q4_0Weight,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> torch.Tensor:
    """Bit-exact dequantization (bf16 within one ulp in the CPU interpreter)."""
    device = torch.device(device)
    w = w.to(device)
    expected = ops.dequantize_q4_0(w, dtype, backend="reference")
    for name in backends_for("dequantize_q4_0", device, dtype, backends):
        got = ops.dequantize_q4_0(w, dtype, backend=name)
        if dtype == torch.bfloat16 and name == "triton" and _interpreted(device):
            torch.testing.assert_close(
                got.float(), expected.float(), rtol=2**-7, atol=0, equal_nan=True
            )
        else:
            assert bits_equal(got, expected), f"{name}: dequantize_q4_0 to {dtype} is not bit-exact"
    return expected


def check_q8_1_case(
    x: torch.Tensor, device: torch.device | str = "cpu", backends: Sequence[str] | None = None
):
    """Every backend's quantize_q8_1 must equal the reference: q, d and s bit for bit."""
    device = torch.device(device)
    x = restride(x, device)
    expected = ops.quantize_q8_1(x, backend="reference")
    for name in backends_for("quantize_q8_1", device, x.dtype, backends):
        got = ops.quantize_q8_1(x, backend=name)
        for part in ("q", "d", "s"):
            g, e = getattr(got, part), getattr(expected, part)
            if not bits_equal(g, e):
                where = (g.cpu() != e.cpu()).nonzero()[:4].tolist()
                raise AssertionError(
                    f"{name}: quantize_q8_1 {part} differs at {where} ({x.dtype}, {tuple(x.shape)})"
                )
    return expected


def matmul_tolerance(
    x: torch.Tensor, w: Q4_0Weight, path: str, out_dtype: torch.dtype
) -> torch.Tensor:
    """Per-element bound ``[M, N]`` on |backend - reference| for q4_0_matmul.

    Both are sums of n fp32 roundings in some order (n = K/32 blocks for int8, K products
    for dequant), so the classic bound ``(n + 4) * eps32 * sum |parts|`` holds for any
    summation order and with or without fused multiply-adds. int8: the parts of each block
    are ``|d4| * (|d8 * sumi| + 8 |s8|)`` (the same integer dots in every backend). dequant:
    ``|x_k w_k|``, plus the rounding of each weight to x's dtype in the tile
    (``DEQUANT_WEIGHT_ROUNDING``). One ulp of the output dtype is added: the two fp32
    results may round to neighbours.
    """
    xf = x.float().cpu()
    wc = w.to("cpu")
    n_blocks = w.shape[-1] // QK
    if path == "int8":
        terms, parts = ref.q4_0_block_terms(ref.quantize_q8_1(xf.to(x.dtype)), wc)  # [M, N, nb]
        bound = (n_blocks + 4) * EPS32 * parts.sum(-1)
        exact = terms.sum(-1)
    else:
        wf = ref.dequantize_q4_0(wc, torch.float32)
        absdot = (xf.abs().double() @ wf.abs().double().T).float()
        bound = (DEQUANT_WEIGHT_ROUNDING[x.dtype] + (w.shape[-1] + 4) * EPS32) * absdot
        exact = xf @ wf.T
    if out_dtype != torch.float32:
        bound = bound + ulp(exact, out_dtype)
    return bound


def check_matmul_case(
    case: MatmulCase, device: torch.device | str = "cpu", backends: Sequence[str] | None = None
) -> dict[str, torch.Tensor]:
    """Every backend that implements ``case.path`` against the reference of that path; on the int8
    path with up to 8 rows, each given the Q8_1 of another x (``x_q8``, x's columns reversed) gives
    the bits it gives for that other x."""
    device = torch.device(device)
    w = ops.quantize_q4_0(case.w.to(device), backend="reference")
    x = restride(case.x, device)
    expected = ops.q4_0_matmul(x, w, path=case.path, backend="reference")
    bound = matmul_tolerance(case.x, w, case.path, x.dtype)
    outputs = {"reference": expected}
    names = backends_for("q4_0_matmul", device, x.dtype, backends, path=case.path)
    for name in names:
        got = ops.q4_0_matmul(x, w, path=case.path, backend=name)
        assert got.shape == expected.shape and got.dtype == x.dtype, (
            f"{name}: {got.shape} {got.dtype}"
        )
        assert_within(name, f"q4_0_matmul {case!r}", got, expected, bound)
        # decode sizes: the Q8_1 of another x given as x_q8
        if case.path == "int8" and x.shape[0] <= 8:
            # is what the int8 path multiplies, bit for bit as that x itself (hip: no quantization
            # launched)
            other = x.flip(1).contiguous()
            x8 = ops.quantize_q8_1(other, backend="reference" if device.type == "cpu" else "auto")
            again = ops.q4_0_matmul(x, w, path=case.path, backend=name, x_q8=x8)
            assert bits_equal(again, ops.q4_0_matmul(other, w, path=case.path, backend=name)), (
                f"{name}: the product with x_q8 given is not that of x_q8"
            )
        outputs[name] = got
    return outputs


def check_norm_matmul_case(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    w: Q4_0Weight,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> None:
    """Each backend's ``add_rmsnorm_q4_0_matmul`` against its own ``add_rmsnorm`` then
    ``q4_0_matmul`` (on the int8 path): y, s and the product equal, bit for bit (the op's contract:
    hip's one launch repeats the two kernels' arithmetic); s is x itself without a residual."""
    dev = torch.device(device)
    x, norm_weight = x.to(dev), norm_weight.to(dev)
    w = Q4_0Weight(w.data.to(dev), tuple(w.shape))
    residual = None if residual is None else residual.to(dev)
    for name in backends_for("add_rmsnorm_q4_0_matmul", dev, x.dtype, backends):
        got = ops.add_rmsnorm_q4_0_matmul(
            x, residual, norm_weight, eps, w, path="int8", backend=name
        )
        y, s = ops.add_rmsnorm(x, residual, norm_weight, eps, backend=name)
        want = (y, s, ops.q4_0_matmul(y, w, path="int8", backend=name))
        for part, a, b in zip(("y", "s", "out"), got, want, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype, (name, part)
            assert torch.equal(a.cpu(), b.cpu()), (
                f"{name}: {part} differs from add_rmsnorm then q4_0_matmul"
            )
        assert (got[1] is x) == (residual is None), name

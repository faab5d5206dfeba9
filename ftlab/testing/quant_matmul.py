"""Strategies and the cross-backend case function of ``quant_matmul`` (GGUF Q8_0 and the
K-quants; docs/OPS.md section 11).

Weights are random bytes (every byte pattern is a block) with finite fp16 scales: ordinary, and
a quarter special (zero, subnormal, the largest finite -- smaller for fp16 activations on the
dequant path, whose tile holds the weights in fp16); some rows all zero.

- int8: every backend against the reference, within :func:`quant_matmul_tolerance` (both are
  sums of the same exact integer dots scaled in fp32, in different orders).
- dequant: every backend, the reference included, against ``x @ dequantize(W).T`` in f64,
  within one rounding of each weight to x's dtype plus fp32 accumulation.
An output that overflows x's dtype must be infinite (of the right sign) in every backend, or
the dtype's largest finite value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from ftlab import ops
from ftlab.quant import QuantWeight, quant_weight
from ftlab.reference import q4_0 as ref_q4_0
from ftlab.reference import quant_matmul as ref
from ftlab.reference.quants import dequantize
from ftlab.testing.common import FLOAT_DTYPES, backends_for, restride, ulp
from ftlab.testing.q4_0 import DEQUANT_WEIGHT_ROUNDING
from ftlab.testing.quants import FINITE_SPECIAL_F16, KQUANT_TYPES, random_blocks

EPS32 = torch.finfo(torch.float32).eps
#: an fp16 scale small enough that every dequantized weight of every type fits in fp16
#: (|w| <= d * 63 * 31 for Q5_K, d * 128 * 32 for Q6_K)
FP16_SAFE_LARGE = 0x4800  # 8.0


def random_quant_weight(
    seed: int,
    qtype: str,
    n: int,
    k: int,
    specials: Sequence[int] = FINITE_SPECIAL_F16,
    zero_rows: float = 0.1,
) -> QuantWeight:
    """``[N, K]`` of random ``qtype`` blocks, a quarter of the fp16 scales from ``specials``,
    a fraction ``zero_rows`` of the rows all-zero bytes."""
    rng = np.random.default_rng(seed)
    data = random_blocks(rng, qtype, (n,), k, specials)
    data[rng.random(n) < zero_rows] = 0
    return quant_weight(torch.from_numpy(data), (n, k), qtype)


@dataclass
class QuantMatmulCase:
    x: torch.Tensor  # [M, K], row stride may exceed K
    w: QuantWeight  # [N, K]
    path: str

    def __repr__(self) -> str:
        return (
            f"QuantMatmulCase({self.w.qtype}, M={self.x.shape[0]}, N={self.w.shape[0]}, "
            f"K={self.x.shape[1]}, x={self.x.dtype}, stride={self.x.stride(0)}, path={self.path})"
        )


@st.composite
def quant_matmul_cases(
    draw,
    qtypes: Sequence[str] = KQUANT_TYPES,
    ms: Sequence[int] = (1, 3, 8, 17),
    paths: Sequence[str] = ("int8", "dequant"),
    max_n: int = 40,
    ks: Sequence[int] = (256, 512),
):
    """A case of one of ``qtypes``: M from ``ms``, N up to ``max_n``, K from ``ks`` (Q8_0 also
    odd multiples of 32), any x dtype, padded activation rows, x scaled small to large."""
    qtype = draw(st.sampled_from(list(qtypes)))
    m = draw(st.sampled_from(list(ms)))
    n = draw(st.sampled_from([1, 31, max_n]) | st.integers(1, max_n))
    k = draw(
        st.sampled_from(list(ks))
        | (st.sampled_from([32, 96, 160]) if qtype == "Q8_0" else st.nothing())
    )
    dtype = draw(st.sampled_from(list(FLOAT_DTYPES)))
    path = draw(st.sampled_from(list(paths)))
    specials = FINITE_SPECIAL_F16
    if dtype == torch.float16 and path == "dequant":
        specials = (*FINITE_SPECIAL_F16[:-1], FP16_SAFE_LARGE)
    w = random_quant_weight(draw(st.integers(0, 2**32 - 1)), qtype, n, k, specials)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    pad = draw(st.sampled_from([0, 0, 32, 5]))
    scale = draw(st.sampled_from([1.0, 0.01, 30.0]))
    x = (torch.randn(m, k + pad, generator=gen) * scale).to(dtype)[:, :k]
    x[:, : min(k, 32)][torch.rand(m, generator=gen) < 0.2] = 0  # some all-zero Q8_1 blocks
    return QuantMatmulCase(x, w, path)


def quant_matmul_tolerance(
    x: torch.Tensor, w: QuantWeight, path: str, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(what a backend is compared with, the per-element bound ``[M, N]`` on |difference|).

    int8: the reference's value; both are sums of the same S sub-block terms (S = K/32, K/16
    for Q6_K), each a product of fp32 factors and integers minus another such product, in any
    order and association, with or without fused multiply-adds: ``(S + 4) * eps32 * sum |parts|``
    (parts from :func:`ftlab.reference.quant_matmul.block_terms`), plus ``S * 2^-140`` for
    products that fall to fp32 subnormals.
    dequant: ``x @ dequantize(W).T`` in f64; the weights are rounded once to x's dtype in the tile
    (``DEQUANT_WEIGHT_ROUNDING``) and K products summed in fp32:
    ``(rounding + (K + 4) * eps32) * |x| @ |W|.T``.
    One ulp of the output dtype is added for fp16 / bf16: the two fp32 results may round to
    neighbours. Computed on w's device."""
    xc = x.to(w.device)
    wc = w
    if path == "int8":
        terms, parts = ref.block_terms(ref_q4_0.quantize_q8_1(xc), wc)
        s = terms.shape[-1]
        exact = terms.sum(-1)
        bound = ((s + 4) * EPS32 * parts.sum(-1) + s * 2.0**-140).float()
    else:
        wf = dequantize(wc, torch.float32).double()
        exact = (xc.double() @ wf.T).float()
        absdot = xc.double().abs() @ wf.abs().T
        bound = (
            (DEQUANT_WEIGHT_ROUNDING[x.dtype] + (w.shape[-1] + 4) * EPS32) * absdot + 2.0**-140
        ).float()
    if out_dtype != torch.float32:
        bound = bound + ulp(exact, out_dtype)
    return exact, bound


def _assert_within(
    name: str, what: str, got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor
) -> None:
    g, w, bound = got.float().cpu(), want.float().cpu(), bound.cpu()
    big = torch.finfo(got.dtype).max
    overflow = torch.isinf(g) | torch.isinf(w)
    same_side = (g.abs() >= big) & (w.abs() >= big) & (torch.sign(g) == torch.sign(w))
    err = (g - w).abs()
    bad = torch.where(overflow, ~same_side, ~(err <= bound))
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise AssertionError(
            f"{name}: {what} off at [{i}, {j}]: got {float(g[i, j])}, want {float(w[i, j])}, "
            f"|diff| {float(err[i, j]):.3g} > bound {float(bound[i, j]):.3g} "
            f"({int(bad.sum())} of {bad.numel()} elements)"
        )


def check_quant_matmul_case(
    case: QuantMatmulCase, device: torch.device | str = "cpu", backends: Sequence[str] | None = None
) -> dict[str, torch.Tensor]:
    """Every backend implementing ``case.path`` (the reference included) within
    :func:`quant_matmul_tolerance`; returns the outputs by backend."""
    device = torch.device(device)
    w = case.w.to(device)
    x = restride(case.x, device)
    expected = ops.quant_matmul(x, w, path=case.path, backend="reference")
    exact, bound = quant_matmul_tolerance(x, w, case.path, x.dtype)
    want = expected if case.path == "int8" else exact
    if case.path == "dequant":
        _assert_within("reference", repr(case), expected, exact, bound)
    outputs = {"reference": expected}
    for name in backends_for("quant_matmul", device, x.dtype, backends, path=case.path):
        got = ops.quant_matmul(x, w, path=case.path, backend=name)
        assert got.shape == expected.shape and got.dtype == x.dtype, (
            f"{name}: {got.shape} {got.dtype}"
        )
        _assert_within(name, repr(case), got, want, bound)
        outputs[name] = got
    return outputs

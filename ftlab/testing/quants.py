"""Strategies and the cross-backend case function of ``dequantize`` (GGUF Q8_0 and the
K-quants; docs/OPS.md section 7).

Blocks are random bytes -- every byte pattern is a valid block -- with their fp16 scales
(``d``, and ``dmin`` for Q4_K / Q5_K) drawn apart: ordinary, zero, subnormal, the largest
finite, infinite or NaN, so the kernels meet every kind of scale gguf-py meets. fp32 outputs
must equal the reference bit for bit, NaN payloads aside (a NaN where the reference has one).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from hypothesis import strategies as st

from ftlab import ops
from ftlab.quant import QTYPES, QuantWeight
from ftlab.testing.common import backends_for

#: the types of ``ops.dequantize`` beside Q4_0, and the byte offsets of their fp16 scales
KQUANT_TYPES = ("Q8_0", "Q4_K", "Q5_K", "Q6_K")
SCALE_OFFSETS = {"Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q4_0": (0,)}
_SPECIAL_F16 = (0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0xFE01)
#: the finite ones: zero, subnormal, the largest finite
FINITE_SPECIAL_F16 = (0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF)


@st.composite
def quant_weights(
    draw,
    qtypes: Sequence[str] = KQUANT_TYPES,
    max_rows: int = 12,
    max_blocks: int = 4,
    specials: Sequence[int] = _SPECIAL_F16,
    banks: bool = True,
):
    """A :class:`~ftlab.quant.QuantWeight` ``[N, K]`` (or ``[E, N, K]`` with ``banks``) of random
    blocks of one of ``qtypes``, a quarter of whose scales are drawn from ``specials`` (fp16 bit
    patterns; by default zero, subnormal, the largest finite, infinite, NaN;
    :data:`FINITE_SPECIAL_F16` for the finite ones)."""
    qtype = draw(st.sampled_from(list(qtypes)))
    qt = QTYPES[qtype]
    lead = (draw(st.integers(1, 3)),) if banks and draw(st.booleans()) else ()
    n = draw(st.integers(1, max_rows))
    k = qt.block * draw(st.integers(1, max_blocks if qt.block > 32 else 4 * max_blocks))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    data = random_blocks(rng, qtype, (*lead, n), k, specials)
    return QuantWeight(torch.from_numpy(data), (*lead, n, k), qtype)


def random_blocks(
    rng: np.random.Generator, qtype: str, rows: tuple[int, ...], k: int, specials: Sequence[int]
) -> np.ndarray:
    """uint8 ``[*rows, row bytes]``: rows of ``k`` weights in random ``qtype`` blocks from ``rng``,
    whose fp16 scales are ordinary (uniform in [1e-3, 1)) or, a quarter of them, drawn from
    ``specials`` (fp16 bit patterns)."""
    qt = QTYPES[qtype]
    data = rng.integers(0, 256, (*rows, qt.row_bytes(k)), dtype=np.uint8)
    blocks = data.reshape(-1, qt.nbytes)
    for off in SCALE_OFFSETS[qtype]:
        ordinary = rng.uniform(1e-3, 1.0, blocks.shape[0]).astype(np.float16).view(np.uint16)
        special = rng.choice(np.array(specials, dtype=np.uint16), blocks.shape[0])
        scale = np.where(rng.random(blocks.shape[0]) < 0.25, special, ordinary)
        blocks[:, off : off + 2] = scale.astype("<u2").view(np.uint8).reshape(-1, 2)
    return data


@st.composite
def q8_0_values(
    draw,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float16, torch.bfloat16),
    max_rows: int = 24,
    max_blocks: int = 10,
):
    """``[N, K]`` finite float weights for Q8_0: random blocks, zero blocks, and blocks whose
    values land on exact halves after scaling (amax 127 -> d = 1 -> q = round(x))."""
    n = draw(st.integers(1, max_rows))
    k = 32 * draw(st.integers(1, max_blocks))
    dtype = draw(st.sampled_from(list(dtypes)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    w = torch.randn(n, k, generator=gen) * draw(st.sampled_from([1.0, 1e-3, 40.0, 1e-6]))
    blocks = w.view(n, k // 32, 32)
    blocks[torch.rand(n, k // 32, generator=gen) < 0.15] = 0.0
    halves = torch.rand(n, k // 32, generator=gen) < 0.2
    blocks[halves] = torch.randint(-254, 255, (int(halves.sum()), 32), generator=gen).float() / 2
    blocks[halves, 0] = 127.0
    return w.to(dtype)


def check_q8_0_quantize_case(
    w: torch.Tensor, device: torch.device | str = "cpu", backends: Sequence[str] | None = None
) -> QuantWeight:
    """Every backend's ``ops.quantize(w, "Q8_0")`` must equal the reference byte for byte."""
    device = torch.device(device)
    w = w.to(device)
    expected = ops.quantize(w, "Q8_0", backend="reference")
    for name in backends_for("quantize", device, w.dtype, backends):
        got = ops.quantize(w, "Q8_0", backend=name)
        assert got.qtype == "Q8_0" and got.shape == expected.shape, f"{name}: {got!r}"
        if not torch.equal(got.data.cpu(), expected.data.cpu()):
            where = (got.data.cpu() != expected.data.cpu()).nonzero()[:4].tolist()
            raise AssertionError(
                f"{name}: Q8_0 bytes differ at {where} for {tuple(w.shape)} {w.dtype}"
            )
    return expected


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit, but any NaN matches any NaN (payloads are not part of the contract)."""
    g, w = got.cpu(), want.cpu()
    nan = torch.isnan(w)
    if not torch.equal(torch.isnan(g), nan):
        return False
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[g.element_size()]
    return torch.equal(g[~nan].view(width), w[~nan].view(width))


def check_quant_dequantize_case(
    w: QuantWeight,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> torch.Tensor:
    """Every backend's ``ops.dequantize`` of ``w`` against the reference's: bit-exact (NaN as
    NaN); bf16 within one ulp in Triton's CPU interpreter (its bf16 stores truncate)."""
    device = torch.device(device)
    w = w.to(device)
    expected = ops.dequantize(w, dtype, backend="reference")
    for name in backends_for("dequantize", device, dtype, backends):
        got = ops.dequantize(w, dtype, backend=name)
        assert got.shape == w.shape and got.dtype == dtype, (
            f"{name}: {tuple(got.shape)} {got.dtype}"
        )
        if dtype == torch.bfloat16 and name == "triton" and device.type == "cpu":
            torch.testing.assert_close(
                got.float(), expected.float(), rtol=2**-7, atol=0, equal_nan=True
            )
        elif not _same(got, expected):
            bad = (got.cpu().float() != expected.cpu().float()) & ~torch.isnan(
                expected.cpu().float()
            )
            where = bad.nonzero()[:3].tolist()
            raise AssertionError(
                f"{name}: dequantize {w.qtype} to {dtype} differs from the reference at {where}"
            )
    return expected

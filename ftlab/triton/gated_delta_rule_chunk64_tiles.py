"""The tiles the chunk-64 gated delta rule kernels share
(:mod:`ftlab.triton.gated_delta_rule_chunk64`): a chunk's rows of the inputs and its place in the
scratch, and the two kinds of dot they take -- of two tiles of input rows (:func:`input_gram`:
the inputs' own dtype, exact products in fp32) and of fp32 tiles (:func:`mmp`: fp32 accuracy, or
with ``precision="bf16"`` each operand rounded to bf16 once, as fla's kernels compute;
:func:`narrow`: the scratch kept in bf16 then).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def input_rows(
    ptr, b, t0, T, head, H: tl.constexpr, D: tl.constexpr, R: tl.constexpr, BD: tl.constexpr, col0
):
    """``[R, BD]`` in the tensor's dtype: rows t0 .. t0 + R, columns col0 .. col0 + BD of head
    ``head`` of a ``[B, T, H, D]`` tensor, zeros past T and D."""
    t = t0 + tl.arange(0, R)
    d = col0 + tl.arange(0, BD)
    offs = ((b * T + t).to(tl.int64)[:, None] * H + head) * D + d[None, :]
    return tl.load(ptr + offs, mask=(t < T)[:, None] & (d < D)[None, :], other=0.0)


@triton.jit
def chunk_coords(n, bh, NT, HK: tl.constexpr, HV: tl.constexpr):
    """Of chunk ``n`` of row ``bh`` (sequence x value head): the sequence, the value head, its key
    head, the chunk's first token and its first row in the ``[B Hv, NT 64, *]`` scratch."""
    b = bh // HV
    h = bh % HV
    return b, h, h // (HV // HK), n * 64, bh.to(tl.int64) * NT * 64 + n * 64


@triton.jit
def input_gram(a, b, PRECISION: tl.constexpr, NATIVE: tl.constexpr):
    """``a b^T`` of two tiles of input rows, fp32: the inputs' own dot for 16-bit inputs when
    NATIVE (exact products), else (fp32 inputs; the interpreter, whose bf16 dot is not one) the
    rows in fp32 at PRECISION, which gives the same products."""
    if a.dtype == tl.float32 or not NATIVE:
        return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision=PRECISION)
    else:
        return tl.dot(a, tl.trans(b))


@triton.jit
def _bf16_rne(x):
    """fp32 x rounded to the nearest bf16 (ties to even), in fp32: the interpreter's casts to bf16
    truncate, so it rounds by bits as the GPU's conversion does."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))  # a NaN stays a NaN


@triton.jit
def mmp(a, b, PRECISION: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr):
    """``a b`` of fp32 tiles: at PRECISION, or (BF16) each operand rounded to bf16 once and one
    bf16 product with fp32 sums (the interpreter, whose bf16 dot is not one: the rounded
    operands' exact products in an fp32 dot)."""
    if BF16:
        if NATIVE:
            return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
        else:
            return tl.dot(_bf16_rne(a), _bf16_rne(b), input_precision=PRECISION)
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def narrow(x, BF16: tl.constexpr, NATIVE: tl.constexpr):
    """fp32 x as the scratch keeps it: bf16 (rounded to nearest; in the interpreter by bits, as its
    casts truncate) when BF16, else as it is."""
    if BF16:
        if NATIVE:
            return x.to(tl.bfloat16)
        else:
            return _bf16_rne(x).to(tl.bfloat16)
    else:
        return x

"""GGUF Q4_0 and Q8_1, the readable way (docs/OPS.md section 2). The oracle of every kernel.

quantize_q4_0, per 32-block (as llama.cpp and gguf-py do, bit for bit):
    amax = the element of largest magnitude, with its sign (the first one on ties)
    d    = amax / -8                                  (fp32, stored as fp16)
    id   = 1 / d, or 0 when d == 0                    (a reciprocal, then a multiply)
    q    = min(15, trunc(x * id + 8.5))               (x * id rounded before the add)
quantize_q8_1, per 32-block of activations:
    d = amax / torch.full_like(amax, 127.0)  # tensor / tensor: correctly rounded on every device
    (amax = max |x|);  q = round_half_away(x / d) (0 when amax == 0);  s = d * sum(q)
int8 dot of a Q4_0 block (d4, q4) with a Q8_1 block (d8, q8, s8):
    d4 * (d8 * sum_i(q4_i * q8_i) - 8 * s8)      == d4 * d8 * sum_i((q4_i - 8) * q8_i)
"""

from __future__ import annotations

import torch

from ftlab import argcheck
from ftlab.quant import Q4_0_BLOCK_BYTES, Q8_1, QK, Q4_0Weight
from ftlab.reference.norm import add_rmsnorm


def round_half_away(v: torch.Tensor) -> torch.Tensor:
    """C's roundf: halves away from zero. ``v - trunc(v)`` is exact, so this never
    double-rounds (``floor(v + 0.5)`` does, e.g. for 0.49999997)."""
    t = torch.trunc(v)
    return torch.where((v - t).abs() >= 0.5, t + torch.sign(v), t)


def quantize_q4_0(w: torch.Tensor) -> Q4_0Weight:
    """``w [..., N, K]`` (any float dtype, K % 32 == 0) -> Q4_0Weight, byte-identical to
    ``gguf.quants.quantize(w, Q4_0)``."""
    shape = tuple(w.shape)
    blocks = w.float().reshape(-1, QK)  # [B, 32]
    first = blocks.abs().argmax(dim=1, keepdim=True)  # first index of the largest |x|
    amax = blocks.gather(1, first)  # [B, 1], signed
    # Divisions tensor by tensor: torch on CUDA turns a division by a Python scalar into a
    # multiply by its reciprocal, which is not the correctly rounded quotient.
    d = amax / torch.full_like(amax, -8.0)
    inv = torch.where(
        d == 0, torch.zeros_like(d), torch.ones_like(d) / torch.where(d == 0, torch.ones_like(d), d)
    )
    scaled = blocks * inv  # rounded to fp32 here, before the add: no fused multiply-add
    q = torch.trunc(scaled + 8.5).clamp(0, 15).to(torch.uint8)  # [B, 32]
    qs = q[:, :16] | (q[:, 16:] << 4)  # [B, 16]
    d16 = d.to(torch.float16).view(torch.uint8)  # [B, 2], little-endian fp16
    packed = torch.cat([d16, qs], dim=1)  # [B, 18]
    return Q4_0Weight(packed.reshape(*shape[:-1], shape[-1] // QK * Q4_0_BLOCK_BYTES), shape)


def unpack_q4_0(w: Q4_0Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """(d fp32 ``[..., N, K/32]``, q uint8 0..15 ``[..., N, K/32, 32]``)."""
    blocks = w.blocks  # [..., N, nb, 18]
    d = blocks[..., :2].contiguous().view(torch.float16).squeeze(-1).float()
    qs = blocks[..., 2:]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # element j low nibble, j+16 high nibble
    return d, q


def dequantize_q4_0(w: Q4_0Weight, dtype: torch.dtype) -> torch.Tensor:
    """``[..., N, K]`` = ``d * (q - 8)`` (exact in fp32), cast to ``dtype``."""
    d, q = unpack_q4_0(w)
    values = d[..., None] * (q.float() - 8)  # [..., N, nb, 32]
    return values.reshape(w.shape).to(dtype)


def quantize_q8_1(x: torch.Tensor) -> Q8_1:
    """``x [M, K]`` (fp32/fp16/bf16) -> Q8_1 blocks."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // QK, QK)
    amax = blocks.abs().amax(dim=-1)  # [M, nb]
    d = amax / torch.full_like(amax, 127.0)  # tensor / tensor: correctly rounded on every device
    safe = torch.where(d == 0, torch.ones_like(d), d)
    q = torch.where(
        amax[..., None] == 0, torch.zeros_like(blocks), round_half_away(blocks / safe[..., None])
    )
    q = q.to(torch.int8)
    s = d * q.sum(dim=-1, dtype=torch.int32).float()
    return Q8_1(q.reshape(m, k), d, s)


def q4_0_block_terms(x8: Q8_1, w: Q4_0Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """Every block's contribution ``d4 * (d8 * sumi - 8 * s8)`` and the magnitude of its
    parts ``|d4| * (|d8 * sumi| + 8 |s8|)``, both fp32 ``[M, N, K/32]``.

    ``sumi`` is the exact integer dot of the block's nibbles (0..15) with its int8
    activations, what dp4a / sudot4 / sdot4 compute. The two products nearly cancel when
    the block's values centre on 8, so the magnitude, not the contribution, bounds the
    rounding of evaluating this in fp32 (with or without a fused multiply-add)."""
    d4, q4 = unpack_q4_0(w)  # [N, nb], [N, nb, 32]
    m, k = x8.q.shape
    q8 = x8.q.view(m, k // QK, QK).to(torch.int32)  # [M, nb, 32]
    # exact: |sum| < 2^17
    sumi = torch.einsum("mbi,nbi->mnb", q8.double(), q4.double()).to(torch.int32)
    scaled = x8.d[:, None, :] * sumi.float()  # [M, N, nb]
    shift = 8 * x8.s[:, None, :]
    return d4[None] * (scaled - shift), d4.abs()[None] * (scaled.abs() + shift.abs())


def q4_0_block_dots(x8: Q8_1, w: Q4_0Weight) -> torch.Tensor:
    """Every block's contribution ``d4 * (d8 * sumi - 8 * s8)``: fp32 ``[M, N, K/32]``."""
    return q4_0_block_terms(x8, w)[0]


def q4_0_matmul(
    x: torch.Tensor, w: Q4_0Weight, path: str = "int8", x_q8: Q8_1 | None = None
) -> torch.Tensor:
    """``x [M, K] @ W.T -> [M, N]`` in x's dtype.

    path ``"int8"``: quantize x to Q8_1 (or take ``x_q8``, x's Q8_1), then the int8 dot per block,
    summed in fp32.
    path ``"dequant"``: ``x.float() @ dequantize(W).float().T``.
    """
    argcheck.matmul_layout(x, w)
    if path == "int8":
        return q4_0_block_dots(quantize_q8_1(x) if x_q8 is None else x_q8, w).sum(-1).to(x.dtype)
    if path == "dequant":
        return (x.float() @ dequantize_q4_0(w, torch.float32).T).to(x.dtype)
    raise ValueError(f"path must be 'int8' or 'dequant', got {path!r}")


def add_rmsnorm_q4_0_matmul(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    w: Q4_0Weight,
    path: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.add_rmsnorm_q4_0_matmul`: the reference add_rmsnorm, then
    :func:`q4_0_matmul` of its output."""
    y, s = add_rmsnorm(x, residual, norm_weight, eps)
    return y, s, q4_0_matmul(y, w, path)

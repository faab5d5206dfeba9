"""Dequantizing GGUF blocks of Q8_0 and the K-quants, and quantizing to Q8_0, the readable way
(docs/OPS.md section 7).
The oracle of the kernels, and bit-exact against gguf-py's ``gguf.quants.dequantize``: each
value is computed in fp32 in the order gguf-py (and llama.cpp's ``dequantize_row_*``) does,
every product rounded before the next operation.

Q8_0 (34 bytes / 32): ``d`` fp16, ``q[32]`` int8; ``x = d * q``.
Q4_K (144 bytes / 256): ``d``, ``dmin`` fp16; 12 bytes packing eight 6-bit scales ``sc`` and
    mins ``m`` (:func:`scale_min_k4`); ``qs[128]``: sub-block pair p (64 weights) in bytes
    32p..32p+31, the low nibbles sub-block 2p, the high nibbles 2p+1.
    ``x = (d * sc[j]) * q - (dmin * m[j])`` for sub-block j of 32.
Q5_K (176 bytes / 256): as Q4_K with ``qh[32]`` before ``qs``: bit j of ``qh[i]`` is the fifth
    bit of weight i of sub-block j; ``q = nibble | bit << 4`` (0..31).
Q6_K (210 bytes / 256): ``ql[128]``, ``qh[64]``, ``scales[16]`` int8, ``d`` fp16. In each half
    (128 weights, ``ql`` bytes 64h.., ``qh`` bytes 32h..) the four quarters of 32 weights take
    ``ql``'s low nibbles of bytes 0..31, of 32..63, the high nibbles of 0..31, of 32..63, and
    ``qh``'s bits 0-1, 2-3, 4-5, 6-7 of bytes 0..31; ``q = (nibble | two << 4) - 32``;
    ``x = (d * scales[j]) * q`` for sub-block j of 16.
"""

from __future__ import annotations

import torch

from ftlab.quant import QTYPES, QuantWeight
from ftlab.reference.q4_0 import round_half_away


def _f16(b: torch.Tensor) -> torch.Tensor:
    """fp32 of the little-endian fp16 in the last dim's two bytes."""
    return b.contiguous().view(torch.float16).float().squeeze(-1)


def scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins of Q4_K / Q5_K's 12 bytes ``[..., 12]`` (llama.cpp's
    ``get_scale_min_k4``): j < 4 from the low six bits of bytes j and j + 4; j >= 4 from the
    nibbles of byte j + 4 and the top two bits of bytes j - 4 and j."""
    s = scales.long()
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.float(), mn.float()


def _q8_0(b: torch.Tensor) -> torch.Tensor:  # [..., 34] -> [..., 32]
    return b[..., 2:].contiguous().view(torch.int8).float() * _f16(b[..., :2])[..., None]


def _q4_k(b: torch.Tensor, fifth: bool) -> torch.Tensor:  # [..., 144 | 176] -> [..., 256]
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = scale_min_k4(b[..., 4:16])
    lead = b.shape[:-1]
    qs = b[..., 48:] if fifth else b[..., 16:]  # [..., 128]
    pairs = qs.reshape(*lead, 4, 32)  # uint8: the integer work in bytes, exact
    # sub-block j = 2p + half
    q = torch.stack([pairs & 0x0F, pairs >> 4], dim=-2).reshape(*lead, 8, 32)
    if fifth:
        qh = b[..., 16:48]  # [..., 32]: bit j for sub-block j
        bits = torch.stack([(qh >> j) & 1 for j in range(8)], dim=-2)  # [..., 8, 32]
        q = q | (bits << 4)
    scale = (d[..., None] * sc)[..., None]  # [..., 8, 1], rounded as gguf-py rounds it
    shift = (dmin[..., None] * mn)[..., None]
    return (scale * q.float() - shift).reshape(*lead, 256)


def _q6_k(b: torch.Tensor) -> torch.Tensor:  # [..., 210] -> [..., 256]
    lead = b.shape[:-1]
    ql = b[..., 0:128].reshape(*lead, 2, 2, 32)  # [half, which 32 bytes, byte], uint8
    qh = b[..., 128:192].reshape(*lead, 2, 32)  # [half, byte], uint8
    scales = b[..., 192:208].contiguous().view(torch.int8).float()  # [..., 16]
    d = _f16(b[..., 208:210])
    # [..., half, quarter, 32]
    low = torch.stack(
        [ql[..., 0, :] & 0x0F, ql[..., 1, :] & 0x0F, ql[..., 0, :] >> 4, ql[..., 1, :] >> 4], dim=-2
    )
    high = torch.stack([(qh >> s) & 0x03 for s in (0, 2, 4, 6)], dim=-2)  # [..., half, quarter, 32]
    # 0..63 in a byte, then signed: sub-blocks of 16, in order
    q = ((low | (high << 4)).to(torch.int16) - 32).reshape(*lead, 16, 16).float()
    return ((d[..., None] * scales)[..., None] * q).reshape(*lead, 256)


_DEQUANT = {
    "Q8_0": _q8_0,
    "Q4_K": lambda b: _q4_k(b, False),
    "Q5_K": lambda b: _q4_k(b, True),
    "Q6_K": _q6_k,
}


def quantize(w: torch.Tensor, qtype: str) -> QuantWeight:
    """Backend entry of :func:`ftlab.ops.quantize` (``qtype`` "Q8_0"; w ``[..., N, K]``, K % 32
    == 0, finite): per 32-block ``d = amax / 127`` (amax = max |x|), ``id = 1 / d`` (0 when
    d == 0), ``q = round_half_away(x * id)``, d stored as fp16 -- llama.cpp's
    ``quantize_row_q8_0_ref`` and gguf-py's ``quantize``, byte for byte."""
    blocks = w.float().reshape(-1, 32)  # [B, 32]
    amax = blocks.abs().amax(dim=1, keepdim=True)  # [B, 1]
    # tensor / tensor: torch on CUDA turns a division by a Python scalar into a multiply
    d = amax / torch.full_like(amax, 127.0)
    inv = torch.where(
        d == 0, torch.zeros_like(d), torch.ones_like(d) / torch.where(d == 0, torch.ones_like(d), d)
    )
    q = round_half_away(blocks * inv).to(torch.int8)  # |x * id| <= 127.0000x: no overflow
    # [B, 34]
    packed = torch.cat([d.to(torch.float16).view(torch.uint8), q.view(torch.uint8)], dim=1)
    k = w.shape[-1]
    return QuantWeight(
        packed.reshape(*w.shape[:-1], QTYPES[qtype].row_bytes(k)), tuple(w.shape), qtype
    )


def dequantize(w: QuantWeight, dtype: torch.dtype) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.dequantize`: ``[..., N, K]`` values of ``w`` (one of
    Q8_0, Q4_K, Q5_K, Q6_K) in fp32, then cast to ``dtype``."""
    qt = QTYPES[w.qtype]
    blocks = w.data.reshape(-1, qt.nbytes)  # [B, nbytes]
    values = _DEQUANT[w.qtype](blocks)  # [B, block]
    return values.reshape(w.shape).to(dtype)

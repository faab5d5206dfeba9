"""Packing float weights into GGUF Q4_K and Q6_K blocks, for benchmark models of random weights
(``benchmarks/write_random_qwen3moe.py --type Q4_K_M``).

This is a simple, approximate packer, not llama.cpp's quantizer: every scale comes from the
sub-block's minimum and maximum, with no search for the scales of least error (llama.cpp's
``quantize_row_q4_K_ref`` and ``quantize_row_q6_K_ref`` define the real ones, and reach a smaller
error). The bytes are exactly GGUF's ``block_q4_K`` / ``block_q6_K`` (layouts in
:mod:`ftlab.reference.quants`), so llama.cpp, gguf-py and ftlab decode them alike; the values
are within the bounds below of the input.

Q4_K, per super-block of 256 and sub-block j of 32 (``x`` its values):
    ``lo_j = min(0, min x)``, ``scale_j = (max x - lo_j) / 15``; ``d = max_j scale_j / 63`` and
    ``dmin = max_j (-lo_j) / 63``, each rounded up to an fp16 (so that no sc_j or m_j passes 63);
    ``sc_j = ceil(scale_j / d)`` and ``m_j = round(-lo_j / dmin)`` (0..63);
    ``q = round((x + dmin * m_j) / (d * sc_j))`` clamped to 0..15.
    Since ``d * sc_j >= scale_j``, the 16 levels span the sub-block's range but for the rounding
    of ``m_j``: ``|x - x_hat| <= max(d * sc_j, dmin) / 2`` (up to fp32 rounding), with
    ``d * sc_j <= scale_j + d``.
Q6_K, per super-block of 256 and sub-block j of 16:
    ``scale_j = max |x| / 31``; ``d = max_j scale_j / 127`` rounded up to an fp16;
    ``sc_j = ceil(scale_j / d)`` (int8, 0..127); ``q = round(x / (d * sc_j))`` (-31..31), stored
    as ``q + 32``. ``|x - x_hat| <= d * sc_j / 2 <= (scale_j + d) / 2`` (up to fp32 rounding).
Scales are computed with the fp16 ``d`` / ``dmin`` the block stores, and the products
``d * sc_j``, ``dmin * m_j`` in fp32 as the dequantizers compute them. A zero scale (a sub-block
of zeros) stores q = 0.
"""

from __future__ import annotations

import torch

from ftlab import argcheck
from ftlab.quant import QTYPES, QuantWeight

QK_K = 256  # weights per K-quant super-block
CHUNK = 1 << 16  # super-blocks packed at a time (16 Mi weights): bounds the temporaries


def _check(w: object, qtype: str) -> torch.Tensor:
    argcheck.float_tensor("w", w)
    if w.dim() < 2 or w.shape[-1] % QK_K:
        raise ValueError(
            f"w must be [..., N, K] with K a multiple of {QK_K} for {qtype}, got shape "
            f"{tuple(w.shape)}"
        )
    if w.numel():
        bad = ~torch.isfinite(w)
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(f"w must be finite for {qtype}, got {float(w[where])} at {where}")
    return w


def _div(a: torch.Tensor, c: float) -> torch.Tensor:
    """``a / c`` as an IEEE division on every device (torch on CUDA turns a division by a Python
    scalar into a multiply by its reciprocal), so CPU and GPU pack the same bytes."""
    return a / torch.full_like(a, c)


def _fp16_at_least(v: torch.Tensor, qtype: str, what: str) -> torch.Tensor:
    """The smallest fp16 >= ``v`` (fp32, >= 0), as fp16; ValueError when it is not finite."""
    h = v.to(torch.float16)
    below = h.float() < v
    h = torch.where(below, (h.view(torch.int16) + 1).view(torch.float16), h)  # next fp16 up
    if not bool(torch.isfinite(h).all()):
        raise ValueError(
            f"w must fit {qtype}'s fp16 block scales ({what} at most 65504), got values "
            f"needing {what} = {float(v.max()):.4g}"
        )
    return h


def _pack(w: torch.Tensor, qtype: str, fn) -> QuantWeight:
    qt = QTYPES[qtype]
    x = w.reshape(-1, QK_K)  # [B, 256]
    out = torch.empty(x.shape[0], qt.nbytes, dtype=torch.uint8, device=w.device)
    for start in range(0, x.shape[0], CHUNK):
        out[start : start + CHUNK] = fn(x[start : start + CHUNK].float())
    data = out.view(*w.shape[:-1], qt.row_bytes(w.shape[-1]))
    return QuantWeight(data, tuple(w.shape), qtype)


def _q4_k_blocks(x: torch.Tensor) -> torch.Tensor:  # [B, 256] fp32 -> [B, 144] uint8
    b = x.shape[0]
    sub = x.view(b, 8, 32)
    lo = sub.amin(-1).clamp(max=0.0)  # [B, 8]
    scale = _div(sub.amax(-1) - lo, 15.0)
    mins = -lo
    d = _fp16_at_least(_div(scale.amax(-1), 63.0), "Q4_K", "d")  # [B]
    dmin = _fp16_at_least(_div(mins.amax(-1), 63.0), "Q4_K", "dmin")
    d32, dmin32 = d.float()[:, None], dmin.float()[:, None]
    sc = torch.where(d32 > 0, torch.ceil(scale / torch.where(d32 > 0, d32, 1.0)), 0.0).clamp(0, 63)
    m = torch.where(
        dmin32 > 0, torch.round(mins / torch.where(dmin32 > 0, dmin32, 1.0)), 0.0
    ).clamp(0, 63)
    step = (d32 * sc)[..., None]  # [B, 8, 1], the fp32 products the dequantizer forms
    shift = (dmin32 * m)[..., None]
    q = torch.where(step > 0, torch.round((sub + shift) / torch.where(step > 0, step, 1.0)), 0.0)
    q = q.clamp(0, 15).to(torch.uint8)  # [B, 8, 32]
    sc, m = sc.to(torch.uint8), m.to(torch.uint8)
    # llama.cpp's get_scale_min_k4, inverted: j < 4 in the low six bits of bytes j, j + 4; j >= 4
    # in the nibbles of byte j + 4 and the top two bits of bytes j - 4, j
    scales = torch.cat(
        [
            sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
            m[:, :4] | ((m[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4),
        ],
        dim=1,
    )
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(b, 128)  # pair p: low nibbles 2p, high 2p + 1
    return torch.cat(
        [d.view(torch.uint8).view(b, 2), dmin.view(torch.uint8).view(b, 2), scales, qs], dim=1
    )


def _q6_k_blocks(x: torch.Tensor) -> torch.Tensor:  # [B, 256] fp32 -> [B, 210] uint8
    b = x.shape[0]
    sub = x.view(b, 16, 16)
    scale = _div(sub.abs().amax(-1), 31.0)  # [B, 16]
    d = _fp16_at_least(_div(scale.amax(-1), 127.0), "Q6_K", "d")  # [B]
    d32 = d.float()[:, None]
    sc = torch.where(d32 > 0, torch.ceil(scale / torch.where(d32 > 0, d32, 1.0)), 0.0).clamp(0, 127)
    step = (d32 * sc)[..., None]  # [B, 16, 1]
    q = torch.where(step > 0, torch.round(sub / torch.where(step > 0, step, 1.0)), 0.0)
    u = (q.clamp(-32, 31) + 32).to(torch.uint8).view(b, 2, 4, 32)  # [B, half, quarter, 32]
    # quarters 0..3 of a half: ql's low nibbles of bytes 0..31, of 32..63, the high nibbles of
    # 0..31, of 32..63; qh's bits 0-1, 2-3, 4-5, 6-7 of bytes 0..31
    ql = (u[:, :, 0:2] & 0x0F) | ((u[:, :, 2:4] & 0x0F) << 4)  # [B, half, 2, 32]
    qh = (
        (u[:, :, 0] >> 4)
        | ((u[:, :, 1] >> 4) << 2)
        | ((u[:, :, 2] >> 4) << 4)
        | ((u[:, :, 3] >> 4) << 6)
    )
    scales = sc.to(torch.int8).view(torch.uint8)
    return torch.cat(
        [ql.reshape(b, 128), qh.reshape(b, 64), scales, d.view(torch.uint8).view(b, 2)], dim=1
    )


def pack_q4_k(w: torch.Tensor) -> QuantWeight:
    """``w`` (fp32 / fp16 / bf16 ``[..., N, K]``, K a multiple of 256, finite; any device) as GGUF
    Q4_K blocks: a :class:`~ftlab.quant.QuantWeight` of qtype "Q4_K", data uint8
    ``[..., N, K/256*144]`` on ``w``'s device. Min/max scales, no error search (module
    docstring: the scheme and its error bound). TypeError for a non-float ``w``, ValueError for
    another shape, a non-finite value, or values too large for fp16 block scales."""
    return _pack(_check(w, "Q4_K"), "Q4_K", _q4_k_blocks)


def pack_q6_k(w: torch.Tensor) -> QuantWeight:
    """``w`` (fp32 / fp16 / bf16 ``[..., N, K]``, K a multiple of 256, finite; any device) as GGUF
    Q6_K blocks: a :class:`~ftlab.quant.QuantWeight` of qtype "Q6_K", data uint8
    ``[..., N, K/256*210]`` on ``w``'s device. Max-abs scales, no error search (module
    docstring). Errors as :func:`pack_q4_k`."""
    return _pack(_check(w, "Q6_K"), "Q6_K", _q6_k_blocks)


#: the packers by GGUF type name
PACKERS = {"Q4_K": pack_q4_k, "Q6_K": pack_q6_k}

"""Matmul on GGUF Q8_0 and the K-quants (Q4_K, Q5_K, Q6_K), the readable way (docs/OPS.md
section 11). The oracle of the kernels.

path "int8": x is quantized to Q8_1 (32-blocks: ``q8`` int8, ``d8``, ``s8 = d8 * sum(q8)``;
:func:`ftlab.reference.q4_0.quantize_q8_1`) and every weight sub-block meets the Q8_1 block it
lies in through an exact integer dot ``sumi``, as llama.cpp's ``vec_dot_*_q8_1`` does. The
terms, each evaluated in fp32 in this order, are then summed:

    Q8_0, per 32-block:      d * (d8 * sumi)
    Q4_K / Q5_K, per 32-sub-block j (q 0..15 / 0..31):
                             d * (d8 * (sc[j] * sumi)) - dmin * (m[j] * s8)
    Q6_K, per 16-sub-block j (q - 32 in -32..31; two of them per Q8_1 block):
                             d * (d8 * (scales[j] * sumi))

``sc * sumi`` is an exact integer below 2^24 for every type, so every backend computes the same
integers; only the fp32 products and the order of the sum differ (bound:
``ftlab.testing.quant_matmul_tolerance``).

path "dequant": ``x.float() @ dequantize(W).T`` in fp32.
"""

from __future__ import annotations

import torch

from ftlab import argcheck
from ftlab.quant import Q8_1, QTYPES, QuantWeight
from ftlab.reference.q4_0 import quantize_q8_1
from ftlab.reference.quants import dequantize, scale_min_k4


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float().squeeze(-1)


def unpack_ints(w: QuantWeight) -> dict[str, torch.Tensor]:
    """The integer weights and the scale fields of a 2-D ``w [N, K]``, per sub-block, in K order:

    ``q`` int32 ``[N, S, L]`` (S sub-blocks of L = 32, or 16 for Q6_K: Q8_0 int8 values, Q4_K
    0..15, Q5_K 0..31, Q6_K ``q - 32``); ``d`` fp32 ``[N, S]`` (the block's fp16 ``d``, repeated
    over its sub-blocks); ``sc`` fp32 ``[N, S]`` (integer sub-block scales; 1 for Q8_0); and for
    Q4_K / Q5_K ``dmin`` and ``m`` ``[N, S]``."""
    qt = QTYPES[w.qtype]
    n, k = w.shape
    b = w.data.view(n, k // qt.block, qt.nbytes)
    nb = k // qt.block
    if w.qtype == "Q8_0":
        q = b[..., 2:].contiguous().view(torch.int8).int()
        return {"q": q, "d": _f16(b[..., :2]), "sc": torch.ones(n, nb, device=w.device)}
    if w.qtype in ("Q4_K", "Q5_K"):
        fifth = w.qtype == "Q5_K"
        sc, mn = scale_min_k4(b[..., 4:16])  # [N, nb, 8]
        pairs = (b[..., 48:] if fifth else b[..., 16:]).reshape(n, nb, 4, 32).int()
        q = torch.stack([pairs & 0x0F, pairs >> 4], dim=-2).reshape(n, nb, 8, 32)
        if fifth:
            qh = b[..., 16:48].int()
            q = q | (torch.stack([(qh >> j) & 1 for j in range(8)], dim=-2) << 4)
        rep = {"d": _f16(b[..., 0:2]), "dmin": _f16(b[..., 2:4])}
        out = {key: v[..., None].expand(n, nb, 8).reshape(n, nb * 8) for key, v in rep.items()}
        return {
            "q": q.reshape(n, nb * 8, 32),
            "sc": sc.reshape(n, nb * 8),
            "m": mn.reshape(n, nb * 8),
            **out,
        }
    ql = b[..., 0:128].reshape(n, nb, 2, 2, 32).int()
    qh = b[..., 128:192].reshape(n, nb, 2, 32).int()
    low = torch.stack(
        [ql[..., 0, :] & 0x0F, ql[..., 1, :] & 0x0F, ql[..., 0, :] >> 4, ql[..., 1, :] >> 4], dim=-2
    )
    high = torch.stack([(qh >> s) & 0x03 for s in (0, 2, 4, 6)], dim=-2)
    q = ((low | (high << 4)) - 32).reshape(n, nb * 16, 16)
    scales = b[..., 192:208].contiguous().view(torch.int8).float().reshape(n, nb * 16)
    d = _f16(b[..., 208:210])[..., None].expand(n, nb, 16).reshape(n, nb * 16)
    return {"q": q, "d": d, "sc": scales}


def block_terms(x8: Q8_1, w: QuantWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sub-block's term (module docstring) and the magnitude of its parts
    (``|d * d8 * sc * sumi| + |dmin * m * s8|``, the latter in f64): ``[M, N, S]`` each."""
    f = unpack_ints(w)
    q = f["q"]
    n, s, length = q.shape
    m = x8.q.shape[0]
    q8 = x8.q.view(m, s, length).double()
    sumi = torch.einsum("msl,nsl->mns", q8, q.double()).float()  # exact: |sumi| < 2^17
    per = 32 // length  # weight sub-blocks per Q8_1 block
    d8 = x8.d.repeat_interleave(per, dim=1)[:, None, :]  # [M, 1, S]
    scaled = d8 * (f["sc"][None] * sumi)  # sc * sumi exact (< 2^24)
    term = f["d"][None] * scaled
    parts = (f["d"][None].double() * scaled.double()).abs()
    if "dmin" in f:
        s8 = x8.s.repeat_interleave(per, dim=1)[:, None, :]
        shift = f["dmin"][None] * (f["m"][None] * s8)
        term = term - shift
        parts = parts + (f["dmin"][None].double() * f["m"][None].double() * s8.double()).abs()
    return term, parts


def quant_matmul(x: torch.Tensor, w: QuantWeight, path: str = "int8") -> torch.Tensor:
    """``x [M, K] @ W.T -> [M, N]`` in x's dtype for ``w`` Q8_0 / Q4_K / Q5_K / Q6_K ``[N, K]``."""
    argcheck.matmul_layout(x, w)
    if path == "int8":
        return block_terms(quantize_q8_1(x), w)[0].sum(-1).to(x.dtype)
    if path == "dequant":
        return (x.float() @ dequantize(w, torch.float32).T).to(x.dtype)
    raise ValueError(f"path must be 'int8' or 'dequant', got {path!r}")

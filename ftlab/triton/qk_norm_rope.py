"""qk_norm_rope in Triton (reference: ftlab/reference/qk_norm_rope.py).

One program per (token, head) row of q and k together: the row and its rotation partner
(element ``(d + R/2) % R`` of the R = rotary_dim rotated ones, loaded a second time rather
than permuted in registers; the D - R dims past them pass through normed) are
normalized in fp32 with the row's mean square, scaled by the weight, rotated with the token's
cos / signed sin, and rounded once to the output dtype. Decode runs this as one launch where
the torch form takes a dozen.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def qk_norm_rope_kernel(q_ptr, q_row, k_ptr, k_row, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
                        eps, HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                        ROT: tl.constexpr):  # fmt: skip
    n = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    mask = d < D
    rotated = d < ROT
    partner = tl.where(rotated, (d + ROT // 2) % ROT, d)
    is_q = h < HQ
    if is_q:
        src = q_ptr + n * q_row + h * D
        w_ptr = qw_ptr
        dst = qo_ptr + (n * HQ + h) * D
    else:
        src = k_ptr + n * k_row + (h - HQ) * D
        w_ptr = kw_ptr
        dst = ko_ptr + (n * HK + h - HQ) * D
    x = tl.load(src + d, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(src + partner, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    y = x * r * tl.load(w_ptr + d, mask=mask, other=0.0).to(tl.float32)
    yp = xp * r * tl.load(w_ptr + partner, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + n * ROT + d, mask=mask & rotated, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + n * ROT + d, mask=mask & rotated, other=0.0).to(tl.float32)
    out = tl.where(rotated, y * c + yp * s, y)
    tl.store(dst + d, out.to(qo_ptr.dtype.element_ty), mask=mask)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, eps: float, rotary_dim: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Backend entry of :func:`ftlab.ops.qk_norm_rope` (ops checked the layouts; ``rotary_dim``
    None: all of D)."""
    n, hq, d = q.shape
    hk = k.shape[1]
    qo = torch.empty((n, hq, d), dtype=q.dtype, device=q.device)
    ko = torch.empty((n, hk, d), dtype=k.dtype, device=k.device)
    if n:
        qk_norm_rope_kernel[(n, hq + hk)](q, q.stride(0), k, k.stride(0), q_weight, k_weight, cos, sin, qo, ko,
                                         float(eps), HQ=hq, HK=hk, D=d, BLOCK_D=triton.next_power_of_2(d),
                                         ROT=d if rotary_dim is None else rotary_dim,
                                         num_warps=1 if d <= 256 else 4)  # fmt: skip
    return qo, ko


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check): Qwen3's
    head size 128 with 32 q and 4 kv heads, and Qwen3-Next's 256 with a rotary dim of 64 and 16 q
    and 2 kv heads, in each float dtype."""
    from ftlab.triton.compile_spec import spec

    names = ("q_ptr", "k_ptr", "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "qo_ptr", "ko_ptr")
    return [spec(qk_norm_rope_kernel, f"qk_norm_rope_kernel[{dt}, D {d}, rotary {rot}, {hq} + {hk} heads]",
                 types={**dict.fromkeys(names, f"*{dt}"), "eps": "fp32"},
                 constexprs={"HQ": hq, "HK": hk, "D": d, "BLOCK_D": d, "ROT": rot}, num_warps=1)
            for dt in ("fp32", "fp16", "bf16") for d, rot, hq, hk in ((128, 128, 32, 4), (256, 64, 16, 2))]  # fmt: skip

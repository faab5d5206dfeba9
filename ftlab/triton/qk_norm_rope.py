"""qk_norm_rope in Triton (reference: ftlab/reference/qk_norm_rope.py).

One program per (token, head) row of q and k together: the row and its rotation partner
(element ``(d + R/2) % R`` of the R = rotary_dim rotated ones, loaded a second time rather
than permuted in registers; the D - R dims past them pass through normed) are normalized in
fp32 with the row's mean square (``row_rms_factor``: a row whose squares overflow fp32 too),
scaled by the weight, rotated with the token's cos / signed sin, and rounded once to the output
dtype. Decode runs this as one launch where the torch form takes a dozen.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.triton.norm import row_rms_factor


@triton.jit
def _norm_rope_row(
    q_ptr,
    q_row,
    k_ptr,
    k_row,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    qo_ptr,
    ko_ptr,
    eps,
    n,
    h,
    kc_ptr,
    kc_row,
    slot,
    live,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROT: tl.constexpr,
    CACHE: tl.constexpr,
):
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
    r = row_rms_factor(x, D, eps)
    y = x * r * tl.load(w_ptr + d, mask=mask, other=0.0).to(tl.float32)
    yp = xp * r * tl.load(w_ptr + partner, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + n * ROT + d, mask=mask & rotated, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + n * ROT + d, mask=mask & rotated, other=0.0).to(tl.float32)
    out = tl.where(rotated, y * c + yp * s, y).to(qo_ptr.dtype.element_ty)
    tl.store(dst + d, out, mask=mask)
    if CACHE:  # a k row also goes to its slot of the cache (q rows: masked off)
        width = tl.where(live & (h >= HQ), D, 0)  # a scalar condition as a bound (the interpreter
        # masks by blocks only)
        tl.store(kc_ptr + slot * kc_row + (h - HQ) * D + d, out, mask=d < width)


@triton.jit
def qk_norm_rope_kernel(
    q_ptr,
    q_row,
    k_ptr,
    k_row,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    qo_ptr,
    ko_ptr,
    eps,
    kc_ptr,
    kc_row,
    vc_ptr,
    vc_row,
    slots_ptr,
    num_slots,
    v_ptr,
    v_row,
    VW,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROT: tl.constexpr,
    CACHE: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    if CACHE:  # rows h < HQ + HK as without a cache; row HQ + HK copies v[n] to its slot
        slot = tl.load(slots_ptr + n).to(tl.int64)
        live = (slot >= 0) & (slot < num_slots)
        if h == HQ + HK:
            j = tl.arange(0, BLOCK_V)
            vals = tl.load(v_ptr + n * v_row + j, mask=j < VW)
            tl.store(vc_ptr + slot * vc_row + j, vals, mask=j < tl.where(live, VW, 0))
        else:
            _norm_rope_row(
                q_ptr,
                q_row,
                k_ptr,
                k_row,
                qw_ptr,
                kw_ptr,
                cos_ptr,
                sin_ptr,
                qo_ptr,
                ko_ptr,
                eps,
                n,
                h,
                kc_ptr,
                kc_row,
                slot,
                live,
                HQ,
                HK,
                D,
                BLOCK_D,
                ROT,
                True,
            )
    else:
        _norm_rope_row(
            q_ptr,
            q_row,
            k_ptr,
            k_row,
            qw_ptr,
            kw_ptr,
            cos_ptr,
            sin_ptr,
            qo_ptr,
            ko_ptr,
            eps,
            n,
            h,
            kc_ptr,
            kc_row,
            0,
            False,
            HQ,
            HK,
            D,
            BLOCK_D,
            ROT,
            False,
        )


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    rotary_dim: int | None = None,
    *,
    cache: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.qk_norm_rope` (ops checked the layouts; ``rotary_dim``
    None: all of D; ``cache``: ``(k_cache, v_cache, slots, v [N, W])``, written by the same
    launch: one more program a token copies v)."""
    n, hq, d = q.shape
    hk = k.shape[1]
    qo = torch.empty((n, hq, d), dtype=q.dtype, device=q.device)
    ko = torch.empty((n, hk, d), dtype=k.dtype, device=k.device)
    if n:
        if cache is None:
            kc, kc_row, vc, vc_row, slots, num_slots, v, v_row, vw = qo, 0, qo, 0, qo, 0, qo, 0, 1
        else:
            kc, vc, slots, v = cache
            kc_row, vc_row, num_slots, v_row, vw = (
                kc.stride(0),
                vc.stride(0),
                kc.shape[0],
                v.stride(0),
                v.shape[1],
            )
        qk_norm_rope_kernel[(n, hq + hk + (cache is not None))](
            q,
            q.stride(0),
            k,
            k.stride(0),
            q_weight,
            k_weight,
            cos,
            sin,
            qo,
            ko,
            float(eps),
            kc,
            kc_row,
            vc,
            vc_row,
            slots,
            num_slots,
            v,
            v_row,
            vw,
            HQ=hq,
            HK=hk,
            D=d,
            BLOCK_D=triton.next_power_of_2(d),
            ROT=d if rotary_dim is None else rotary_dim,
            CACHE=cache is not None,
            BLOCK_V=triton.next_power_of_2(vw),
            num_warps=1 if d <= 256 else 4,
        )
    return qo, ko


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check): Qwen3's
    head size 128 with 32 q and 4 kv heads, and Qwen3-Next's 256 with a rotary dim of 64 and 16 q
    and 2 kv heads, in each float dtype; and Qwen3's writing its KV cache (int64 slots, v rows of
    4 x 128)."""
    from ftlab.triton.compile_spec import spec

    names = (
        "q_ptr",
        "k_ptr",
        "qw_ptr",
        "kw_ptr",
        "cos_ptr",
        "sin_ptr",
        "qo_ptr",
        "ko_ptr",
        "kc_ptr",
        "vc_ptr",
        "v_ptr",
    )
    specs = [
        spec(
            qk_norm_rope_kernel,
            f"qk_norm_rope_kernel[{dt}, D {d}, rotary {rot}, {hq} + {hk} heads]",
            types={**dict.fromkeys(names, f"*{dt}"), "slots_ptr": f"*{dt}", "eps": "fp32"},
            constexprs={
                "HQ": hq,
                "HK": hk,
                "D": d,
                "BLOCK_D": d,
                "ROT": rot,
                "CACHE": False,
                "BLOCK_V": 1,
            },
            num_warps=1,
        )
        for dt in ("fp32", "fp16", "bf16")
        for d, rot, hq, hk in ((128, 128, 32, 4), (256, 64, 16, 2))
    ]
    specs += [
        spec(
            qk_norm_rope_kernel,
            f"qk_norm_rope_kernel[{dt}, D 128, 32 + 4 heads, KV cache written]",
            types={
                **dict.fromkeys(names, f"*{dt}"),
                "slots_ptr": "*i64",
                "eps": "fp32",
                "kc_row": "i64",
                "vc_row": "i64",
                "num_slots": "i64",
            },
            constexprs={
                "HQ": 32,
                "HK": 4,
                "D": 128,
                "BLOCK_D": 128,
                "ROT": 128,
                "CACHE": True,
                "BLOCK_V": 512,
            },
            num_warps=1,
        )
        for dt in ("fp32", "fp16", "bf16")
    ]
    return specs

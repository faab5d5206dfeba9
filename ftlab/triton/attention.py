"""attention in Triton (reference: ftlab/reference/attention.py).

``decode_attention``: split-K over the cached positions (flash-decoding). One program per
(split of positions, key head, sequence) holds the ``G = H / KVH`` query heads that read its key
head, walks its split's live positions ``BLOCK_N`` at a time with an online softmax in fp32 (the
running max ``m``, the sum ``l`` of ``exp(s - m)`` and the unnormalized weighted values), and
writes ``m``, ``l`` and the sums; a second kernel, one program per (sequence, query head), merges
the splits. With one split the first kernel writes the output itself. A split past a sequence's
length does no work (``m = -inf``, ``l = 0``), so the grid is fixed by the cache's size alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab import argcheck
from ftlab.reference.attention import split_plan


@triton.jit
def decode_attention_partial_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    len_ptr,
    ml_ptr,
    acc_ptr,
    out_ptr,
    k_sb,
    k_sp,
    v_sb,
    v_sp,
    S,
    CHUNK,
    scale,
    H: tl.constexpr,
    KVH: tl.constexpr,
    D: tl.constexpr,
    G: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    sp = tl.program_id(0)
    kh = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(len_ptr + b).to(tl.int32), 0), S)
    g = tl.arange(0, BLOCK_G)
    dd = tl.arange(0, BLOCK_D)
    gd_mask = (g < G)[:, None] & (dd < D)[None, :]
    q = tl.load(
        q_ptr + (b * H + kh * G + g[:, None]) * D + dd[None, :], mask=gd_mask, other=0.0
    ).to(tl.float32)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    start = sp * CHUNK
    stop = tl.minimum(start + CHUNK, n)
    for t0 in range(start, stop, BLOCK_N):
        pos = t0 + tl.arange(0, BLOCK_N)
        pd_mask = (pos < stop)[:, None] & (dd < D)[None, :]
        kk = tl.load(
            k_ptr + b * k_sb + pos[:, None].to(tl.int64) * k_sp + kh * D + dd[None, :],
            mask=pd_mask,
            other=0.0,
        ).to(tl.float32)
        s = tl.sum(q[:, None, :] * kk[None, :, :], axis=2) * scale  # [BLOCK_G, BLOCK_N]
        s = tl.where((pos < stop)[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: the tile holds a live position
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, axis=1)
        vv = tl.load(
            v_ptr + b * v_sb + pos[:, None].to(tl.int64) * v_sp + kh * D + dd[None, :],
            mask=pd_mask,
            other=0.0,
        ).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * vv[None, :, :], axis=1)
        m = m_new
    if SPLITS == 1:
        # 0: no position
        o = tl.where(lsum[:, None] != 0, acc / tl.where(lsum != 0, lsum, 1.0)[:, None], 0.0)
        tl.store(
            out_ptr + (b * H + kh * G + g[:, None]) * D + dd[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=gd_mask,
        )
    else:
        row = ((b * KVH + kh) * SPLITS + sp) * G + g  # [BLOCK_G]
        tl.store(ml_ptr + 2 * row, m, mask=g < G)
        tl.store(ml_ptr + 2 * row + 1, lsum, mask=g < G)
        tl.store(acc_ptr + row[:, None] * D + dd[None, :], acc, mask=gd_mask)


@triton.jit
def decode_attention_combine_kernel(
    ml_ptr,
    acc_ptr,
    out_ptr,
    H: tl.constexpr,
    KVH: tl.constexpr,
    D: tl.constexpr,
    G: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kh = h // G
    sp = tl.arange(0, BLOCK_S)
    dd = tl.arange(0, BLOCK_D)
    row0 = (b * KVH + kh) * SPLITS * G + h % G  # split s: row0 + s * G
    m = tl.load(ml_ptr + 2 * (row0 + sp * G), mask=sp < SPLITS, other=float("-inf"))
    lsum = tl.load(ml_ptr + 2 * (row0 + sp * G) + 1, mask=sp < SPLITS, other=0.0)
    m_max = tl.max(tl.where(lsum != 0, m, -3.0e38), axis=0)  # a split without positions weighs 0
    total = tl.sum(
        tl.where(lsum != 0, tl.exp(tl.where(lsum != 0, m, m_max) - m_max), 0.0) * lsum, axis=0
    )
    o = tl.zeros([BLOCK_D], tl.float32)
    for s in range(SPLITS):  # one split's row at a time: no [splits, D] tile in registers
        row = row0 + s * G
        ls = tl.load(ml_ptr + 2 * row + 1)
        w = tl.where(
            ls != 0, tl.exp(tl.where(ls != 0, tl.load(ml_ptr + 2 * row), m_max) - m_max), 0.0
        )
        o += w * tl.load(acc_ptr + row * D + dd, mask=dd < D, other=0.0)
    o = o / tl.where(total != 0, total, 1.0)
    tl.store(out_ptr + (b * H + h) * D + dd, o.to(out_ptr.dtype.element_ty), mask=dd < D)


def _block_n(block_g: int, block_d: int) -> int:
    """Positions a step of the partial kernel: the [BLOCK_G, BLOCK_N, BLOCK_D] products it holds at
    once kept to 4096 fp32 a program (8192 spilled on RDNA)."""
    return max(1, min(32, 4096 // (block_g * block_d)))


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.decode_attention` (layouts checked here too: the op's
    checks may be off)."""
    argcheck.decode_attention_layout(q, k, v, lengths)
    b, h, d = q.shape
    s, kvh = k.shape[1], k.shape[2]
    out = torch.empty((b, h, d), dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    if s == 0:
        return out.zero_()
    g = h // kvh
    chunk, splits = split_plan(s)
    block_g, block_d = triton.next_power_of_2(g), triton.next_power_of_2(d)
    block_n = _block_n(block_g, block_d)
    ml = torch.empty(
        (b, kvh, splits, g, 2) if splits > 1 else (1,), dtype=torch.float32, device=q.device
    )
    acc = torch.empty(
        (b, kvh, splits, g, d) if splits > 1 else (1,), dtype=torch.float32, device=q.device
    )
    decode_attention_partial_kernel[(splits, kvh, b)](
        q,
        k,
        v,
        lengths,
        ml,
        acc,
        out,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        s,
        chunk,
        float(scale),
        H=h,
        KVH=kvh,
        D=d,
        G=g,
        SPLITS=splits,
        BLOCK_G=block_g,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        num_warps=4,
    )
    if splits > 1:
        decode_attention_combine_kernel[(b, h)](
            ml,
            acc,
            out,
            H=h,
            KVH=kvh,
            D=d,
            G=g,
            SPLITS=splits,
            BLOCK_S=triton.next_power_of_2(splits),
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check): a decode
    step of Qwen3-30B-A3B (32 query heads over 4 key heads of 128) in each float dtype and of
    Qwen3.6 / Qwen3-Next (16 over 2 of 256) in bf16, over a 4096-position cache; the merge in
    bf16 and fp32."""
    from ftlab.triton.compile_spec import spec

    specs = []
    chunk, splits = split_plan(4096)
    for dt, h, kvh, d in (
        ("fp32", 32, 4, 128),
        ("fp16", 32, 4, 128),
        ("bf16", 32, 4, 128),
        ("bf16", 16, 2, 256),
    ):
        g = h // kvh
        specs.append(
            spec(
                decode_attention_partial_kernel,
                f"decode_attention_partial_kernel[{dt}, {h}/{kvh} heads of {d}, 4096 positions]",
                types={
                    "q_ptr": f"*{dt}",
                    "k_ptr": f"*{dt}",
                    "v_ptr": f"*{dt}",
                    "len_ptr": "*i64",
                    "ml_ptr": "*fp32",
                    "acc_ptr": "*fp32",
                    "out_ptr": f"*{dt}",
                    "k_sb": "i64",
                    "k_sp": "i64",
                    "v_sb": "i64",
                    "v_sp": "i64",
                    "S": "i32",
                    "CHUNK": "i32",
                    "scale": "fp32",
                },
                constexprs={
                    "H": h,
                    "KVH": kvh,
                    "D": d,
                    "G": g,
                    "SPLITS": splits,
                    "BLOCK_G": g,
                    "BLOCK_D": d,
                    "BLOCK_N": _block_n(triton.next_power_of_2(g), d),
                },
                num_warps=4,
            )
        )
    for dt in ("fp32", "bf16"):
        specs.append(
            spec(
                decode_attention_combine_kernel,
                f"decode_attention_combine_kernel[{dt}, 32/4 heads of 128, {splits} splits]",
                types={"ml_ptr": "*fp32", "acc_ptr": "*fp32", "out_ptr": f"*{dt}"},
                constexprs={
                    "H": 32,
                    "KVH": 4,
                    "D": 128,
                    "G": 8,
                    "SPLITS": splits,
                    "BLOCK_S": triton.next_power_of_2(splits),
                    "BLOCK_D": 128,
                },
                num_warps=4,
            )
        )
    return specs

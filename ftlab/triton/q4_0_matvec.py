"""The int8-dot Q4_0 matvecs in Triton (decode: up to ``MATVEC_ROWS`` rows of Q8_1
activations; docs/OPS.md section 2; reference: ``ftlab/reference/q4_0.py``), used by
``q4_0_matmul``'s int8 path (``ftlab/triton/q4_0.py``).

- ``q4_0_mv_kernel``: the weight tile read as 16-bit words, split-K over programs (every target).
- ``q4_0_mv4_kernel``: a block's dot as eight dp4a of 32-bit words (rows of an even number of
  blocks; targets whose launch table has an ``mv4`` entry), with a persistent hoisted variant
  for one row whose K fits one tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.quant import Q8_1, QK, Q4_0Weight
from ftlab.triton.q4_0_common import (
    CONFIGS,
    add_row,
    block_sums,
    config,
    interpreted,
    launch_table,
    load_blocks,
    load_x_words,
    sm_count,
    split_k,
    split_tile,
    store_split,
    sum_splits,
)

#: rows one matvec pass takes (MP, a power of two up to 8: the compile-checked configurations);
#: q4_0_matmul's int8 path runs more rows pass by pass
MATVEC_ROWS = 8


@triton.jit
def q4_0_mv_kernel(
    w16_ptr,
    row_words,
    q8_ptr,
    d8_ptr,
    s8_ptr,
    part_ptr,
    M,
    N,
    K,
    NBK,
    KB_PER_SPLIT,
    MP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_KB: tl.constexpr,
):
    """partial[split, m, n] = sum over this split's blocks of d4 * (d8 * sumi - 8 * s8).

    The weight tile is read as 16-bit words ``[BLOCK_N, BLOCK_KB, 8]`` (the 16 ``qs`` bytes
    of each block; the ``d`` word is read apart), so neighbouring lanes read neighbouring
    words and a warp's loads stay contiguous within a row.
    """
    split, n, n_ok, kb_lo, kb_hi = split_tile(N, NBK, KB_PER_SPLIT, BLOCK_N)
    i = tl.arange(0, 8)
    acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
    row = n.to(tl.int64) * row_words
    for kb0 in range(kb_lo, kb_hi, BLOCK_KB):
        kb = kb0 + tl.arange(0, BLOCK_KB)
        kb_ok = kb < kb_hi
        wmask = n_ok[:, None, None] & kb_ok[None, :, None]
        w = tl.load(
            w16_ptr + row[:, None, None] + kb[None, :, None] * 9 + 1 + i[None, None, :],
            mask=wmask,
            other=0,
        )
        w = w.to(tl.int32) & 0xFFFF  # bytes 2i (low) and 2i+1 (high) of qs
        e0 = w & 15  # element 2i
        e1 = (w >> 8) & 15  # element 2i + 1
        e16 = (w >> 4) & 15  # element 2i + 16
        e17 = (w >> 12) & 15  # element 2i + 17
        dm = n_ok[:, None] & kb_ok[None, :]
        d4 = tl.load(w16_ptr + row[:, None] + kb[None, :] * 9, mask=dm, other=0)
        d4 = d4.to(tl.float16, bitcast=True).to(tl.float32)  # [BN, KB]
        for m in tl.static_range(MP):
            if m < M:
                xb = q8_ptr + m * K + kb[:, None] * 32 + 2 * i[None, :]  # [KB, 8]
                xm = kb_ok[:, None]
                x0 = tl.load(xb, mask=xm, other=0).to(tl.int32)
                x1 = tl.load(xb + 1, mask=xm, other=0).to(tl.int32)
                x16 = tl.load(xb + 16, mask=xm, other=0).to(tl.int32)
                x17 = tl.load(xb + 17, mask=xm, other=0).to(tl.int32)
                prod = e0 * x0[None] + e1 * x1[None] + e16 * x16[None] + e17 * x17[None]
                sumi = tl.sum(prod, axis=2)  # [BN, KB], exact
                d8 = tl.load(d8_ptr + m * NBK + kb, mask=kb_ok, other=0.0)
                s8 = tl.load(s8_ptr + m * NBK + kb, mask=kb_ok, other=0.0)
                part = tl.sum(d4 * (d8[None, :] * sumi.to(tl.float32) - 8.0 * s8[None, :]), axis=1)
                acc = add_row(acc, part, m, MP)
    store_split(part_ptr, acc, split, n, n_ok, M, N, MP)


@triton.jit
def q4_0_mv4_kernel(
    w32_ptr,
    w16_ptr,
    row_words,
    q8w_ptr,
    d8_ptr,
    s8_ptr,
    part_ptr,
    M,
    N,
    K,
    NBK,
    KB_PER_SPLIT,
    MP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_KB: tl.constexpr,
    ASM: tl.constexpr,
    HOIST: tl.constexpr,
):
    """partial[split, m, n] as q4_0_mv_kernel computes it, a block's int8 dot taken as eight
    4-byte dots of 32-bit words (dp4a) over ``[BLOCK_N, BLOCK_KB]`` tiles of blocks.

    Rows hold an even number of blocks, so they are read as 32-bit words: block b's bytes
    start at word 9b/2 (its fp16 scale in the low half for even b, the high half for odd b);
    five word loads per block give its four qs words, nibbles masked as the HIP kernel does:
    (w & 0x0F0F0F0F) are elements 4i..4i+3, ((w >> 4) & 0x0F0F0F0F) elements 4i+16..4i+19.

    ``HOIST`` (M = 1, K in one tile): y[n] is written straight to ``part_ptr`` (of the output
    dtype) by a persistent grid that keeps the activations in registers.
    """
    pid_n = tl.program_id(0)
    if HOIST:
        # the activations are loaded once; the program walks row tiles pid_n, pid_n + programs..
        kb = tl.arange(0, BLOCK_KB)
        kb_ok = kb < NBK
        x0, x1, x2, x3, x4, x5, x6, x7 = load_x_words(q8w_ptr + kb * 8, kb_ok)
        x_d = tl.load(d8_ptr + kb, mask=kb_ok, other=0.0)[None, :]
        x_s = tl.load(s8_ptr + kb, mask=kb_ok, other=0.0)[None, :]
        for tile in range(pid_n, tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
            n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = n < N
            row32 = n.to(tl.int64) * row_words
            q0, q1, q2, q3, d4 = load_blocks(
                w32_ptr, w16_ptr, row32, kb, n_ok[:, None] & kb_ok[None, :]
            )
            sumi = block_sums(q0, q1, q2, q3, x0, x1, x2, x3, x4, x5, x6, x7, ASM)
            y = tl.sum(d4 * (x_d * sumi.to(tl.float32) - 8.0 * x_s), axis=1)
            tl.store(part_ptr + n, y.to(part_ptr.dtype.element_ty), mask=n_ok)
    else:
        split, n, n_ok, kb_lo, kb_hi = split_tile(N, NBK, KB_PER_SPLIT, BLOCK_N)
        acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
        row32 = n.to(tl.int64) * row_words
        for kb0 in range(kb_lo, kb_hi, BLOCK_KB):
            kb = kb0 + tl.arange(0, BLOCK_KB)
            kb_ok = kb < kb_hi
            q0, q1, q2, q3, d4 = load_blocks(
                w32_ptr, w16_ptr, row32, kb, n_ok[:, None] & kb_ok[None, :]
            )
            for m in tl.static_range(MP):
                if m < M:
                    x0, x1, x2, x3, x4, x5, x6, x7 = load_x_words(
                        q8w_ptr + m * (K // 4) + kb * 8, kb_ok
                    )
                    sumi = block_sums(q0, q1, q2, q3, x0, x1, x2, x3, x4, x5, x6, x7, ASM)
                    d8 = tl.load(d8_ptr + m * NBK + kb, mask=kb_ok, other=0.0)
                    s8 = tl.load(s8_ptr + m * NBK + kb, mask=kb_ok, other=0.0)
                    part = tl.sum(
                        d4 * (d8[None, :] * sumi.to(tl.float32) - 8.0 * s8[None, :]), axis=1
                    )
                    acc = add_row(acc, part, m, MP)
        store_split(part_ptr, acc, split, n, n_ok, M, N, MP)


def _use_mv4(w: Q4_0Weight) -> bool:
    """The dp4a matvec reads 32-bit words: rows of an even number of blocks, an aligned base,
    and a target whose table has an ``mv4`` entry."""
    return (
        (w.shape[-1] // QK) % 2 == 0
        and w.data.data_ptr() % 4 == 0
        and "mv4" in launch_table(w.device)
    )


def q4_0_matvec(x8: Q8_1, w: Q4_0Weight, out_dtype: torch.dtype) -> torch.Tensor:
    """int8-dot ``[M <= 8, K] x [N, K] -> [M, N]``; split-K when N alone would leave SMs idle."""
    m, k = x8.q.shape
    n = w.shape[0]
    nbk = k // QK
    dot = _use_mv4(w)
    cfg = config("mv4" if dot else "mv", w.device)
    programs_n = triton.cdiv(n, cfg["BLOCK_N"])
    splits, kb_per_split = split_k(nbk, cfg["BLOCK_KB"], programs_n, w.device)
    if dot and m == 1 and nbk <= cfg["BLOCK_KB"]:
        y = torch.empty((1, n), dtype=out_dtype, device=w.device)
        programs = min(programs_n, sm_count(w.device) * cfg["progs_per_sm"])
        q4_0_mv4_kernel[(programs, 1)](
            w.data.view(torch.int32),
            w.data.view(torch.int16),
            w.data.shape[-1] // 4,
            x8.q.view(torch.int32),
            x8.d,
            x8.s,
            y,
            m,
            n,
            k,
            nbk,
            nbk,
            MP=1,
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_KB=cfg["BLOCK_KB"],
            ASM=bool(cfg["asm"]) and not interpreted(),
            HOIST=True,
            num_warps=cfg["num_warps"],
        )
        return y
    parts = torch.empty((splits, m, n), dtype=torch.float32, device=w.device)
    if dot:
        q4_0_mv4_kernel[(programs_n, splits)](
            w.data.view(torch.int32),
            w.data.view(torch.int16),
            w.data.shape[-1] // 4,
            x8.q.view(torch.int32),
            x8.d,
            x8.s,
            parts,
            m,
            n,
            k,
            nbk,
            kb_per_split,
            MP=triton.next_power_of_2(m),
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_KB=cfg["BLOCK_KB"],
            ASM=bool(cfg["asm"]) and not interpreted(),
            HOIST=False,
            num_warps=cfg["num_warps"],
        )
    else:
        q4_0_mv_kernel[(programs_n, splits)](
            w.data.view(torch.int16),
            w.data.shape[-1] // 2,
            x8.q,
            x8.d,
            x8.s,
            parts,
            m,
            n,
            k,
            nbk,
            kb_per_split,
            MP=triton.next_power_of_2(m),
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_KB=cfg["BLOCK_KB"],
            num_warps=cfg["num_warps"],
        )
    return sum_splits(parts, out_dtype)


def matvec_specs(target: str) -> list:
    """The matvec configurations ftlab launches on ``target``, for ftlab.compile_check."""
    from ftlab.triton.compile_spec import spec

    cfg = CONFIGS.get(target, CONFIGS["default"])
    q8 = {"d8_ptr": "*fp32", "s8_ptr": "*fp32", "part_ptr": "*fp32"}
    specs = []
    mv = cfg["mv"]
    for mp in (1, 8):
        specs.append(
            spec(
                q4_0_mv_kernel,
                f"q4_0_mv_kernel[M<={mp}, {mv['BLOCK_N']}x{mv['BLOCK_KB']} blocks]",
                types={"w16_ptr": "*i16", "q8_ptr": "*i8", **q8},
                constexprs={"MP": mp, "BLOCK_N": mv["BLOCK_N"], "BLOCK_KB": mv["BLOCK_KB"]},
                num_warps=mv["num_warps"],
            )
        )
    if "mv4" in cfg:
        mv4 = cfg["mv4"]
        for mp, hoist in ((1, True), (1, False), (8, False)):
            tile = f"{mv4['BLOCK_N']}x{mv4['BLOCK_KB']} blocks"
            label = f"q4_0_mv4_kernel[M<={mp}{', hoisted' if hoist else ''}, {tile}]"
            specs.append(
                spec(
                    q4_0_mv4_kernel,
                    label,
                    types={"w32_ptr": "*i32", "w16_ptr": "*i16", "q8w_ptr": "*i32", **q8},
                    constexprs={
                        "MP": mp,
                        "BLOCK_N": mv4["BLOCK_N"],
                        "BLOCK_KB": mv4["BLOCK_KB"],
                        "ASM": bool(mv4["asm"]),
                        "HOIST": hoist,
                    },
                    num_warps=mv4["num_warps"],
                )
            )
    return specs

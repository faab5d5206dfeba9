"""The word-tiled int8-dot matvecs of Q8_0 and the K-quants in Triton (decode; docs/OPS.md
section 11; reference: ``ftlab/reference/quant_matmul.py``), the default of ``quant_matvec``
(``ftlab/triton/quant_matmul_mv.py``).

One kernel, ``kq_mvw_kernel``, for every type. A row is cut into units of 64 weights (Q4_K /
Q5_K: a sub-block pair; Q6_K: 16 weights of each quarter of a half; Q8_0: a block pair) and a
program takes a ``[BLOCK_N, BLOCK_U]`` tile of units, one unit an element: its sixteen weight
words, read as 32-bit words and unpacked in the element's own registers into dp4a-ready signed
bytes, meet the unit's sixteen activation words in one thread, so the only cross-lane sum is the
row sum at the end of a tile. The scales of a unit are decoded once per weight load, for all the
M rows of activations. Each unit's term is, with ``S_g`` the exact integer dot of group g:

- Q4_K / Q5_K: ``(d sc0) (d8_0 S_0) + (d sc1) (d8_1 S_1) - ((dmin m0) s8_0 + (dmin m1) s8_1)``;
- Q6_K: ``sum over the four quarters t of (d sc_t) (d8_t S_t)`` (q - 32 in the bytes);
- Q8_0: ``d_0 (d8_0 S_0) + d_1 (d8_1 S_1)``;

products of the reference's fp32 factors and integers, reassociated (the tolerance allows it).

``HOIST`` (one activation row, K in one tile): a persistent grid whose programs load the
activation words once, keep them in registers and walk row tiles, writing y straight out.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.triton.q4_0_common import add_row, dp4a, split_tile, store_split

#: per type: the tile of one-row calls (HOIST where K fits ``BLOCK_U`` units) and of 2..8 rows;
#: ``XT``: the activations gathered unit-major first (:func:`unit_major`; not for HOIST). From the
#: H200 sweep of 2026-12-01
#: (benchmarks/results/2026-12-01-nvidia-h200-sweep-triton-quant-matvec.txt):
#: one row best at 2 rows x 32 units, 2 warps, 16 programs an SM for every type and shape.
MVW_CONFIGS: dict[str, dict[str, dict[str, int]]] = {
    qt: {
        "m1": {"BLOCK_N": 2, "BLOCK_U": 32, "num_warps": 2, "progs_per_sm": 16},
        "m8": {"BLOCK_N": 8, "BLOCK_U": 32, "num_warps": 4, "XT": 1},
    }
    for qt in ("Q8_0", "Q4_K", "Q5_K", "Q6_K")
}
#: the types' kernel codes
QCODE = {"Q8_0": 0, "Q4_K": 1, "Q5_K": 2, "Q6_K": 3}


@triton.jit
def f16_bits(h):
    """fp32 of fp16 bit patterns held in the low 16 bits of int32 ``h``."""
    return (h & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _hi16(lo, hi):
    """The word starting at the upper halfword of ``lo`` (its continuation in ``hi``)."""
    return ((lo >> 16) & 0xFFFF) | (hi << 16)


@triton.jit
def _run(w32_ptr, h, mask, WORDS: tl.constexpr):
    """``WORDS`` words starting at halfword offsets ``h`` (int64, any parity): the words under
    them, and one more where ``h`` is odd."""
    p = w32_ptr + (h >> 1)
    odd = (h & 1) == 1
    w = ()
    for i in tl.static_range(WORDS):
        w = w + (tl.load(p + i, mask=mask, other=0),)
    w = w + (tl.load(p + WORDS, mask=mask & odd, other=0),)
    run = ()
    for i in tl.static_range(WORDS):
        run = run + (tl.where(odd, _hi16(w[i], w[i + 1]), w[i]),)
    return run


@triton.jit
def _sub32(q):
    """Bytes q - 32 of bytes q in 0..63 (no borrow between bytes; -0x7F7F7F80 is 0x80808080)."""
    return ((q | -0x7F7F7F80) - 0x20202020) ^ -0x7F7F7F80


@triton.jit
def _scale_min(s0, s1, s2, j):
    """6-bit scale and min of sub-blocks ``j`` (0..7) from Q4_K's scale words (bytes 4..15 of the
    block), as int32: j < 4 the low six bits of bytes j, j + 4; j >= 4 the nibbles of byte j + 4
    with the top bits of bytes j - 4, j."""
    k = 8 * (j & 3)
    lo = j < 4
    sc = tl.where(lo, (s0 >> k) & 63, ((s2 >> k) & 0x0F) | (((s0 >> (k + 6)) & 3) << 4))
    mn = tl.where(lo, (s1 >> k) & 63, ((s2 >> (k + 4)) & 0x0F) | (((s1 >> (k + 6)) & 3) << 4))
    return sc, mn


@triton.jit
def load_units(w32_ptr, row_bytes, n, u, mask, QTYPE: tl.constexpr):
    """The weights of units ``u`` ``[1, BU]`` of rows ``n`` ``[BN, 1]``: (sixteen dp4a-ready words,
    the four group factors C, the two min factors), each ``[BN, BU]``."""
    row = n.to(tl.int64) * (row_bytes // 4)
    zero = tl.zeros(mask.shape, dtype=tl.float32)
    if QTYPE == 0:
        p = w32_ptr + row + 17 * u
        w = (
            tl.load(p, mask=mask, other=0),
            tl.load(p + 1, mask=mask, other=0),
            tl.load(p + 2, mask=mask, other=0),
            tl.load(p + 3, mask=mask, other=0),
            tl.load(p + 4, mask=mask, other=0),
            tl.load(p + 5, mask=mask, other=0),
            tl.load(p + 6, mask=mask, other=0),
            tl.load(p + 7, mask=mask, other=0),
            tl.load(p + 8, mask=mask, other=0),
        )
        q = (
            _hi16(w[0], w[1]),
            _hi16(w[1], w[2]),
            _hi16(w[2], w[3]),
            _hi16(w[3], w[4]),
            _hi16(w[4], w[5]),
            _hi16(w[5], w[6]),
            _hi16(w[6], w[7]),
            _hi16(w[7], w[8]),
            tl.load(p + 9, mask=mask, other=0),
            tl.load(p + 10, mask=mask, other=0),
            tl.load(p + 11, mask=mask, other=0),
            tl.load(p + 12, mask=mask, other=0),
            tl.load(p + 13, mask=mask, other=0),
            tl.load(p + 14, mask=mask, other=0),
            tl.load(p + 15, mask=mask, other=0),
            tl.load(p + 16, mask=mask, other=0),
        )
        c = (f16_bits(w[0]), f16_bits(w[8] >> 16), zero, zero)
        return q, c, (zero, zero)
    elif QTYPE == 3:
        hh = (u // 2) % 2
        s = u % 2
        hb = n.to(tl.int64) * (row_bytes // 2) + 105 * (u // 4)  # the block's first halfword
        ql0 = _run(w32_ptr, hb + 32 * hh + 8 * s, mask, 4)  # quarters 0, 2
        ql1 = _run(w32_ptr, hb + 32 * hh + 16 + 8 * s, mask, 4)  # quarters 1, 3
        qh = _run(w32_ptr, hb + 64 + 16 * hh + 8 * s, mask, 4)
        sw0, sw1 = _run(w32_ptr, hb + 96 + 4 * hh, mask, 2)  # the half's eight scales
        dw = tl.load(w32_ptr + ((hb + 104) >> 1), mask=mask, other=0)
        d = f16_bits(tl.where((hb & 1) == 1, dw >> 16, dw))
        q = ()
        c = ()
        for t in tl.static_range(4):
            for i in tl.static_range(4):
                if t % 2 == 0:
                    nib = (ql0[i] >> (4 * (t // 2))) & 0x0F0F0F0F
                else:
                    nib = (ql1[i] >> (4 * (t // 2))) & 0x0F0F0F0F
                q = q + (_sub32(nib | (((qh[i] >> (2 * t)) & 0x03030303) << 4)),)
            if t < 2:
                sc = (sw0 << (24 - 8 * (2 * t + s))) >> 24
            else:
                sc = (sw1 << (24 - 8 * (2 * (t - 2) + s))) >> 24
            c = c + (d * sc.to(tl.float32),)
        return q, c, (zero, zero)
    else:
        NW: tl.constexpr = 44 if QTYPE == 2 else 36
        QSW: tl.constexpr = 12 if QTYPE == 2 else 4
        b = u // 4
        pr = u % 4
        p = w32_ptr + row + NW * b
        head = tl.load(p, mask=mask, other=0)
        s0 = tl.load(p + 1, mask=mask, other=0)
        s1 = tl.load(p + 2, mask=mask, other=0)
        s2 = tl.load(p + 3, mask=mask, other=0)
        sc0, mn0 = _scale_min(s0, s1, s2, 2 * pr)
        sc1, mn1 = _scale_min(s0, s1, s2, 2 * pr + 1)
        d = f16_bits(head)
        dmin = f16_bits(head >> 16)
        lo = ()
        hi = ()
        for i in tl.static_range(8):
            qs = tl.load(p + QSW + 8 * pr + i, mask=mask, other=0)
            ql = qs & 0x0F0F0F0F
            qu = (qs >> 4) & 0x0F0F0F0F
            if QTYPE == 2:
                qh = tl.load(p + 4 + i, mask=mask, other=0)
                ql = ql | (((qh >> (2 * pr)) & 0x01010101) << 4)
                qu = qu | (((qh >> (2 * pr + 1)) & 0x01010101) << 4)
            lo = lo + (ql,)
            hi = hi + (qu,)
        c = (d * sc0.to(tl.float32), d * sc1.to(tl.float32), zero, zero)
        return lo + hi, c, (dmin * mn0.to(tl.float32), dmin * mn1.to(tl.float32))


@triton.jit
def load_x_units(q8w_ptr, d8_ptr, s8_ptr, m, K, u, mask, QTYPE: tl.constexpr, XT: tl.constexpr):
    """Activation row ``m``'s side of units ``u`` ``[1, BU]``: (sixteen q8 words, the d8 of the
    four groups, the s8 of the two 32-groups). ``XT``: the activations come unit-major
    (:func:`unit_major`): word i of unit u at ``i * NU + u``, group g's d8 / s8 at ``g * NU +
    u``."""
    xw = q8w_ptr + m * (K // 4)
    d8 = d8_ptr + m * (K // (16 if QTYPE == 3 else 32) if XT else K // 32)
    s8 = s8_ptr + m * (K // 32)
    x = ()
    # one return statement: Triton 3.6 requires every return of a function to have one type,
    # even those in branches its constexpr conditions leave out
    if XT:
        nu = K // 64
        for i in tl.static_range(16):
            x = x + (tl.load(xw + i * nu + u, mask=mask, other=0),)
        e0 = tl.load(d8 + u, mask=mask, other=0.0)
        e1 = tl.load(d8 + nu + u, mask=mask, other=0.0)
        if QTYPE == 3:
            e2 = tl.load(d8 + 2 * nu + u, mask=mask, other=0.0)
            e3 = tl.load(d8 + 3 * nu + u, mask=mask, other=0.0)
            s0, s1 = e0, e0
        else:
            e2, e3 = e0, e1
            if QTYPE == 0:
                s0, s1 = e0, e1
            else:
                s0 = tl.load(s8 + u, mask=mask, other=0.0)
                s1 = tl.load(s8 + nu + u, mask=mask, other=0.0)
    else:
        if QTYPE == 3:
            blk = 8 * (u // 4) + 4 * ((u // 2) % 2)  # Q8_1 block of quarter 0
            for t in tl.static_range(4):
                for i in tl.static_range(4):
                    x = x + (tl.load(xw + 8 * (blk + t) + 4 * (u % 2) + i, mask=mask, other=0),)
            e0 = tl.load(d8 + blk, mask=mask, other=0.0)
            e1 = tl.load(d8 + blk + 1, mask=mask, other=0.0)
            e2 = tl.load(d8 + blk + 2, mask=mask, other=0.0)
            e3 = tl.load(d8 + blk + 3, mask=mask, other=0.0)
            s0, s1 = e0, e0
        else:
            for i in tl.static_range(16):
                x = x + (tl.load(xw + 16 * u + i, mask=mask, other=0),)
            e0 = tl.load(d8 + 2 * u, mask=mask, other=0.0)
            e1 = tl.load(d8 + 2 * u + 1, mask=mask, other=0.0)
            e2, e3 = e0, e1
            if QTYPE == 0:
                s0, s1 = e0, e1
            else:
                s0 = tl.load(s8 + 2 * u, mask=mask, other=0.0)
                s1 = tl.load(s8 + 2 * u + 1, mask=mask, other=0.0)
    return x, (e0, e1, e2, e3), (s0, s1)


@triton.jit
def unit_terms(wq, wc, wm, xq, xe, xs, QTYPE: tl.constexpr, ASM: tl.constexpr):
    """Each unit's term ``[BN, BU]`` (module docstring) from ``load_units`` / ``load_x_units``."""
    zero = tl.zeros(wq[0].shape, dtype=tl.int32)
    if QTYPE == 3:
        y = tl.zeros(wc[0].shape, dtype=tl.float32)
        for t in tl.static_range(4):
            s = zero
            for i in tl.static_range(4):
                s = dp4a(wq[4 * t + i], xq[4 * t + i], s, ASM)
            y += wc[t] * (xe[t] * s.to(tl.float32))
        return y
    s0 = zero
    s1 = zero
    for i in tl.static_range(8):
        s0 = dp4a(wq[i], xq[i], s0, ASM)
        s1 = dp4a(wq[8 + i], xq[8 + i], s1, ASM)
    y = wc[0] * (xe[0] * s0.to(tl.float32)) + wc[1] * (xe[1] * s1.to(tl.float32))
    if QTYPE != 0:
        y -= wm[0] * xs[0] + wm[1] * xs[1]
    return y


@triton.jit
def kq_mvw_kernel(
    w32_ptr,
    row_bytes,
    q8w_ptr,
    d8_ptr,
    s8_ptr,
    out_ptr,
    M,
    N,
    K,
    NU,
    U_PER_SPLIT,
    QTYPE: tl.constexpr,
    ASM: tl.constexpr,
    MP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_U: tl.constexpr,
    HOIST: tl.constexpr,
    XT: tl.constexpr,
):
    """``HOIST``: y[n] (out_ptr of the output dtype) for row tiles pid, pid + programs, ..;
    else partial[split, m, n] (fp32) over this split's units."""
    pid_n = tl.program_id(0)
    if HOIST:
        u = tl.arange(0, BLOCK_U)[None, :]
        u_ok = u < NU
        xq, xe, xs = load_x_units(q8w_ptr, d8_ptr, s8_ptr, 0, K, u, u_ok, QTYPE, XT)
        for tile in range(pid_n, tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
            n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = n < N
            wq, wc, wm = load_units(w32_ptr, row_bytes, n[:, None], u, n_ok[:, None] & u_ok, QTYPE)
            y = tl.sum(unit_terms(wq, wc, wm, xq, xe, xs, QTYPE, ASM), axis=1)
            tl.store(out_ptr + n, y.to(out_ptr.dtype.element_ty), mask=n_ok)
    else:
        split, n, n_ok, lo, hi = split_tile(N, NU, U_PER_SPLIT, BLOCK_N)
        acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
        for u0 in range(lo, hi, BLOCK_U):
            u = u0 + tl.arange(0, BLOCK_U)[None, :]
            u_ok = u < hi
            wq, wc, wm = load_units(w32_ptr, row_bytes, n[:, None], u, n_ok[:, None] & u_ok, QTYPE)
            for m in range(0, M):  # not unrolled: one row's activation words live at a time
                xq, xe, xs = load_x_units(q8w_ptr, d8_ptr, s8_ptr, m, K, u, u_ok, QTYPE, XT)
                part = tl.sum(unit_terms(wq, wc, wm, xq, xe, xs, QTYPE, ASM), axis=1)
                acc = add_row(acc, part, m, MP)
        store_split(out_ptr, acc, split, n, n_ok, M, N, MP)


@triton.jit
def unit_major_kernel(
    q8w_ptr, d8_ptr, s8_ptr, oq_ptr, od_ptr, os_ptr, K, QTYPE: tl.constexpr, BLOCK_U: tl.constexpr
):
    """Row ``program_id(1)`` of the Q8_1 activations rearranged unit-major (``XT``): word i of unit
    u to ``i * NU + u``, group g's d8 / s8 to ``g * NU + u`` (Q6_K: four d8 groups, no s8)."""
    m = tl.program_id(1)
    nu = K // 64
    u = tl.program_id(0) * BLOCK_U + tl.arange(0, BLOCK_U)
    ok = u < nu
    xq, xe, xs = load_x_units(q8w_ptr, d8_ptr, s8_ptr, m, K, u, ok, QTYPE, False)
    for i in tl.static_range(16):
        tl.store(oq_ptr + m * (K // 4) + i * nu + u, xq[i], mask=ok)
    G: tl.constexpr = 4 if QTYPE == 3 else 2
    for g in tl.static_range(G):
        tl.store(od_ptr + m * (G * nu) + g * nu + u, xe[g], mask=ok)
    if QTYPE != 3:
        for g in tl.static_range(2):
            tl.store(os_ptr + m * (2 * nu) + g * nu + u, xs[g], mask=ok)


#: units per program of ``unit_major_kernel``
UNIT_MAJOR_BLOCK = 128


def unit_major(q8w: torch.Tensor, d8: torch.Tensor, s8: torch.Tensor, qtype: str):
    """Q8_1 activations ``[M, K]`` (q8 as int32 words ``[M, K / 4]``) rearranged unit-major for
    ``XT`` in one launch: neighbouring units' words side by side, so a warp's activation loads in
    kq_mvw_kernel are contiguous."""
    m, k = q8w.shape[0], q8w.shape[1] * 4
    nu = k // 64
    oq = torch.empty_like(q8w)
    od = torch.empty((m, (4 if qtype == "Q6_K" else 2) * nu), dtype=d8.dtype, device=d8.device)
    os_ = torch.empty((m, 2 * nu), dtype=s8.dtype, device=s8.device)
    grid = (triton.cdiv(nu, UNIT_MAJOR_BLOCK), m)
    unit_major_kernel[grid](
        q8w, d8, s8, oq, od, os_, k, QTYPE=QCODE[qtype], BLOCK_U=UNIT_MAJOR_BLOCK
    )
    return oq, od, os_

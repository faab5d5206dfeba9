"""Matmul on GGUF Q8_0 and the K-quants in Triton (docs/OPS.md section 11; reference:
ftlab/reference/quant_matmul.py).

- path "int8": x quantized to Q8_1 by the Q4_0 family's kernel, then the int8-dot matvecs of
  ``ftlab/triton/quant_matmul_mv.py``, ``MATVEC_ROWS`` rows a pass.
- path "dequant": ``quant_dequant_gemm_kernel``, a ``[BLOCK_M, BLOCK_N]`` output tile per
  program: each ``BLOCK_K`` step dequantizes the ``[BLOCK_N, BLOCK_K]`` weight tile in registers
  (each value computed as ``ops.dequantize`` computes it, then rounded to x's dtype) and
  ``tl.dot``s it with the activation tile, accumulating in fp32 (fp32 x: tf32x3 on NVIDIA, IEEE
  elsewhere). BLOCK_K 64 with row scales (the sm_90 table): :func:`dequant_pair`, 64 weights a
  step as two 32-column halves, each row's scales decoded once; else :func:`dequant_tile` (with
  row scales: 32 weights a step). x goes through :func:`~ftlab.triton.q4_0_common.rows_16` first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab import argcheck, backends
from ftlab.backends import calls, tuning
from ftlab.platform import current, platform_from_arch
from ftlab.quant import Q8_1, QuantWeight
from ftlab.triton.q4_0_common import interpreted, load_q4_0_scale, quantize_q8_1, rows_16
from ftlab.triton.quant_matmul_mv import MATVEC_ROWS, matvec_specs, quant_matvec
from ftlab.triton.quants import scale_min_k4

#: constexpr codes of the types in the GEMM kernel
QTYPE_CODE = {"Q8_0": 0, "Q4_K": 1, "Q5_K": 2, "Q6_K": 3}
GEMM_CONFIGS = tuning.TRITON_QUANT_GEMM
#: dequant_pair's code of Q4_0 (as ftlab.triton.moe_kquant's QT_CODES)
Q4_0_CODE = 4


@triton.jit
def dequant_tile(w_ptr, row, k, mask, QTYPE: tl.constexpr, ROW_SCALES: tl.constexpr = False):
    """fp32 values ``[BN, BK]`` of the weights of rows at byte offsets ``row`` ``[BN]``, computed in
    the reference's order (``ftlab/reference/quants.py``): columns ``k`` ``[BK]`` under ``mask``
    ``[BN, BK]``, each weight's scales decoded for it; with ``ROW_SCALES``, the 32 columns
    ``k .. k + 32`` (k a multiple of 32, inside one Q8_0 block / one K-quant sub-block pair) of the
    rows ``mask`` ``[BN, 1]`` lets through, the same values with each row's scales (and the
    sub-block's position) loaded and decoded once."""
    tl.static_assert(QTYPE != 4, "Q4_0 (code 4) is decoded by dequant_pair only")
    if ROW_SCALES:  # k the first column: the block's position a scalar, li its 32 columns
        kb = k
        li = tl.arange(0, 32)[None, :]
        smask = mask
        mask = smask & (li < 32)
    else:  # k each column's: positions [1, BK]
        kb = k[None, :]
        smask = mask
    if QTYPE == 0:  # Q8_0: d * q
        wb = w_ptr + row[:, None] + (kb // 32) * 34
        d = load_q4_0_scale(wb, smask)
        q = tl.load(wb + 2 + (li if ROW_SCALES else kb % 32), mask=mask, other=0)
        return d * q.to(tl.int8, bitcast=True).to(tl.float32)
    elif QTYPE == 3:  # Q6_K: (d * scales[e // 16]) * q
        e = kb % 256
        wb = w_ptr + row[:, None] + (kb // 256) * 210
        h = e // 128
        t = (e % 128) // 32
        if not ROW_SCALES:
            li = e % 32
        ql = tl.load(wb + 64 * h + 32 * (t % 2) + li, mask=mask, other=0).to(tl.int32)
        qh = tl.load(wb + 128 + 32 * h + li, mask=mask, other=0).to(tl.int32)
        q = (((ql >> (4 * (t // 2))) & 0x0F) | (((qh >> (2 * t)) & 3) << 4)) - 32
        sp = wb + 192 + ((e + li) if ROW_SCALES else e) // 16  # the column's scale
        sc = tl.load(sp, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        d = load_q4_0_scale(wb + 208, smask)
        return (d * sc) * q.to(tl.float32)
    else:  # Q4_K / Q5_K: (d * sc[j]) * q - (dmin * m[j])
        NBYTES: tl.constexpr = 176 if QTYPE == 2 else 144
        QS: tl.constexpr = 48 if QTYPE == 2 else 16
        wb = w_ptr + row[:, None] + (kb // 256) * NBYTES
        e = kb % 256
        j = e // 32
        if not ROW_SCALES:
            li = e % 32
        byte = tl.load(wb + QS + 32 * (j // 2) + li, mask=mask, other=0).to(tl.int32)
        q = (byte >> (4 * (j % 2))) & 0x0F
        if QTYPE == 2:
            qh = tl.load(wb + 16 + li, mask=mask, other=0).to(tl.int32)
            q = q | (((qh >> j) & 1) << 4)
        sc, mn = scale_min_k4(wb + 4, j, smask)
        d = load_q4_0_scale(wb, smask)
        dmin = load_q4_0_scale(wb + 2, smask)
        return (d * sc) * q.to(tl.float32) - dmin * mn


@triton.jit
def dequant_pair(w_ptr, row, k0, K, n_ok, QTYPE: tl.constexpr):
    """:func:`dequant_tile` of the 64 weights ``k0 .. k0 + 64`` (k0 a multiple of 64) as two
    ``[BN, 32]`` halves, columns k0.. and k0 + 32..: one Q8_0 (or Q4_0, code 4) block each, a
    Q4_K / Q5_K sub-block pair (one load of the 32 ``qs`` bytes, low nibbles then high), two Q6_K
    quarters sharing their ``qh`` bytes; each row's scales loaded and decoded once. The same
    values as :func:`dequant_tile` (the high half of a Q8_0 / Q4_0 row with K % 64 == 32 masked
    to 0)."""
    li = tl.arange(0, 32)[None, :]
    rmask = n_ok[:, None]
    mask = rmask & (li < 32)
    if QTYPE == 0:  # Q8_0: d * q, blocks k0 // 32 and k0 // 32 + 1
        wb = w_ptr + row[:, None] + (k0 // 32) * 34
        hmask = rmask & (tl.full([1, 1], k0 + 32, tl.int32) < K)
        q_lo = tl.load(wb + 2 + li, mask=mask, other=0).to(tl.int8, bitcast=True)
        q_hi = tl.load(wb + 36 + li, mask=hmask & (li < 32), other=0).to(tl.int8, bitcast=True)
        lo = load_q4_0_scale(wb, rmask) * q_lo.to(tl.float32)
        hi = load_q4_0_scale(wb + 34, hmask) * q_hi.to(tl.float32)
        return lo, hi
    elif QTYPE == 3:  # Q6_K: (d * scales[e // 16]) * q, quarters t0 and t0 + 1 of half h
        e0 = k0 % 256
        wb = w_ptr + row[:, None] + (k0 // 256) * 210
        h = e0 // 128
        nib = 4 * ((e0 % 128) // 64)  # quarters 0, 1: low nibbles; 2, 3: high
        t0 = (e0 % 128) // 32
        ql_lo = tl.load(wb + 64 * h + li, mask=mask, other=0).to(tl.int32)
        ql_hi = tl.load(wb + 64 * h + 32 + li, mask=mask, other=0).to(tl.int32)
        qh = tl.load(wb + 128 + 32 * h + li, mask=mask, other=0).to(tl.int32)
        q_lo = (((ql_lo >> nib) & 0x0F) | (((qh >> (2 * t0)) & 3) << 4)) - 32
        q_hi = (((ql_hi >> nib) & 0x0F) | (((qh >> (2 * t0 + 2)) & 3) << 4)) - 32
        sc_lo = (
            tl.load(wb + 192 + (e0 + li) // 16, mask=mask, other=0)
            .to(tl.int8, bitcast=True)
            .to(tl.float32)
        )
        sc_hi = (
            tl.load(wb + 194 + (e0 + li) // 16, mask=mask, other=0)
            .to(tl.int8, bitcast=True)
            .to(tl.float32)
        )
        d = load_q4_0_scale(wb + 208, rmask)
        return (d * sc_lo) * q_lo.to(tl.float32), (d * sc_hi) * q_hi.to(tl.float32)
    elif QTYPE == 4:  # Q4_0 (ftlab.triton.moe_kquant's code): d * (q - 8), blocks k0 // 32 and + 1
        wb = w_ptr + row[:, None] + (k0 // 32) * 18
        hmask = rmask & (tl.full([1, 1], k0 + 32, tl.int32) < K)
        shift = 4 * (li // 16)  # element l of a block: byte l % 16, low nibble for l < 16
        b_lo = tl.load(wb + 2 + li % 16, mask=mask, other=0).to(tl.int32)
        b_hi = tl.load(wb + 20 + li % 16, mask=hmask & (li < 32), other=0).to(tl.int32)
        lo = load_q4_0_scale(wb, rmask) * (((b_lo >> shift) & 0x0F) - 8).to(tl.float32)
        hi = load_q4_0_scale(wb + 18, hmask) * (((b_hi >> shift) & 0x0F) - 8).to(tl.float32)
        return lo, hi
    else:  # Q4_K / Q5_K: (d * sc[j]) * q - (dmin * m[j]), sub-blocks j = 2p and 2p + 1
        NBYTES: tl.constexpr = 176 if QTYPE == 2 else 144
        QS: tl.constexpr = 48 if QTYPE == 2 else 16
        wb = w_ptr + row[:, None] + (k0 // 256) * NBYTES
        j = (k0 % 256) // 32
        byte = tl.load(wb + QS + 16 * j + li, mask=mask, other=0).to(tl.int32)
        q_lo = byte & 0x0F
        q_hi = byte >> 4
        if QTYPE == 2:
            qh = tl.load(wb + 16 + li, mask=mask, other=0).to(tl.int32)
            q_lo = q_lo | (((qh >> j) & 1) << 4)
            q_hi = q_hi | (((qh >> (j + 1)) & 1) << 4)
        d = load_q4_0_scale(wb, rmask)
        dmin = load_q4_0_scale(wb + 2, rmask)
        sc_lo, mn_lo = scale_min_k4(wb + 4, j, rmask)
        sc_hi, mn_hi = scale_min_k4(wb + 4, j + 1, rmask)
        return (d * sc_lo) * q_lo.to(tl.float32) - dmin * mn_lo, (d * sc_hi) * q_hi.to(
            tl.float32
        ) - dmin * mn_hi


@triton.jit
def quant_dequant_gemm_kernel(
    x_ptr,
    x_stride,
    w_ptr,
    row_bytes,
    y_ptr,
    y_stride,
    M,
    N,
    K,
    QTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_F32: tl.constexpr,
    F32_PRECISION: tl.constexpr,
    ROW_SCALES: tl.constexpr,
):
    """y = x @ dequantize(W).T; ``DOT_F32``: the dot in fp32 (fp32 x; bf16 in the interpreter,
    whose bf16 dot is not the GPU's), else in x's dtype with an fp32 accumulator."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    row = rn.to(tl.int64) * row_bytes
    xrow = x_ptr + rm.to(tl.int64)[:, None] * x_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if ROW_SCALES and BLOCK_K == 64:  # two 32-column halves a step (dequant_pair)
        c = tl.arange(0, 32)
        for k0 in range(0, K, 64):
            x_lo = tl.load(
                xrow + (k0 + c)[None, :], mask=m_ok[:, None] & (k0 + c < K)[None, :], other=0.0
            )
            x_hi = tl.load(
                xrow + (k0 + 32 + c)[None, :],
                mask=m_ok[:, None] & (k0 + 32 + c < K)[None, :],
                other=0.0,
            )
            lo, hi = dequant_pair(w_ptr, row, k0, K, n_ok, QTYPE)
            if DOT_F32:  # the weights rounded to x's dtype first, as the 32-column steps round them
                lo = lo.to(x_ptr.dtype.element_ty).to(tl.float32)
                hi = hi.to(x_ptr.dtype.element_ty).to(tl.float32)
                acc = tl.dot(x_lo.to(tl.float32), tl.trans(lo), acc, input_precision=F32_PRECISION)
                acc = tl.dot(x_hi.to(tl.float32), tl.trans(hi), acc, input_precision=F32_PRECISION)
            else:
                acc = tl.dot(x_lo, tl.trans(lo.to(x_ptr.dtype.element_ty)), acc)
                acc = tl.dot(x_hi, tl.trans(hi.to(x_ptr.dtype.element_ty)), acc)
    else:
        for k0 in range(0, K, BLOCK_K):
            kg = k0 + tl.arange(0, BLOCK_K)
            k_ok = kg < K
            xt = tl.load(xrow + kg[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            if ROW_SCALES and BLOCK_K == 32:  # K is a multiple of 32 for every type
                wt = dequant_tile(w_ptr, row, k0, n_ok[:, None], QTYPE, True).to(
                    x_ptr.dtype.element_ty
                )
            else:
                wt = dequant_tile(w_ptr, row, kg, n_ok[:, None] & k_ok[None, :], QTYPE).to(
                    x_ptr.dtype.element_ty
                )
            if DOT_F32:
                acc = tl.dot(
                    xt.to(tl.float32),
                    tl.trans(wt.to(tl.float32)),
                    acc,
                    input_precision=F32_PRECISION,
                )
            else:
                acc = tl.dot(xt, tl.trans(wt), acc)
    out = y_ptr + rm.to(tl.int64)[:, None] * y_stride + rn[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def gemm_config(dtype: torch.dtype, arch: str | None) -> dict[str, int]:
    """The GEMM's launch parameters for x of ``dtype`` on ``arch`` (None: the CPU interpreter)."""
    if dtype == torch.float32:
        return GEMM_CONFIGS["f32"]
    half = GEMM_CONFIGS["half"]
    return half.get(arch or "default", half["default"])


def q4_0_config(dtype: torch.dtype, arch: str | None) -> dict[str, int] | None:
    """The GEMM's launch parameters for Q4_0 weights and x of ``dtype`` on ``arch``, or None
    where Q4_0 keeps ``ftlab.triton.q4_0``'s GEMM (fp32 x, an arch without timed tiles)."""
    return None if dtype == torch.float32 else GEMM_CONFIGS["q4_0"].get(arch or "")


def row_scales(arch: str | None) -> bool:
    """Whether the GEMM decodes a weight tile's scales once a row (``dequant_tile``'s ROW_SCALES) on
    ``arch``: not on RDNA, where the per-row values held across the tile spill registers."""
    return not platform_from_arch(arch or "cpu").rdna


def quant_dequant_gemm(x: torch.Tensor, w: QuantWeight, config: dict | None = None) -> torch.Tensor:
    """y = x @ dequantize(w).T by ``quant_dequant_gemm_kernel``; ``config``: launch parameters
    instead of the table's (for sweeps). Q4_0 weights only in 64-weight steps (BLOCK_K 64, on
    an arch with row scales): ``config`` or :func:`q4_0_config`'s."""
    x = rows_16(x)
    m, k = x.shape
    n = w.shape[0]
    arch = current(x.device).arch if x.device.type != "cpu" else None
    if w.qtype == "Q4_0":
        cfg = config or q4_0_config(x.dtype, arch)
        if cfg is None or cfg["BLOCK_K"] != 64 or not row_scales(arch):
            raise ValueError(
                "Q4_0 weights are decoded in 64-weight steps only: config must have BLOCK_K 64 on "
                "an arch with row scales (q4_0_config has tiles for 16-bit x on "
                f"{sorted(GEMM_CONFIGS['q4_0'])}), got {cfg} for {x.dtype} x on "
                f"{arch or 'the CPU interpreter'}"
            )
    else:
        cfg = config or gemm_config(x.dtype, arch)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    f32 = x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and interpreted())
    precision = "tf32x3" if current(x.device).tf32 and not interpreted() else "ieee"
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]))
    quant_dequant_gemm_kernel[grid](
        x,
        x.stride(0),
        w.data,
        w.data.shape[-1],
        y,
        y.stride(0),
        m,
        n,
        k,
        QTYPE=Q4_0_CODE if w.qtype == "Q4_0" else QTYPE_CODE[w.qtype],
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"],
        DOT_F32=f32,
        F32_PRECISION=precision if x.dtype == torch.float32 else "ieee",
        ROW_SCALES=row_scales(arch),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    return y


def quant_matmul(
    x: torch.Tensor, w: QuantWeight, path: str, variant: str | None = None, call=None
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.quant_matmul` (arguments validated, path resolved).
    ``variant``: ``"words"`` or ``"tiles"`` (the int8 path's matvecs, ``MATVEC_ROWS`` rows a
    pass) or ``"gemm"`` (the dequant path's); None: the planner's default for the call; one that
    cannot serve raises ``BackendUnavailable``. The shapes are checked here too: the op's checks
    may be off."""
    argcheck.matmul_layout(x, w)
    call = call or calls.matmul(x, w)  # the planner's (a plan passes it), else made here
    variant = backends.variant_for("quant_matmul", "triton", call, variant, path=path)
    if path == "int8":
        x8, rows = quantize_q8_1(x), MATVEC_ROWS
        outs = [
            quant_matvec(
                Q8_1(x8.q[i : i + rows], x8.d[i : i + rows], x8.s[i : i + rows]),
                w,
                x.dtype,
                variant,
            )
            for i in range(0, x.shape[0], rows)
        ]
        return outs[0] if len(outs) == 1 else torch.cat(outs)
    return quant_dequant_gemm(x, w)


def compile_specs(target: str) -> list:
    """The configurations ftlab launches on ``target``, for ftlab.compile_check."""
    from ftlab.triton.compile_spec import spec

    plat = platform_from_arch(target)
    precision = "tf32x3" if plat.tf32 else "ieee"
    specs = matvec_specs(target)
    arch = target if plat.is_gpu else None
    for qtype, code in {**QTYPE_CODE, "Q4_0": Q4_0_CODE}.items():
        for dt in ("fp32", "fp16", "bf16"):
            torch_dt = torch.float32 if dt == "fp32" else torch.float16
            cfg = q4_0_config(torch_dt, arch) if qtype == "Q4_0" else gemm_config(torch_dt, arch)
            if cfg is None:  # Q4_0 without tiles here: ftlab.triton.q4_0's GEMM serves it
                continue
            tile = f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']}"
            label = f"quant_dequant_gemm_kernel[{qtype}, {dt}, {tile}]"
            specs.append(
                spec(
                    quant_dequant_gemm_kernel,
                    label,
                    types={"x_ptr": f"*{dt}", "w_ptr": "*u8", "y_ptr": f"*{dt}"},
                    constexprs={
                        "QTYPE": code,
                        "BLOCK_M": cfg["BLOCK_M"],
                        "BLOCK_N": cfg["BLOCK_N"],
                        "BLOCK_K": cfg["BLOCK_K"],
                        "DOT_F32": dt == "fp32",
                        "F32_PRECISION": precision if dt == "fp32" else "ieee",
                        "ROW_SCALES": row_scales(target),
                    },
                    num_warps=cfg["num_warps"],
                    options={"num_stages": cfg["num_stages"]},
                    multiple_of_16=("x_ptr", "x_stride"),
                )
            )
    return specs

"""Matmul on GGUF Q8_0 and the K-quants through the HIP kernels of ``csrc/quant_matmul.hip`` and
``csrc/quant_matmul_tiled.hip`` (JIT-built, cached); docs/OPS.md section 11.

The int8 path only: x is quantized to Q8_1 by the Q4_0 family's kernel, then up to 8 rows
(decode) go to an int8-dot matvec (dp4a / sudot4 / sdot4) and more (prefill) to the dp4a-tiled
GEMM (64x64 output tiles, the weight units decoded into LDS). Which variant runs is the planner's
(``ftlab.backends.rules``: ``KERNELS`` says what each takes, ``DEFAULTS`` which one runs and
why); this module runs the one it is given, or raises ``BackendUnavailable``. Matvec variants:

- ``"tiled"`` (default for M >= 2): lane groups take regions of 32 supers (super-blocks; four Q8_0 blocks),
  ``32 / G`` rows times ``G`` consecutive supers, loaded with 16-byte coalesced loads and
  transposed through LDS; each lane decodes one super and applies every unit to all M rows.
- ``"lanes"`` (default at M = 1 for Q8_0): one 32-thread group per weight row, lane l reading its own 32-weight units
  l, l + 32, ... At M = 1 (``quant_mv1_kernel``) the grid is persistent, each group walking rows,
  and where K <= 2048 each lane's activation words stay in registers for all its rows; at M >= 2
  (``quant_mv_kernel``) one group a row, the activations re-read for every row. Also taken where
  the tiled one cannot: w not starting and ending 16-byte aligned, Q8_0 with K % 128 != 0.
- ``"vec"`` (M = 1, where "fused" does not apply): at M = 1 a K-quant row is read by eight lanes to a
  super-block, lane c taking 16 contiguous bytes of its quant field in one 16-byte load
  (``csrc/quant_vec.h``: 16 weights of each of two units), so a group's load instruction covers
  four super-blocks' quant bytes in one coalesced sweep; a persistent grid as "lanes", activations
  held in registers where K <= 2048, two steps' loads issued together beyond. w must start 16-byte
  aligned (else "lanes"); at M >= 2 it is "lanes".
- ``"fused"`` (default at M = 1 for Q4_K / Q5_K where it applies): "vec"'s pieces in one launch
  (``csrc/quant_matmul_mv1.hip``): every block quantizes x to Q8_1 in LDS (the bits of the
  quantize kernel), y is written in x's dtype; where a row is two steps or less (K <= 2048) the
  next row's pieces are loaded before this row's sum, and a group's first row is asked of the L2
  before the wait on the kernel before (programmatic launch on sm_90; prefetches only). K a
  multiple of 256 up to 8192, w contiguous and 16-byte aligned (else "vec"). One launch where
  "vec" is three (quantize, matvec, cast): the decode step's attention projections. Q6_K is cut
  into quads here (four lanes a super-block, each taking 16 weights of all four quarters of a
  half: three pieces, the q - 32 offset from the held activations' sums), not vec's eighths.
- ``"staged"`` (default at M = 1 for Q6_K where copies are asynchronous: NVIDIA sm_80+, else
  "fused"): "fused" with each lane group's rows copied into a
  ring of three row slots in LDS by asynchronous 16-byte copies (cp.async on sm_80+; plain copies
  elsewhere), two rows ahead of the one it sums, so no register holds a row in flight; the same
  sums in the same order as "fused" (the same bits). K a multiple of 256 up to 2048 and rows of
  whole 16-byte pieces (Q6_K: K = 2048), else "fused".
- ``"sliced"`` / ``"sliced_q8"`` (long rows): a row taken by G = 1, 2, 4 or 8 lane groups of a block, each
  holding one slice of 8 super-blocks for the whole kernel ("fused"'s held form: its pieces,
  activations in registers, the next row's pieces loaded before this row's sum), the slices'
  sums added in LDS in a fixed order every 8 rounds of rows; one launch, x quantized in every
  block of a persistent grid ("sliced_q8": x quantized by its own launch first, each lane then
  reading its slice's Q8_1 from memory: two launches, no quantization in the blocks). K a
  multiple of 256 up to 16384 (else "fused"); its sums are grouped otherwise than "fused"'s
  (deterministic, held to the int8 bound).

"fused", "staged" and "sliced" also take Q8_0 (no "staged") and Q4_0 as groups of eight blocks,
lane c of eight taking block c whole (:func:`q4_0_one_row`); neither type's default yet.
"""

from __future__ import annotations

import torch

from ftlab import argcheck, backends, jit
from ftlab import platform as ftplatform
from ftlab.backends import calls
from ftlab.backends.rules import ONE_LAUNCH, TILED_SUPER_K
from ftlab.hip.q4_0 import q4_0_matmul, quantize_q8_1
from ftlab.quant import Q4_0Weight, QuantWeight

#: rows the matvecs are instantiated for (1..8); more go to quant_gemm_kernel
MATVEC_ROWS = 8
#: the weight type codes of ``quant_mv_fused`` / ``_staged`` / ``_sliced`` (csrc/quant_matmul_launch.hip;
#: Q4_0 and Q8_0 in groups of eight blocks; Q8_0 has no staged form)
FUSED_CODES = {"Q4_K": 1, "Q5_K": 2, "Q6_K": 3, "Q4_0": 4, "Q8_0": 5}
#: the tiled matvec's G (supers of a row per region: 1, 2, 4, 8, 16 or 32) by M (1..8); fewer
#: rows share an activation block the more supers a region takes per row
TILED_G = {1: 4, 2: 4, 3: 2, 4: 2, 5: 1, 6: 1, 7: 1, 8: 1}
#: (row set, K split) pairs per resident lane group the tiled matvec aims for: K is split (the
#: partial sums added in order afterwards) while the N * G / 32 row sets give fewer
TILED_MIN_SETS = 2
#: resident 32-thread groups per SM / CU the tiled matvec is sized for (3 blocks of 4)
TILED_GROUPS_PER_SM = 12
SUFFIX = {"Q8_0": "q8_0", "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k"}
#: the three-launch kernels' entry points by variant (after quantize_q8_1)
KERNEL_PREFIX = {"vec": "quant_mv_vec_", "lanes": "quant_mv_", "gemm": "quant_gemm_"}


def quant_matmul(
    x: torch.Tensor,
    w: QuantWeight,
    path: str,
    variant: str | None = None,
    g: int | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.quant_matmul` (``path == "int8"``): ``x [M, K] @
    w.T`` in x's dtype. ``variant``: one of ``ftlab.backends.rules.KERNELS[("quant_matmul",
    "hip")]``, None for the planner's default for this call; one that cannot take the call
    raises ``BackendUnavailable`` naming why. A Q4_0 weight goes to :func:`q4_0_matmul` unless a
    one-launch variant is named (:func:`q4_0_one_row`). ``g`` / ``splits`` override
    :func:`tiled_config` (benchmarks). The shapes are checked here too: the op's checks may be off."""
    argcheck.matmul_layout(x, w)
    if path != "int8":
        raise ValueError(
            f"the hip backend implements quant_matmul's int8 path only, got path={path!r}"
        )
    if w.qtype == "Q4_0" and variant is None:
        return q4_0_matmul(x, w, "int8")
    call = calls.matmul(x, w)
    variant = backends.variant_for("quant_matmul", "hip", call, variant, path="int8")
    n = w.shape[0]
    module = jit.module_for("quant_matmul", x.device)
    if variant == "sliced_q8":  # x's Q8_1 first (its own launch), which every block then reads
        x8 = quantize_q8_1(x)
        y = torch.empty((1, n), dtype=x.dtype, device=x.device)
        code = FUSED_CODES[w.qtype]
        jit.on_device(x.device, lambda: module.quant_mv_sliced_q8(x8.q, x8.d, x8.s, w.data, code, y))
        return y
    if variant in ONE_LAUNCH:  # fused, staged, sliced: x quantized in every block, y in x's dtype
        y = torch.empty((1, n), dtype=x.dtype, device=x.device)
        xc = x.contiguous()
        fn = getattr(module, "quant_mv_" + variant)
        jit.on_device(x.device, lambda: fn(xc, w.data, FUSED_CODES[w.qtype], y))
        return y
    x8 = quantize_q8_1(x)
    suffix = SUFFIX[w.qtype]
    m = x.shape[0]
    if variant == "tiled":
        gd, sd = tiled_config(m, n, x.shape[1], w.qtype, x.device)
        gv, sv = g or gd, splits or sd
        part = torch.empty((sv * m, n), dtype=torch.float32, device=x.device)
        fn = getattr(module, "quant_mv_tiled_" + suffix)
        jit.on_device(x.device, lambda: fn(w.data, x8.q, x8.d, x8.s, part, gv, sv))
        y = part if sv == 1 else part.view(sv, m, n).sum(0)
    else:
        # the kernels read 32-bit words of the blocks: an unaligned view is copied
        data = w.data if w.data.data_ptr() % 4 == 0 else w.data.clone()
        y = torch.empty((m, n), dtype=torch.float32, device=x.device)
        fn = getattr(module, KERNEL_PREFIX[variant] + suffix)
        jit.on_device(x.device, lambda: fn(data, x8.q, x8.d, x8.s, y))
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def q4_0_one_row(x: torch.Tensor, w: Q4_0Weight, variant: str) -> torch.Tensor:
    """``x [1, K] @ w.T`` on the int8 path through one of the one-launch one-row kernels
    (``quant_mv_fused`` / ``_staged`` / ``_sliced``), which take Q4_0 in groups of eight blocks
    (csrc/quant_records.h's ``Q4Eighth``: eight lanes a group, lane c taking block c whole):
    ``"fused"`` (K up to 8192), ``"staged"`` (up to 2048, rows through LDS by asynchronous
    copies), ``"sliced"`` (up to 16384, a row's slices of 2048 weights held by the lane groups of
    a block) or ``"sliced_q8"`` (the same given x's Q8_1 from its own launch). x is fp32 / fp16 /
    bf16 ``[1, K]``, K a multiple of 256, w's bytes contiguous and 16-byte aligned (else
    ``BackendUnavailable``); y ``[1, N]`` in x's dtype, within q4_0_matmul's int8 bound (its sums
    are grouped otherwise than the region matvec's)."""
    if variant not in ONE_LAUNCH:
        raise ValueError(f"variant must be one of {ONE_LAUNCH}, got {variant!r}")
    return quant_matmul(x, w, "int8", variant=variant)


def tiled_config(m: int, n: int, k: int, qtype: str, device: torch.device) -> tuple[int, int]:
    """(G, K splits) of the tiled matvec for M rows of activations and an ``[N, K]`` weight:
    ``TILED_G[m]``, and K split into as many ranges (at most one region each) as bring the
    (row set, split) pairs up to ``TILED_MIN_SETS`` per resident lane group."""
    g = TILED_G[m]
    k_steps = -(-(k // TILED_SUPER_K[qtype]) // g)
    row_sets = max(1, -(-n // (32 // g)))
    target = TILED_MIN_SETS * TILED_GROUPS_PER_SM * ftplatform.multiprocessors(device)
    splits = max(1, min(k_steps, -(-target // row_sets)))
    return g, splits

"""Matmul on GGUF Q8_0 and the K-quants through the HIP kernels of ``csrc/quant_matmul.hip`` and
``csrc/quant_matmul_tiled.hip`` (JIT-built, cached); docs/OPS.md section 11.

The int8 path only: x is quantized to Q8_1 by the Q4_0 family's kernel, then up to 8 rows
(decode) go to an int8-dot matvec (dp4a / sudot4 / sdot4) and more (prefill) to the dp4a-tiled
GEMM (64x64 output tiles, the weight units decoded into LDS). Matvec variants:

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
  (``csrc/quant_mv_fused.hip``): every block quantizes x to Q8_1 in LDS (the bits of the
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

from ftlab import argcheck, jit
from ftlab import platform as ftplatform
from ftlab.hip.q4_0 import q4_0_matmul, quantize_q8_1
from ftlab.quant import Q4_0Weight, QuantWeight

#: rows the matvecs are instantiated for (1..8); more go to quant_gemm_kernel
MATVEC_ROWS = 8
#: matvec variant per weight type for M >= 2: "tiled" or "lanes" ("vec" is "lanes" there)
MATVEC_VARIANT = {"Q8_0": "tiled", "Q4_K": "tiled", "Q5_K": "tiled", "Q6_K": "tiled"}
#: ... and for M = 1: on the H200 (benchmarks/NOTES.md) the persistent lanes matvec is faster than
#: the tiled one for every type (lm_head: 1.3-1.9x; 4096 x 14336: 1.1-1.4x), and vec than lanes
#: for every K-quant at every bench shape (lm_head 1.1-1.3x); the tiled one is 1.5-2.2x faster
#: than lanes at M = 8. Q6_K takes "staged" on NVIDIA sm_80+ (:func:`async_copies`; it falls back to
#: "fused" where it does not apply): on the lm_head 83% of copy
#: against "fused"'s 59% (80 registers, three blocks an SM); Q4_K / Q5_K "fused" (88% / 83%)
MATVEC_VARIANT_M1 = {"Q8_0": "lanes", "Q4_K": "fused", "Q5_K": "fused", "Q6_K": "staged"}
#: the K-quants' M = 1 default where K is past fused's limit, up to SLICED_MAX_K (a dense model's
#: down projection, K = 14336): on the H200, same run, "sliced_q8" against "vec" (the fallback
#: before) and Triton: Q4_K 14.5 / 29.1 / 25.1 us, Q5_K 17.3 / 29.9 / 27.7, Q6_K 24.2 / 36.3 / 26.7
#: (benchmarks/results/2026-12-05-nvidia-h200-time-quant-mv1-all.txt)
LONG_ROW_VARIANT = "sliced_q8"
#: K (weights a row) the fused one-row matvec takes: its activation records in LDS (kFusedMaxK)
FUSED_MAX_K = 8192
#: K the staged one-row matvec takes: a row fits one of its LDS slots (8 super-blocks)
STAGED_MAX_K = 2048
#: K the sliced one-row matvec takes (a block's 8 groups hold 8 slices of 8 super-blocks; x's
#: activation records in LDS, kSlicedMaxK)
SLICED_MAX_K = 16384
#: the weight type codes of ``quant_mv_fused`` / ``_staged`` / ``_sliced`` (csrc/quant_matmul_launch.hip;
#: Q4_0 and Q8_0 in groups of eight blocks; Q8_0 has no staged form)
FUSED_CODES = {"Q4_K": 1, "Q5_K": 2, "Q6_K": 3, "Q4_0": 4, "Q8_0": 5}
#: the variants of those one-launch one-row kernels (the only ones here that take Q4_0)
ONE_LAUNCH = ("fused", "staged", "sliced", "sliced_q8")
#: the tiled matvec's G (supers of a row per region: 1, 2, 4, 8, 16 or 32) by M (1..8); fewer
#: rows share an activation block the more supers a region takes per row
TILED_G = {1: 4, 2: 4, 3: 2, 4: 2, 5: 1, 6: 1, 7: 1, 8: 1}
#: (row set, K split) pairs per resident lane group the tiled matvec aims for: K is split (the
#: partial sums added in order afterwards) while the N * G / 32 row sets give fewer
TILED_MIN_SETS = 2
#: resident 32-thread groups per SM / CU the tiled matvec is sized for (3 blocks of 4)
TILED_GROUPS_PER_SM = 12
#: K (weights) of one super of the tiled matvec
TILED_SUPER_K = {"Q8_0": 128, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
_SUFFIX = {"Q8_0": "q8_0", "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k"}


def quant_matmul(
    x: torch.Tensor,
    w: QuantWeight,
    path: str,
    variant: str | None = None,
    g: int | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.quant_matmul` (``path == "int8"``). ``variant`` /
    ``g`` / ``splits`` override :data:`MATVEC_VARIANT` / :func:`tiled_config` for M <= 8
    (benchmarks). The shapes are checked here too: the op's checks may be off."""
    argcheck.matmul_layout(x, w)
    if path != "int8":
        raise ValueError(
            f"the hip backend implements quant_matmul's int8 path only, got path={path!r}"
        )
    m, n, k = x.shape[0], w.shape[0], x.shape[1]
    if w.qtype == "Q4_0" and not (m == 1 and variant in ONE_LAUNCH):
        return q4_0_matmul(x, w, "int8")  # only the one-launch one-row kernels here take Q4_0
    if variant is None:
        variant = (MATVEC_VARIANT_M1 if m == 1 else MATVEC_VARIANT)[w.qtype]
        if variant == "staged" and not async_copies(x.device):
            variant = "fused"  # its copies would go through registers: no overlap, not measured
        if variant in ("fused", "staged") and m == 1 and not fused_ok(x, w) and sliced_ok(x, w):
            variant = LONG_ROW_VARIANT  # rows past fused's K
    if variant not in ("tiled", "lanes", "vec", *ONE_LAUNCH):
        raise ValueError(
            "variant must be 'tiled', 'lanes', 'vec', 'fused', 'staged', 'sliced' or 'sliced_q8', "
            f"got {variant!r}"
        )
    module = jit.module_for("quant_matmul", x.device)
    if variant in ("sliced", "sliced_q8") and not (m == 1 and sliced_ok(x, w)):
        variant = "fused"
    if variant == "sliced_q8":  # x's Q8_1 first (its own launch), which every block then reads
        x8 = quantize_q8_1(x)
        y = torch.empty((1, n), dtype=x.dtype, device=x.device)
        code = FUSED_CODES[w.qtype]
        jit.on_device(x.device, lambda: module.quant_mv_sliced_q8(x8.q, x8.d, x8.s, w.data, code, y))
        return y
    if variant == "staged" and not (m == 1 and staged_ok(x, w)):
        variant = "fused"
    if variant == "fused" and not (m == 1 and fused_ok(x, w)):
        variant = "vec" if m == 1 else MATVEC_VARIANT[w.qtype]
    if w.qtype == "Q4_0" and variant not in ONE_LAUNCH:
        return q4_0_matmul(x, w, "int8")  # where they do not apply: hip's other matvecs take no Q4_0
    if variant in ("fused", "staged", "sliced"):  # the one-launch kernels
        y = torch.empty((1, n), dtype=x.dtype, device=x.device)
        xc = x.contiguous()
        fn = getattr(module, "quant_mv_" + variant)
        jit.on_device(x.device, lambda: fn(xc, w.data, FUSED_CODES[w.qtype], y))
        return y
    x8 = quantize_q8_1(x)
    suffix = _SUFFIX[w.qtype]
    # the kernels read 32-bit words of the blocks: an unaligned view is copied
    data = w.data if w.data.data_ptr() % 4 == 0 else w.data.clone()
    # the tiled matvec loads aligned 16-byte pieces of w: it must start and end on them
    aligned = data.data_ptr() % 16 == 0 and data.numel() % 16 == 0
    if m <= MATVEC_ROWS and variant == "tiled" and aligned and k % TILED_SUPER_K[w.qtype] == 0:
        gd, sd = tiled_config(m, n, k, w.qtype, x.device)
        gv, sv = g or gd, splits or sd
        part = torch.empty((sv * m, n), dtype=torch.float32, device=x.device)
        fn = getattr(module, "quant_mv_tiled_" + suffix)
        jit.on_device(x.device, lambda: fn(data, x8.q, x8.d, x8.s, part, gv, sv))
        y = part if sv == 1 else part.view(sv, m, n).sum(0)
    else:
        y = torch.empty((m, n), dtype=torch.float32, device=x.device)
        kernel = "quant_mv_" if m <= MATVEC_ROWS else "quant_gemm_"
        if m == 1 and variant == "vec" and w.qtype != "Q8_0" and data.data_ptr() % 16 == 0:
            kernel = "quant_mv_vec_"
        fn = getattr(module, kernel + suffix)
        jit.on_device(x.device, lambda: fn(data, x8.q, x8.d, x8.s, y))
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def fused_ok(x: torch.Tensor, w: QuantWeight) -> bool:
    """Whether the fused one-row matvec takes ``x [1, K] @ w.T``: a Q4_K / Q5_K / Q6_K / Q4_0 / Q8_0
    weight, K a multiple of 256 up to :data:`FUSED_MAX_K`, its bytes contiguous and 16-byte aligned."""
    return _one_row_ok(x, w, FUSED_MAX_K)


def _one_row_ok(x: torch.Tensor, w: QuantWeight, max_k: int) -> bool:
    k = x.shape[1]
    return (w.qtype in FUSED_CODES and k % 256 == 0 and 0 < k <= max_k and w.data.is_contiguous()
            and w.data.data_ptr() % 16 == 0)  # fmt: skip


_ASYNC: dict[torch.device, bool] = {}


def async_copies(device: torch.device) -> bool:
    """Whether the hip kernels copy into LDS asynchronously on ``device`` (cp.async: an NVIDIA GPU
    of compute capability 8.0 or later); elsewhere ``port_copy16_async`` is a plain copy, and the
    staged matvec is not the default."""
    if device not in _ASYNC:
        _ASYNC[device] = (device.type == "cuda" and torch.version.hip is None
                          and torch.cuda.get_device_capability(device) >= (8, 0))  # fmt: skip
    return _ASYNC[device]


def staged_ok(x: torch.Tensor, w: QuantWeight) -> bool:
    """Whether the staged one-row matvec takes ``x [1, K] @ w.T``: as :func:`fused_ok`, with K up
    to :data:`STAGED_MAX_K`, rows a multiple of 16 bytes and not Q8_0."""
    return fused_ok(x, w) and x.shape[1] <= STAGED_MAX_K and w.data.shape[-1] % 16 == 0 and w.qtype != "Q8_0"


def one_launch_default(x: torch.Tensor, w: QuantWeight) -> bool:
    """Whether hip's M = 1 default for ``w`` is one of its one-row kernels of one launch over the
    weights that takes ``x [1, K] @ w.T``: Q4_K / Q5_K / Q6_K (:data:`MATVEC_VARIANT_M1` "fused" or
    "staged") where :func:`fused_ok` holds, and :data:`LONG_ROW_VARIANT` past its K where
    :func:`sliced_ok` does (x's Q8_1 first, its own small launch). Q8_0's default is still "lanes"
    (three launches), though "fused" takes it."""
    return MATVEC_VARIANT_M1.get(w.qtype) in ("fused", "staged") and sliced_ok(x, w)  # fused_ok implies it


def sliced_ok(x: torch.Tensor, w: QuantWeight) -> bool:
    """Whether the sliced one-row matvec takes ``x [1, K] @ w.T``: as :func:`fused_ok`, with K up
    to :data:`SLICED_MAX_K`."""
    return _one_row_ok(x, w, SLICED_MAX_K)


def q4_0_one_row(x: torch.Tensor, w: Q4_0Weight, variant: str) -> torch.Tensor:
    """``x [1, K] @ w.T`` on the int8 path through one of the one-launch one-row kernels
    (``quant_mv_fused`` / ``_staged`` / ``_sliced``), which take Q4_0 in groups of eight blocks (csrc/quant_records.h's
    ``Q4Eighth``: eight lanes a group, lane c taking block c whole): ``"fused"`` (K up to 8192),
    ``"staged"`` (up to 2048, rows through LDS by asynchronous copies), ``"sliced"`` (up to
    16384, a row's slices of 2048 weights held by the lane groups of a block) or ``"sliced_q8"``
    (the same given x's Q8_1 from its own launch). x is fp32 / fp16 /
    bf16 ``[1, K]``, K a multiple of 256, w's bytes contiguous and 16-byte aligned; y ``[1, N]`` in
    x's dtype, within q4_0_matmul's int8 bound (its sums are grouped otherwise than the region
    matvec's). Where the variant does not apply, :func:`ftlab.hip.q4_0.q4_0_matmul`."""
    if variant not in ONE_LAUNCH:
        raise ValueError(f"variant must be 'fused', 'staged', 'sliced' or 'sliced_q8', got {variant!r}")
    return quant_matmul(x, w, "int8", variant=variant)  # it takes q4_0_matmul where they do not apply


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

"""Matmul on GGUF Q8_0 and the K-quants through the HIP kernels of ``csrc/quant_matmul.hip``,
``csrc/quant_matmul_tiled.hip`` and ``csrc/quant_matmul_mv1.hip`` (JIT-built, cached); docs/OPS.md
section 11.

The int8 path only. Which variant runs is the planner's (``ftlab.backends.rules``: ``KERNELS``
says what each takes, ``DEFAULTS`` which runs and why, ``OPTIONS`` the one-row matvec's staging);
this module runs the one it is given, or raises ``BackendUnavailable``. Per regime:

- one row (decode of one sequence):
  ``"mv1"``: one launch -- every block quantizes x to Q8_1 in LDS (the quantize kernel's bits),
  lanes read a row's super-blocks as 16-byte pieces (``csrc/quant_vec.h``'s eighths; Q6_K in
  quads), y written in x's dtype. Its ``staging``: ``"held"`` (K up to 8192: activations in
  registers, the next row's pieces loaded before this row's sum), ``"staged"`` (K up to 2048, rows
  of whole 16-byte pieces, not Q8_0: rows copied into an LDS ring by asynchronous copies, the
  same sums as held), ``"sliced"`` / ``"sliced_q8"`` (K up to 16384: a long row's slices held by
  a block's lane groups, summed in LDS in a fixed order; ``sliced_q8`` given x's Q8_1 by its own
  launch). Takes Q4_0 and Q8_0 too, in groups of eight blocks (:func:`q4_0_one_row`).
  ``"vec"``: x's Q8_1 first, then eight lanes a K-quant super-block in 16-byte loads (three
  launches: quantize, matvec, cast), for rows mv1 cannot take.
  ``"lanes"``: a 32-thread group a row over a persistent grid (any type, any alignment).
- small batch (2..8 rows): ``"tiled"`` (lane groups take regions of 32 super-blocks, 16-byte
  loads transposed through LDS, K split while the row sets are few; w starting and ending
  16-byte aligned) and ``"lanes"``.
- prefill: ``"gemm"``, the dp4a-tiled GEMM (64x64 output tiles, weight units decoded into LDS).
"""

from __future__ import annotations

import torch

from ftlab import argcheck, backends, jit
from ftlab import platform as ftplatform
from ftlab.backends import calls
from ftlab.backends.calls import Call
from ftlab.backends.limits import TILED_SUPER_K
from ftlab.hip.q4_0 import q4_0_matmul, quantize_q8_1
from ftlab.quant import Q4_0Weight, QuantWeight

#: rows the matvecs are instantiated for (1..8); more go to quant_gemm_kernel
MATVEC_ROWS = 8
#: the weight type codes of ``quant_mv_fused`` / ``_staged`` / ``_sliced``
#: (csrc/quant_matmul_launch.hip;
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
#: the one-row matvec's entry points by staging (csrc/quant_matmul_launch.hip's OneRow)
MV1_ENTRY = {"held": "quant_mv_fused", "staged": "quant_mv_staged", "sliced": "quant_mv_sliced"}
#: the three-launch kernels' entry points by variant (after quantize_q8_1)
KERNEL_PREFIX = {"vec": "quant_mv_vec_", "lanes": "quant_mv_", "gemm": "quant_gemm_"}


def quant_matmul(
    x: torch.Tensor,
    w: QuantWeight,
    path: str,
    variant: str | None = None,
    staging: str | None = None,
    g: int | None = None,
    splits: int | None = None,
    call: Call | None = None,
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.quant_matmul` (``path == "int8"``): ``x [M, K] @
    w.T`` in x's dtype. ``variant``: one of ``ftlab.backends.rules.KERNELS[("quant_matmul",
    "hip")]``, None for the planner's default for this call; one that cannot take the call
    raises ``BackendUnavailable`` naming why. ``staging`` (variant ``"mv1"``: ``"held"``,
    ``"staged"``, ``"sliced"``, ``"sliced_q8"``; None: the planner's). A Q4_0 weight goes to
    :func:`q4_0_matmul` unless ``"mv1"`` is named (:func:`q4_0_one_row`). ``g`` / ``splits``
    override :func:`tiled_config` (benchmarks). ``call``: the planner's
    :class:`~ftlab.backends.Call` of these tensors (a plan passes it; made here when None). The
    shapes are checked here too: the op's checks may be off."""
    argcheck.matmul_layout(x, w)
    if path != "int8":
        raise ValueError(
            f"the hip backend implements quant_matmul's int8 path only, got path={path!r}"
        )
    if w.qtype == "Q4_0" and variant is None:
        return q4_0_matmul(x, w, "int8")
    call = call or calls.matmul(x, w)
    variant = backends.variant_for("quant_matmul", "hip", call, variant, path="int8")
    if staging is not None and variant != "mv1":
        raise ValueError(
            f"staging is an option of variant 'mv1', got staging={staging!r} with {variant!r}"
        )
    n = w.shape[0]
    module = jit.module_for("quant_matmul", x.device)
    if variant == "mv1":
        staging = backends.option_for("quant_matmul", "hip", "mv1", call, "staging", staging)
        y = torch.empty((1, n), dtype=x.dtype, device=x.device)
        code = FUSED_CODES[w.qtype]
        if staging == "sliced_q8":  # x's Q8_1 first (its own launch), which every block then reads
            x8 = quantize_q8_1(x)
            jit.on_device(
                x.device, lambda: module.quant_mv_sliced_q8(x8.q, x8.d, x8.s, w.data, code, y)
            )
            return y
        xc = x.contiguous()  # held, staged, sliced: x quantized in every block, y in x's dtype
        fn = getattr(module, MV1_ENTRY[staging])
        jit.on_device(x.device, lambda: fn(xc, w.data, code, y))
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


def q4_0_one_row(x: torch.Tensor, w: Q4_0Weight, staging: str | None = None) -> torch.Tensor:
    """``x [1, K] @ w.T`` on the int8 path through one of the one-launch one-row kernels
    (``quant_mv_fused`` / ``_staged`` / ``_sliced``), which take Q4_0 in groups of eight blocks
    (csrc/quant_records.h's ``Q4Eighth``: eight lanes a group, lane c taking block c whole), by
    ``staging``: ``"held"`` (K up to 8192), ``"staged"`` (up to 2048, rows through LDS by
    asynchronous copies), ``"sliced"`` (up to 16384, a row's slices of 2048 weights held by the
    lane groups of a block) or ``"sliced_q8"`` (the same given x's Q8_1 from its own launch); None:
    the planner's for the call. x is fp32 / fp16 / bf16 ``[1, K]``, K a multiple of 256, w's bytes
    contiguous and 16-byte aligned (else ``BackendUnavailable``); y ``[1, N]`` in x's dtype, within
    q4_0_matmul's int8 bound (its sums are grouped otherwise than the region matvec's)."""
    return quant_matmul(x, w, "int8", variant="mv1", staging=staging)


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

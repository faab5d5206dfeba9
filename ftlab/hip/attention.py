"""attention through the HIP kernels of ``csrc/attention.hip`` and ``csrc/attention_tiles.hip``
(JIT-built, cached): split-K decode attention.

- fp16 / bf16 caches of head dim 128 or 256 with 16-byte aligned rows (the models' static caches):
  one launch (``decode_attention_tiles``), a block per (key head, sequence, split), every sequence's
  live splits dispatched before any dead one, whose four row groups of 32 lanes walk its tiles with
  their own online softmax, holding their key and value rows in registers, and meet at the split's
  end; the last block of a (sequence, key head) to finish merges the splits (a counter per
  (sequence, key head) in one zeroed int32 buffer per device, made by the first call and left zeros
  by every launch; so, like the router's, one stream at a time on a device: two of these launches
  running at once on different streams would share counters).
- anything else (fp32, other head dims, unaligned rows): one block per (split, key head, sequence)
  staging tiles in LDS, and a second launch merging the splits."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends, jit
from ftlab import platform as ftplatform
from ftlab.backends import calls
from ftlab.backends.calls import Call
from ftlab.backends.limits import ATTENTION_TILE_HEAD_DIMS as TILE_HEAD_DIMS
from ftlab.hip.counters import zeroed_counters
from ftlab.quant import Q8_1
from ftlab.reference.attention import split_plan

#: the most splits the one-launch kernel takes a (sequence, key head)
TILE_MAX_SPLITS = 64
#: by head dim: the one-launch kernel's blocks resident on a multiprocessor (H200: 168 registers a
#: thread at head dim 128 fit 3, 255 at 256 fit 2) and the blocks a multiprocessor its split plan
#: aims at where the plan's splits of all sequences would not all be resident at once: a sequence's
#: live positions then go into at most ceil(TILE_BLOCKS_PER_SM * multiprocessors / (B * KVH)) splits
#: of whole tiles (:func:`tile_want`), so that the live blocks of all sequences about fill the GPU
#: (benchmarks/NOTES.md, "Decode attention by row groups")
TILE_RESIDENT_PER_SM = {128: 3, 256: 2}
TILE_BLOCKS_PER_SM = {128: 2.5, 256: 1.5}
#: the one-launch kernel's tile, counted as rows a thread at 8 elements a lane (4 or 2: tiles of 32
#: or 16 positions at head dim 128, 16 or 8 at 256; the kernel's threads hold tile / 4 rows each, a
#: row group's 32 lanes a row); a module setting, so a benchmark can compare the two
ROWS_PER_THREAD = 4


def tile_rows(d: int, rows: int | None = None) -> int:
    """Positions a tile of the one-launch kernel: ``128 / (d / 8) * rows`` (``rows`` default
    :data:`ROWS_PER_THREAD`)."""
    return 128 // (d // 8) * (ROWS_PER_THREAD if rows is None else rows)


def tile_plan(s: int, d: int, rows: int | None = None) -> tuple[int, int]:
    """(positions a split, splits) of the one-launch kernel for a cache of ``s`` positions: one
    tile a split while that keeps at most :data:`TILE_MAX_SPLITS` splits, else as many tiles a
    split as it takes."""
    tile = tile_rows(d, rows)
    chunk = tile * max(1, -(-s // (tile * TILE_MAX_SPLITS)))
    return chunk, max(1, -(-s // chunk))


def tile_want(b: int, kvh: int, device: torch.device, d: int) -> int:
    """The most live splits a (sequence, key head) of the one-launch kernel on ``device`` for ``b``
    sequences of ``kvh`` key heads of head dim ``d`` (128 or 256): :data:`TILE_MAX_SPLITS` where
    that many for every one are resident at once, else ~:data:`TILE_BLOCKS_PER_SM` blocks a
    multiprocessor over them; the kernel grows a sequence's split past the plan's chunk by whole
    tiles where its live positions would make more."""
    if d not in TILE_HEAD_DIMS:
        raise ValueError(
            f"the one-launch kernel takes head dim {' or '.join(map(str, TILE_HEAD_DIMS))}, got {d}"
        )
    sms, heads = ftplatform.multiprocessors(device), max(1, b * kvh)
    if heads * TILE_MAX_SPLITS <= TILE_RESIDENT_PER_SM[d] * sms:  # every split resident at once
        return TILE_MAX_SPLITS
    return max(1, min(TILE_MAX_SPLITS, -(-int(TILE_BLOCKS_PER_SM[d] * sms) // heads)))


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    quantize: bool = False,
    variant: str | None = None,
    call: Call | None = None,
) -> torch.Tensor | tuple[torch.Tensor, Q8_1]:
    """Backend entry of :func:`ftlab.ops.decode_attention` (ops checked the layouts; ``quantize``:
    also out's Q8_1, written by the one-launch kernel, else by hip's ``quantize_q8_1`` after).
    ``variant``: ``"tiles"`` (the one-launch kernel: fp16 / bf16, head dim 128 or 256, 16-byte
    aligned) or ``"split"``; None: the planner's default; one that cannot serve raises
    ``BackendUnavailable`` (as do more than 8 query heads a key head or head dim past 256). The
    layouts are checked here too: the op's checks may be off."""
    argcheck.decode_attention_layout(q, k, v, lengths)
    b, h, d = q.shape
    s, kvh = k.shape[1], k.shape[2]
    call = call or calls.attention(q, k, v)  # the planner's (a plan passes it), else made here
    variant = backends.variant_for("decode_attention", "hip", call, variant)
    out = q.new_empty((b, h, d))
    if b == 0 or s == 0:
        out.zero_()
        return _with_q8(out, quantize)
    if lengths.dtype != torch.int32:  # int64 values past int32 must not wrap: clamp first
        lengths = lengths.clamp(0, s).to(torch.int32)
    g = h // kvh
    module = jit.module_for("attention", q.device)
    tiles = variant == "tiles"
    rows = ROWS_PER_THREAD
    chunk, splits = tile_plan(s, d, rows) if tiles else split_plan(s)
    ml = q.new_empty((b, kvh, splits, g, 2) if splits > 1 else (1,), dtype=torch.float32)
    acc = q.new_empty((b, kvh, splits, g, d) if splits > 1 else (1,), dtype=torch.float32)
    if tiles:
        counters = zeroed_counters("decode_attention", q.device, max(b * kvh, 1024))
        want = tile_want(b, kvh, q.device, d)
        if quantize:  # the kernel writes out's Q8_1 too
            q8 = Q8_1.empty(b, h * d, q.device)
            jit.on_device(
                q.device,
                lambda: module.decode_attention_tiles_q8(
                    q,
                    k,
                    v,
                    lengths,
                    ml,
                    acc,
                    counters,
                    out,
                    q8.q,
                    q8.d,
                    q8.s,
                    chunk,
                    splits,
                    want,
                    rows,
                    float(scale),
                ),
            )
            return out, q8
        jit.on_device(
            q.device,
            lambda: module.decode_attention_tiles(
                q, k, v, lengths, ml, acc, counters, out, chunk, splits, want, rows, float(scale)
            ),
        )
    else:
        jit.on_device(
            q.device,
            lambda: module.decode_attention(
                q, k, v, lengths, ml, acc, out, chunk, splits, float(scale)
            ),
        )
    return _with_q8(out, quantize)


def _with_q8(out: torch.Tensor, quantize: bool) -> torch.Tensor | tuple[torch.Tensor, Q8_1]:
    """``out``, or ``(out, its Q8_1)`` by hip's quantize_q8_1 kernel (the paths that do not write
    it)."""
    if not quantize:
        return out
    from ftlab.hip.q4_0 import quantize_q8_1

    return out, quantize_q8_1(out.view(out.shape[0], -1))

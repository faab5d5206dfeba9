"""index / store in Triton (OPS.md section 1; reference: ftlab/reference/index_store.py).

Both ops are copies, so the kernels move the raw bits: tensors are viewed as same-width
integers (fp32 -> int32, fp16/bf16 -> int16, fp8 -> int8) before launch. The copy is then
bit-exact for every float dtype, including bf16 in the CPU interpreter (whose bf16
arithmetic is wrong), and the kernels never depend on the element type.

One program moves a ``[BLOCK_L, BLOCK_D]`` tile: BLOCK_L rows, BLOCK_D columns. The
wrapper picks BLOCK_D to cover a row in few tiles and BLOCK_L so that a tile is ~8 KiB.
Rows whose index is out of range (only possible with ``check=False``) are zero-filled by
index and skipped by store, so the kernels never touch memory outside the tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.bitview import as_bits

_TILE_BYTES = 8192


def tile(d: int, element_size: int) -> tuple[int, int]:
    """(BLOCK_L, BLOCK_D) for rows of ``d`` elements."""
    block_d = min(triton.next_power_of_2(max(d, 1)), max(16, _TILE_BYTES // element_size))
    block_l = max(1, min(64, _TILE_BYTES // (block_d * element_size)))
    return block_l, block_d


@triton.jit
def index_kernel(
    w_ptr,
    w_stride,
    idx_ptr,
    out_ptr,
    out_stride,
    L,
    D,
    N,
    mask_start,
    mask_len,
    HAS_MASK: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < L
    src = tl.load(idx_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    if HAS_MASK:
        # vocab-parallel shard: rows outside [start, start + len) read as zero
        src = src - mask_start
        inside = row_ok & (src >= 0) & (src < mask_len)
    else:
        inside = row_ok & (src >= 0) & (src < N)
    col_ok = cols[None, :] < D
    vals = tl.load(
        w_ptr + src[:, None] * w_stride + cols[None, :], mask=inside[:, None] & col_ok, other=0
    )
    dst = out_ptr + rows.to(tl.int64)[:, None] * out_stride + cols[None, :]
    tl.store(dst, vals, mask=row_ok[:, None] & col_ok)


@triton.jit
def store_kernel(
    kc_ptr,
    kc_stride,
    vc_ptr,
    vc_stride,
    idx_ptr,
    k_ptr,
    k_stride,
    v_ptr,
    v_stride,
    L,
    S,
    DK,
    DV,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < L
    slot = tl.load(idx_ptr + rows, mask=row_ok, other=-1).to(tl.int64)
    keep = row_ok & (slot >= 0) & (slot < S)  # -1: padding token, nothing to store
    rows64 = rows.to(tl.int64)
    mk = keep[:, None] & (cols[None, :] < DK)
    kv = tl.load(k_ptr + rows64[:, None] * k_stride + cols[None, :], mask=mk)
    tl.store(kc_ptr + slot[:, None] * kc_stride + cols[None, :], kv, mask=mk)
    mv = keep[:, None] & (cols[None, :] < DV)
    vv = tl.load(v_ptr + rows64[:, None] * v_stride + cols[None, :], mask=mv)
    tl.store(vc_ptr + slot[:, None] * vc_stride + cols[None, :], vv, mask=mv)


def index(
    weights: torch.Tensor, indices: torch.Tensor, out: torch.Tensor, mask_start: int, mask_len: int
) -> None:
    """Backend entry of :func:`ftlab.ops.index` (arguments already validated)."""
    (length,), (n, d) = indices.shape, weights.shape
    block_l, block_d = tile(d, weights.element_size())
    grid = (triton.cdiv(length, block_l), triton.cdiv(d, block_d))
    index_kernel[grid](
        as_bits(weights),
        weights.stride(0),
        indices,
        as_bits(out),
        out.stride(0),
        length,
        d,
        n,
        mask_start,
        mask_len,
        HAS_MASK=mask_len >= 0,
        BLOCK_L=block_l,
        BLOCK_D=block_d,
    )


def store(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Backend entry of :func:`ftlab.ops.store` (arguments already validated)."""
    length = indices.shape[0]
    dk, dv = k.shape[1], v.shape[1]
    block_l, block_d = tile(max(dk, dv), k.element_size())
    grid = (triton.cdiv(length, block_l), triton.cdiv(max(dk, dv), block_d))
    store_kernel[grid](
        as_bits(k_cache),
        k_cache.stride(0),
        as_bits(v_cache),
        v_cache.stride(0),
        indices,
        as_bits(k),
        k.stride(0),
        as_bits(v),
        v.stride(0),
        length,
        k_cache.shape[0],
        dk,
        dv,
        BLOCK_L=block_l,
        BLOCK_D=block_d,
    )

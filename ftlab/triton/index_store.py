"""index / store in Triton (docs/OPS.md section 1; reference: ftlab/reference/index_store.py).

Both ops are copies, so the kernels move the raw bits: tensors are viewed as same-width
integers (fp32 -> int32, fp16/bf16 -> int16, fp8 -> int8) before launch. The copy is then
bit-exact for every float dtype, including bf16 in the CPU interpreter (whose bf16
arithmetic is wrong), and the kernels never depend on the element type.

One program moves a ``[BLOCK_L, BLOCK_D]`` tile: BLOCK_L rows, BLOCK_D columns. The
wrapper picks BLOCK_D to cover a row in few tiles and BLOCK_L so that a tile holds ~4096
elements.
Rows whose index is out of range (only possible with ``check=False``) are zero-filled by
index and skipped by store, so the kernels never touch memory outside the tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab.bitview import as_bits

# Elements per tile: 32 per thread at 4 warps. Counted in elements, not bytes: each element
# carries its own address in registers, and 8 KiB tiles of 1-byte rows pushed sm_90 to the stack.
_TILE_ELEMENTS = 4096


def tile(d: int, element_size: int, rows: int = 1 << 16) -> tuple[int, int]:
    """(BLOCK_L, BLOCK_D) for ``rows`` rows of ``d`` elements of ``element_size`` bytes."""
    block_d = min(triton.next_power_of_2(max(d, 1)), 2048 if element_size > 1 else 1024)
    block_l = max(1, min(16, _TILE_ELEMENTS // block_d))  # more rows spill SGPRs on RDNA
    if rows <= 256:  # a decode step: smaller tiles spread the few rows over more SMs
        block_l = min(block_l, 2)
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
    block_l, block_d = tile(d, weights.element_size(), length)
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
    block_l, block_d = tile(max(dk, dv), k.element_size(), length)
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


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check): the same
    tiles on every target."""
    from ftlab.triton.compile_spec import spec

    def index_spec(bits: int, idx: int, has_mask: bool, d: int, rows: int = 1 << 16):
        block_l, block_d = tile(d, bits // 8, rows)
        label = f"index_kernel[i{bits} rows, i{idx} idx, mask={has_mask}, {block_l}x{block_d}]"
        return spec(
            index_kernel,
            label,
            types={"w_ptr": f"*i{bits}", "idx_ptr": f"*i{idx}", "out_ptr": f"*i{bits}"},
            constexprs={"HAS_MASK": has_mask, "BLOCK_L": block_l, "BLOCK_D": block_d},
        )

    def store_spec(bits: int, idx: int, d: int, rows: int = 1 << 16):
        block_l, block_d = tile(d, bits // 8, rows)
        rows_ptr = {name: f"*i{bits}" for name in ("kc_ptr", "vc_ptr", "k_ptr", "v_ptr")}
        return spec(
            store_kernel,
            f"store_kernel[i{bits} rows, i{idx} idx, {block_l}x{block_d}]",
            types={**rows_ptr, "idx_ptr": f"*i{idx}"},
            constexprs={"BLOCK_L": block_l, "BLOCK_D": block_d},
        )

    return [
        index_spec(16, 64, False, 1024),  # bf16 KV rows / embeddings, the benchmark's shape
        index_spec(16, 64, False, 1024, rows=64),  # the same at decode size
        index_spec(16, 32, True, 2048),  # vocab-parallel embedding shard
        index_spec(32, 64, False, 128),
        index_spec(8, 32, False, 4096),  # fp8 rows
        store_spec(16, 64, 1024),
        store_spec(16, 64, 1024, rows=64),
        store_spec(32, 32, 128),
    ]

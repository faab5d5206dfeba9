// index_store.hip — device code of index (row gather) and store (KV-cache row scatter).
//
// Contract: docs/OPS.md section 1; reference: ftlab/reference/index_store.py.
//
// Both ops are pure copies, so the kernels move raw bytes: the launcher picks the widest
// vector type (16/8/4/2/1 bytes) that divides the row size, every row stride and every
// base address, and the element dtype never reaches the device code. That makes the copy
// bit-exact for any dtype (fp32, fp16, bf16, fp8) and lets one row move in 16-byte loads.
//
// Layout of a block: blockDim.x threads share one row (a power of two, up to 256, sized so
// each thread moves about kCopyUnroll vectors), blockDim.y rows per block, 256 threads in all. This does not depend on the wave size,
// so the same code is right on wave32 (RDNA, NVIDIA) and wave64 (CDNA).
//
// Bounds: the launcher validates indices before launching (and raises). The kernels
// still never touch memory outside the tensors: with checks turned off, an index row
// whose source is out of range is zero-filled, and a store row whose slot is out of
// range (or -1, the padding marker) is skipped.
//
// Only port.h is included here: the gfx compile check compiles this file alone.
#include "port.h"

namespace ftlab {

constexpr int kCopyThreads = 256;
// Vectors each thread moves per row pass. All loads of a pass are issued before its stores,
// so every thread keeps kCopyUnroll * 16 bytes in flight: a row copy is latency-bound
// otherwise (the index load already costs one memory round trip before the data load).
constexpr int kCopyUnroll = 4;

template <typename Vec>
__device__ __forceinline__ void copy_row(Vec* __restrict__ dst, const Vec* __restrict__ src,
                                         int64_t n) {
  const int64_t step = blockDim.x;
  for (int64_t c = threadIdx.x; c < n; c += kCopyUnroll * step) {
    Vec r[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) r[u] = c + u * step < n ? src[c + u * step] : Vec{};
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      if (c + u * step < n) dst[c + u * step] = r[u];
    }
  }
}

template <typename Vec, typename Idx>
__global__ void __launch_bounds__(kCopyThreads)
    index_rows_kernel(const Vec* __restrict__ weights, int64_t w_stride,
                      const Idx* __restrict__ indices, Vec* __restrict__ out, int64_t out_stride,
                      int64_t num_indices, int64_t row_vecs, int64_t num_rows, int64_t mask_start,
                      int64_t mask_len) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (i >= num_indices) return;
  int64_t src = static_cast<int64_t>(indices[i]);
  bool inside;
  if (mask_len >= 0) {  // vocab-parallel shard: rows outside [start, start+len) are zero
    src -= mask_start;
    inside = src >= 0 && src < mask_len;
  } else {
    inside = src >= 0 && src < num_rows;
  }
  Vec* dst = out + i * out_stride;
  if (inside) {
    copy_row(dst, weights + src * w_stride, row_vecs);
  } else {
    const Vec zero{};
    for (int64_t c = threadIdx.x; c < row_vecs; c += blockDim.x) dst[c] = zero;
  }
}

// Small copies (a decode step's rows, fewer than 65536 vectors in all): one vector per thread,
// no loop, 32-bit positions; the first instructions are the index load and the data load.
template <typename Vec, typename Idx>
__global__ void __launch_bounds__(kCopyThreads)
    index_rows_small_kernel(const Vec* __restrict__ weights, int64_t w_stride,
                            const Idx* __restrict__ indices, Vec* __restrict__ out,
                            int64_t out_stride, int num_indices, int row_vecs, int64_t num_rows,
                            int64_t mask_start, int64_t mask_len) {
  const int i = blockIdx.x * blockDim.y + threadIdx.y;
  const int c = threadIdx.x;
  if (i >= num_indices || c >= row_vecs) return;
  const int64_t src = static_cast<int64_t>(indices[i]) - (mask_len >= 0 ? mask_start : 0);
  const bool inside = src >= 0 && src < (mask_len >= 0 ? mask_len : num_rows);
  out[i * out_stride + c] = inside ? weights[src * w_stride + c] : Vec{};
}

template <typename Vec, typename Idx>
__global__ void __launch_bounds__(kCopyThreads)
    store_rows_kernel(Vec* __restrict__ k_cache, int64_t kc_stride, Vec* __restrict__ v_cache,
                      int64_t vc_stride, const Idx* __restrict__ indices,
                      const Vec* __restrict__ k, int64_t k_stride, const Vec* __restrict__ v,
                      int64_t v_stride, int64_t num_indices, int64_t k_vecs, int64_t v_vecs,
                      int64_t num_slots) {
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl)
  port_pdl_trigger();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (i >= num_indices) return;
  const int64_t slot = static_cast<int64_t>(indices[i]);
  if (slot < 0 || slot >= num_slots) return;  // -1: padding token, nothing to store
  copy_row(k_cache + slot * kc_stride, k + i * k_stride, k_vecs);
  copy_row(v_cache + slot * vc_stride, v + i * v_stride, v_vecs);
}

// Every configuration the launcher uses, instantiated here so that a device-only
// compile emits machine code for each (and the compile check sees all of them).
#define FTLAB_INDEX_STORE_INSTANTIATE(Vec, Idx)                                               \
  template __global__ void index_rows_small_kernel<Vec, Idx>(const Vec*, int64_t, const Idx*, \
                                                             Vec*, int64_t, int, int, int64_t,  \
                                                             int64_t, int64_t);                 \
  template __global__ void index_rows_kernel<Vec, Idx>(const Vec*, int64_t, const Idx*, Vec*, \
                                                       int64_t, int64_t, int64_t, int64_t,    \
                                                       int64_t, int64_t);                     \
  template __global__ void store_rows_kernel<Vec, Idx>(Vec*, int64_t, Vec*, int64_t,          \
                                                       const Idx*, const Vec*, int64_t,       \
                                                       const Vec*, int64_t, int64_t, int64_t, \
                                                       int64_t, int64_t);

#define FTLAB_INDEX_STORE_INSTANTIATE_VEC(Vec) \
  FTLAB_INDEX_STORE_INSTANTIATE(Vec, int32_t)  \
  FTLAB_INDEX_STORE_INSTANTIATE(Vec, int64_t)

FTLAB_INDEX_STORE_INSTANTIATE_VEC(bytes16)
FTLAB_INDEX_STORE_INSTANTIATE_VEC(bytes8)
FTLAB_INDEX_STORE_INSTANTIATE_VEC(bytes4)
FTLAB_INDEX_STORE_INSTANTIATE_VEC(bytes2)
FTLAB_INDEX_STORE_INSTANTIATE_VEC(bytes1)

}  // namespace ftlab

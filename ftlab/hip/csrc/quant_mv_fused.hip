// quant_mv_fused.hip — device code of the one-row int8 matvec of K-quant weights (Q4_K, Q5_K,
// Q6_K) in one launch: x (fp32 / fp16 / bf16) quantized to Q8_1 in every block, the weights read
// as quant_vec.h's 16-byte pieces, y written in x's dtype. The decode step's attention
// projections take it where the quantize, matvec and cast were three launches.
//
// Contract: docs/OPS.md section 11 (quant_matmul, int8 path); reference:
// ftlab/reference/quant_matmul.py. Includes quant_records.h (then quant_vec.h, quant_units.h,
// q4_0_common.h and port.h) only: the gfx compile check compiles this file alone.
#pragma once
#include "quant_records.h"

namespace ftlab {
namespace qmm {

constexpr int kFusedSteps = 2;  // steps of four super-blocks a lane holds activations for (K <= 2048)
constexpr int kFusedThreads = 256;  // 8 groups of 32 lanes a block
constexpr int kFusedMaxK = 8192;    // x's activation records in LDS: 32 super-blocks, 10.5 KiB

// y[n] (x's dtype) = the int8 dot of weight row n with the Q8_1 of x [K] (fp32 / fp16 / bf16), in
// one launch: each block quantizes x into activation records in LDS (q4_0_common.h's
// quantize_records: quantize_q8_1_kernel's bits), then its groups walk rows n = block * 8 + group,
// + 8 * grid, ... with quant_vec.h's pieces (eight lanes a super-block, 16-byte loads). Where a row is
// at most two steps (K <= 2048) each lane's activation halves stay in registers and the next row's
// pieces are loaded before this row's terms are summed; the group's first row is asked of the L2
// before the wait on the kernel before (launch_pdl: prefetches only). w 16-byte aligned.
template <typename T, typename Q>
__global__ void __launch_bounds__(kFusedThreads)
    quant_mv1_fused_kernel(const typename T::storage* __restrict__ x, const uint8_t* __restrict__ w,
                           int64_t row_bytes, typename T::storage* __restrict__ y, int64_t n_rows, int k) {
  using V = Vec<Q>;
  __shared__ bytes16 rec_v[kFusedMaxK / 256 * kRecordWords / 4];
  uint32_t* rec = reinterpret_cast<uint32_t*>(rec_v);
  const int group = threadIdx.x / kGroup, lane = threadIdx.x % kGroup;
  const int c = lane & 7, half = lane & 1, s0 = lane >> 3;
  const int supers = k / Q::kBlock;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (kFusedThreads / kGroup);
  int64_t n = static_cast<int64_t>(blockIdx.x) * (kFusedThreads / kGroup) + group;
  if (supers <= 4 * kFusedSteps) {
    bool has[kFusedSteps];
#pragma unroll
    for (int t = 0; t < kFusedSteps; ++t) {
      has[t] = s0 + 4 * t < supers;
      // the first row's lines asked of the L2 while the kernel before finishes (a hint: no data
      // is read before the wait, so weights written by that kernel are never seen stale)
      if (PORT_HAS_L2_PREFETCH && has[t] && n < n_rows)  // eight lanes spread over the super-block
        port_prefetch_l2(w + n * row_bytes + (s0 + 4 * t) * Q::kBytes + Q::kBytes * c / 8);
    }
    port_pdl_wait();  // launched dependent on the kernel before (launch_pdl): w and x only after this
    port_pdl_trigger();
    V cur[kFusedSteps];
#pragma unroll
    for (int t = 0; t < kFusedSteps; ++t) {
      if (has[t] && n < n_rows) cur[t].load(w + n * row_bytes + (s0 + 4 * t) * Q::kBytes, c);
    }
    quantize_records<T, 1, kFusedThreads>(x, 0, k / kQK, threadIdx.x, rec);
    __syncthreads();
    XHalf xh[kFusedSteps];
#pragma unroll
    for (int t = 0; t < kFusedSteps; ++t) {
      if (has[t]) xhalf_of_record(xh[t], rec + (s0 + 4 * t) * kRecordWords, V::unit_a(c), V::unit_b(c), half);
    }
    for (; n < n_rows; n += stride) {  // uniform in a group: the shuffles stay in-group
      V next[kFusedSteps];
#pragma unroll
      for (int t = 0; t < kFusedSteps; ++t) {
        if (has[t] && n + stride < n_rows) next[t].load(w + (n + stride) * row_bytes + (s0 + 4 * t) * Q::kBytes, c);
      }
      float acc = 0.0f;
#pragma unroll
      for (int t = 0; t < kFusedSteps; ++t)
        if (has[t]) acc += cur[t].term(c, xh[t]);
      acc = group_sum(acc);
      if (lane == 0) y[n] = T::from_float(acc);
#pragma unroll
      for (int t = 0; t < kFusedSteps; ++t) cur[t] = next[t];
    }
    return;
  }
  port_pdl_wait();
  port_pdl_trigger();
  quantize_records<T, 1, kFusedThreads>(x, 0, k / kQK, threadIdx.x, rec);
  __syncthreads();
  for (; n < n_rows; n += stride) {
    const uint8_t* row = w + n * row_bytes;
    float acc = 0.0f;
    for (int base = 0; base < supers; base += 4 * kFusedSteps) {
      V p[kFusedSteps];
#pragma unroll
      for (int t = 0; t < kFusedSteps; ++t)
        if (base + s0 + 4 * t < supers) p[t].load(row + (base + s0 + 4 * t) * Q::kBytes, c);
#pragma unroll
      for (int t = 0; t < kFusedSteps; ++t) {
        const int s = base + s0 + 4 * t;
        if (s < supers) {
          XHalf xs;
          xhalf_of_record(xs, rec + s * kRecordWords, V::unit_a(c), V::unit_b(c), half);
          acc += p[t].term(c, xs);
        }
      }
    }
    acc = group_sum(acc);
    if (lane == 0) y[n] = T::from_float(acc);
  }
}

#define FTLAB_QMM_FUSED(T, Q)                                                                         \
  template __global__ void quant_mv1_fused_kernel<T, Q>(const T::storage*, const uint8_t*, int64_t, T::storage*, \
                                                        int64_t, int);
#define FTLAB_QMM_FUSED_T(T) FTLAB_QMM_FUSED(T, QK4<false>) FTLAB_QMM_FUSED(T, QK4<true>) FTLAB_QMM_FUSED(T, Q6_K)
FTLAB_QMM_FUSED_T(f32_t)
FTLAB_QMM_FUSED_T(f16_t)
FTLAB_QMM_FUSED_T(bf16_t)
#undef FTLAB_QMM_FUSED_T
#undef FTLAB_QMM_FUSED

}  // namespace qmm
}  // namespace ftlab

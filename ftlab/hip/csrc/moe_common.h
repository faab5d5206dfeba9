// moe_common.h — device helpers shared by the routed-MoE kernels (moe_route.hip, moe.hip,
// moe_gemm.hip): the block shape, the LDS budgets of the decode kernels, a block-wide
// reduction and a 32-lane group sum.
//
// Wave-size generic: block-wide reductions go through LDS, and the 32-lane row groups
// reduce with xor shuffles below 32, which stay inside a 32-lane half of a wave64.
#pragma once
#include "q4_0_common.h"

namespace ftlab {

constexpr int kMoeThreads = 256;
constexpr int kMoeGroup = 32;                      // lanes that share one output row
constexpr int kMoeRows = kMoeThreads / kMoeGroup;  // output rows per decode block
constexpr int kMaxExperts = 1024;                  // the router: 32 logits a lane at most
constexpr int kMaxQ8Blocks = 256;                  // decode: x (H) or k x I of h, in Q8_1 blocks
constexpr int kDecodeFloats = kMaxQ8Blocks * kQK;  // decode: ... or as fp32 (32 KiB)
constexpr int kQ8Stride = 9;                       // LDS words per Q8_1 block: 8, +1 of padding

struct SumOp {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const { return a + b; }
};

// The reduction of v over the block (a tree in LDS; every thread gets the result).
template <typename V, typename Op>
__device__ V block_reduce(V v, V* red, Op op) {
  const int tid = threadIdx.x;
  red[tid] = v;
  __syncthreads();
  for (int s = kMoeThreads / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] = op(red[tid], red[tid + s]);
    __syncthreads();
  }
  const V r = red[0];
  __syncthreads();
  return r;
}

// Sum over a 32-lane group (xor shuffles below 32 stay inside a wave64 half).
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int off = kMoeGroup / 2; off > 0; off >>= 1) v += port_shfl_xor(v, off);
  return v;
}

// The decode experts (moe.hip, moe_regions.hip): top_k at most kMaxSlots; the down kernels give a
// block 8 rows of y, kDownLanes lanes a row.
constexpr int kMaxSlots = 32;
constexpr int kDownLanes = 4;
constexpr int kDownRows = kMoeGroup / kDownLanes;  // 8 rows of y per block

// h = silu(g) * u for the 32 rows of gu (g at gu[i], u at gu[32 + i]), by lane i of a whole
// 32-lane group, written as one Q8_1 block (q[i]; lane 0 writes *d and *s): the arithmetic of
// quantize_q8_1_kernel on fp32 h.
__device__ __forceinline__ void silu_mul_q8_1(const float* gu, int i, int8_t* q, float* d, float* s) {
  const float g = gu[i];
  const float h = g / (1.0f + port_expf(-g)) * gu[kQK + i];
  float amax = __builtin_fabsf(h);
#pragma unroll
  for (int off = kMoeGroup / 2; off > 0; off >>= 1) amax = __builtin_fmaxf(amax, port_shfl_xor(amax, off));
  const float dd = port_div_rn(amax, 127.0f);
  int qi = amax == 0.0f ? 0 : static_cast<int>(round_half_away(port_div_rn(h, dd)));
  q[i] = static_cast<int8_t>(qi);
#pragma unroll
  for (int off = kMoeGroup / 2; off > 0; off >>= 1) qi += port_shfl_xor(qi, off);
  if (i == 0) {
    *d = dd;
    *s = dd * static_cast<float>(qi);
  }
}

}  // namespace ftlab

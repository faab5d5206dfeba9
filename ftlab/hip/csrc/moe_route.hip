// moe_route.hip — device code of the MoE router (top-k over the softmax of the router logits)
// and of the align step (the (token, slot) pairs grouped by expert for the grouped GEMMs).
//
// Contract: docs/OPS.md section 3 (route_topk, moe_align); reference: ftlab/reference/moe.py.
// Includes moe_common.h (then q4_0_common.h and port.h) only: the gfx compile check compiles
// this file alone.
#include "moe_common.h"

namespace ftlab {

// ------------------------------------------------------------------ router

constexpr int kRouteTokens = kMoeThreads / kMoeGroup;  // tokens per block, a 32-lane group each

// A 32-lane group per token, no block barriers: lane l holds the logits of experts
// l, l + 32, ... (PER of them, in registers), max and sum by shuffles, p = exp(x - max) / sum
// in fp32, then k rounds of argmax (each lane over its experts in ascending order, then a
// shuffle tree; the lower id wins a tie) and the renormalization, the k weights summed in
// slot order. PER * 32 >= E.
template <typename T, int PER>
__global__ void __launch_bounds__(kMoeThreads)
    moe_route_topk_kernel(const typename T::storage* __restrict__ logits, int64_t stride,
                          float* __restrict__ w_out, int32_t* __restrict__ ids_out, int64_t tokens,
                          int num_experts, int top_k, int renorm) {
  const int lane = threadIdx.x % kMoeGroup, group = threadIdx.x / kMoeGroup;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteTokens + group;
  if (t >= tokens) return;  // whole groups: no barrier below
  const typename T::storage* row = logits + t * stride;
  float p[PER];
  float m = -__builtin_inff();
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + i * kMoeGroup;
    p[i] = e < num_experts ? T::load(row + e) : -__builtin_inff();
    m = __builtin_fmaxf(m, p[i]);
  }
#pragma unroll
  for (int off = kMoeGroup / 2; off > 0; off >>= 1) m = __builtin_fmaxf(m, port_shfl_xor(m, off));
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    p[i] = lane + i * kMoeGroup < num_experts ? port_expf(p[i] - m) : 0.0f;
    s += p[i];
  }
  s = group_sum(s);
#pragma unroll
  for (int i = 0; i < PER; ++i) p[i] = lane + i * kMoeGroup < num_experts ? port_div_rn(p[i], s) : -1.0f;
  float wsum = 0.0f, mine = 0.0f;  // lane j keeps slot j's weight (top_k <= 32)
  for (int j = 0; j < top_k; ++j) {
    float best = -1.0f;
    int besti = num_experts;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      if (p[i] > best) {  // ascending expert ids: strict keeps the lower id of a tie
        best = p[i];
        besti = lane + i * kMoeGroup;
      }
    }
#pragma unroll
    for (int off = kMoeGroup / 2; off > 0; off >>= 1) {
      const float ov = port_shfl_xor(best, off);
      const int oi = port_shfl_xor(besti, off);
      if (ov > best || (ov == best && oi < besti)) {
        best = ov;
        besti = oi;
      }
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      if (lane + i * kMoeGroup == besti) p[i] = -1.0f;  // taken
    }
    if (lane == 0) ids_out[t * top_k + j] = besti;
    if (lane == j) mine = best;
    wsum += best;
  }
  if (lane < top_k) w_out[t * top_k + lane] = renorm ? port_div_rn(mine, wsum) : mine;
}

// ------------------------------------------------------------------ align

// counts[e] = number of (token, slot) pairs routed to expert e; one block per expert.
__global__ void __launch_bounds__(kMoeThreads)
    moe_align_count_kernel(const int32_t* __restrict__ ids, int64_t pairs, int32_t* __restrict__ counts) {
  __shared__ int red[kMoeThreads];
  const int e = blockIdx.x;
  int c = 0;
  for (int64_t p = threadIdx.x; p < pairs; p += kMoeThreads) c += ids[p] == e;
  c = block_reduce(c, red, SumOp{});
  if (threadIdx.x == 0) counts[e] = c;
}

// Expert e (one block) writes its pairs in flat order from its row offset (the padded counts
// of the experts before it), the sentinel `pairs` in its padding rows and its id for its
// blocks of block_m rows; the blocks share the rows past the end (sentinel, expert id -1).
// Deterministic, no atomics, no host synchronization.
__global__ void __launch_bounds__(kMoeThreads)
    moe_align_scatter_kernel(const int32_t* __restrict__ ids, int64_t pairs,
                             const int32_t* __restrict__ counts, int num_experts, int block_m,
                             int32_t* __restrict__ sorted, int32_t* __restrict__ expert_ids,
                             int32_t* __restrict__ npad, int64_t capacity) {
  __shared__ int red[kMoeThreads];
  __shared__ int scan[kMoeThreads];
  const int tid = threadIdx.x;
  const int e = blockIdx.x;
  int before = 0, total = 0;
  for (int x = tid; x < num_experts; x += kMoeThreads) {
    const int padded = (counts[x] + block_m - 1) / block_m * block_m;
    total += padded;
    if (x < e) before += padded;
  }
  before = block_reduce(before, red, SumOp{});
  total = block_reduce(total, red, SumOp{});
  const int count = counts[e];
  int rank = 0;
  for (int64_t p0 = 0; p0 < pairs && rank < count; p0 += kMoeThreads) {
    const int64_t p = p0 + tid;
    const int mine = p < pairs && ids[p] == e;
    scan[tid] = mine;
    __syncthreads();
    for (int off = 1; off < kMoeThreads; off <<= 1) {  // inclusive scan (Hillis-Steele)
      const int v = tid >= off ? scan[tid - off] : 0;
      __syncthreads();
      scan[tid] += v;
      __syncthreads();
    }
    if (mine) sorted[before + rank + scan[tid] - 1] = static_cast<int32_t>(p);
    rank += scan[kMoeThreads - 1];
    __syncthreads();
  }
  const int padded = (count + block_m - 1) / block_m * block_m;
  for (int r = count + tid; r < padded; r += kMoeThreads) sorted[before + r] = static_cast<int32_t>(pairs);
  for (int b = tid; b < padded / block_m; b += kMoeThreads) expert_ids[before / block_m + b] = e;
  const int64_t spread = static_cast<int64_t>(num_experts) * kMoeThreads;
  for (int64_t r = total + static_cast<int64_t>(e) * kMoeThreads + tid; r < capacity; r += spread) {
    sorted[r] = static_cast<int32_t>(pairs);
  }
  for (int64_t b = total / block_m + static_cast<int64_t>(e) * kMoeThreads + tid; b < capacity / block_m;
       b += spread) {
    expert_ids[b] = -1;
  }
  if (e == 0 && tid == 0) *npad = total;
}

// Every configuration the launcher uses.
#define FTLAB_MOE_ROUTE_INSTANTIATE(T)                                                                  \
  template __global__ void moe_route_topk_kernel<T, 4>(const T::storage*, int64_t, float*, int32_t*,   \
                                                       int64_t, int, int, int);                         \
  template __global__ void moe_route_topk_kernel<T, 32>(const T::storage*, int64_t, float*, int32_t*,  \
                                                        int64_t, int, int, int);
FTLAB_MOE_ROUTE_INSTANTIATE(f32_t)
FTLAB_MOE_ROUTE_INSTANTIATE(f16_t)
FTLAB_MOE_ROUTE_INSTANTIATE(bf16_t)

}  // namespace ftlab

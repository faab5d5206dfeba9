// moe_route.hip — device code of the MoE router (top-k over the softmax of the router logits)
// and of the align step (the (token, slot) pairs grouped by expert for the grouped GEMMs).
//
// Contract: docs/OPS.md section 3 (route_topk, moe_align); reference: ftlab/reference/moe.py.
// Includes moe_common.h (then q4_0_common.h and port.h) only: the gfx compile check compiles
// this file alone.
#include "moe_common.h"
#include "norm_common.h"

namespace ftlab {

// ------------------------------------------------------------------ router

constexpr int kRouteTokens = kMoeThreads / kMoeGroup;  // tokens per block, a 32-lane group each

// The top-k of one token by a 32-lane group, no block barriers: lane l holds the logits of
// experts l, l + 32, ... in p (PER of them, -inf past E), max and sum by shuffles,
// p = exp(x - max) / sum in fp32, then k rounds of argmax (each lane over its experts in
// ascending order, then a shuffle tree; the lower id wins a tie) and the renormalization, the
// k weights summed in slot order. PER * 32 >= E.
template <int PER>
__device__ __forceinline__ void route_group(float p[PER], int lane, int num_experts, int top_k, int renorm,
                                            float* w_out, int32_t* ids_out) {
  float m = -__builtin_inff();
#pragma unroll
  for (int i = 0; i < PER; ++i) m = __builtin_fmaxf(m, p[i]);
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
    if (lane == 0) ids_out[j] = besti;
    if (lane == j) mine = best;
    wsum += best;
  }
  if (lane < top_k) w_out[lane] = renorm ? port_div_rn(mine, wsum) : mine;
}

// A 32-lane group per token (route_group on the token's logits row).
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
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + i * kMoeGroup;
    p[i] = e < num_experts ? T::load(row + e) : -__builtin_inff();
  }
  route_group<PER>(p, lane, num_experts, top_k, renorm, w_out + t * top_k, ids_out + t * top_k);
}

// ------------------------------------------------------------------ router: logits and top-k, one launch

constexpr int kRouterRows = kMoeThreads / kMoeGroup;  // logits a block: a 32-lane group each

// logits[t, e] = x[t] . w[e] (an fp32 dot, rounded to T), then the top-k of token t (route_group)
// by the last of its blocks to finish: grid (ceil(E / 8), T), block b's groups take experts
// 8b..8b+7. Each block's writers fence their logits, then thread 0 counts the block done in
// counters[t]; the block that sees count E-blocks - 1 resets the counter to 0 (for the next
// call, graph replays included), reads the row back past L1 and routes it. `vec`: x and w rows
// 16-byte aligned with H % 8 == 0 (8 elements a load).
template <typename T, int PER>
__global__ void __launch_bounds__(kMoeThreads)
    moe_router_topk_kernel(const typename T::storage* __restrict__ x, int64_t x_stride,
                           const typename T::storage* __restrict__ w, int64_t w_stride, int64_t hidden,
                           typename T::storage* logits, float* __restrict__ w_out, int32_t* __restrict__ ids_out,
                           uint32_t* __restrict__ counters, int num_experts, int top_k, int renorm, bool vec) {
  __shared__ int last;
  const int lane = threadIdx.x % kMoeGroup, group = threadIdx.x / kMoeGroup;
  const int64_t t = blockIdx.y;
  const int e = static_cast<int>(blockIdx.x) * kRouterRows + group;
  if (PORT_HAS_L2_PREFETCH && e < num_experts) {  // the weight row, asked of the L2 while the kernel before finishes
    constexpr int64_t kLine = 128 / sizeof(*w);  // elements a 128-byte line
    for (int64_t i = kLine * lane; i < hidden; i += kLine * kMoeGroup) port_prefetch_l2(w + e * w_stride + i);
  }
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl): x only after this
  port_pdl_trigger();
  if (e < num_experts) {
    const typename T::storage* xr = x + t * x_stride;
    const typename T::storage* wr = w + e * w_stride;
    float acc = 0.0f;
    if (vec) {
      for (int64_t i = 8 * lane; i < hidden; i += 8 * kMoeGroup) {
        float a[8], b[8];
        load8<T>(xr + i, true, a);
        load8<T>(wr + i, true, b);
#pragma unroll
        for (int c = 0; c < 8; ++c) acc += a[c] * b[c];
      }
    } else {
      for (int64_t i = lane; i < hidden; i += kMoeGroup) acc += T::load(xr + i) * T::load(wr + i);
    }
    acc = group_sum(acc);
    if (lane == 0) {
      logits[t * num_experts + e] = T::from_float(acc);
      port_fence_device();  // the logit is visible to every block before this block counts
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // every logit of the block is stored and fenced; then count the block done
    port_fence_device();
    last = port_atomic_add(&counters[t], 1u) == gridDim.x - 1;
    if (last) port_fence_device();  // the other blocks' logits are visible after the last count
  }
  __syncthreads();
  if (!last || group != 0) return;
  port_fence_device();
  if (lane == 0) counters[t] = 0u;
  const volatile typename T::storage* row = logits + t * num_experts;  // written by other blocks: not from L1
  float p[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int ex = lane + i * kMoeGroup;
    typename T::storage bits{};
    if (ex < num_experts) bits = row[ex];
    p[i] = ex < num_experts ? T::load(&bits) : -__builtin_inff();
  }
  route_group<PER>(p, lane, num_experts, top_k, renorm, w_out + t * top_k, ids_out + t * top_k);
}

// ------------------------------------------------------------------ residual add, RMSNorm and router, one launch

// add_rmsnorm then router_topk of its output, one launch (the grid of moe_router_topk_kernel):
// every block first computes token t's s = x + residual and y = RMSNorm(s) * norm_w with
// add_rmsnorm_kernel's arithmetic (kNormThreads == kMoeThreads threads, V-element pieces, the
// same sums in the same order: its bits), y kept in LDS; block 0 of the token also stores s and
// y. Then the block's logits from the LDS copy of y (the loads of moe_router_topk_kernel, from
// LDS), and the last block routes the token. H a multiple of V, at most kNormThreads *
// kNormCache * V (no second pass), every row of x, residual, s, y and the weight 16-byte aligned.

template <typename T, int V, int PER>
__global__ void __launch_bounds__(kMoeThreads)
    moe_norm_router_topk_kernel(const typename T::storage* __restrict__ x, int64_t x_row,
                                const typename T::storage* __restrict__ res, int64_t r_row,
                                const typename T::storage* __restrict__ norm_w, typename T::storage* __restrict__ s_out,
                                typename T::storage* __restrict__ y_out, float eps,
                                const typename T::storage* __restrict__ w, int64_t w_stride, int64_t hidden,
                                typename T::storage* logits, float* __restrict__ w_out, int32_t* __restrict__ ids_out,
                                uint32_t* __restrict__ counters, int num_experts, int top_k, int renorm, bool vec) {
  static_assert(kNormThreads == kMoeThreads, "the norm's reduction order is that of kNormThreads threads");
  typedef typename T::storage S;
  __shared__ __attribute__((aligned(16))) S ys[kNormThreads * kNormCache * V];  // y: 16 KiB
  __shared__ float partial[kNormPartials];
  __shared__ int last;
  const int lane = threadIdx.x % kMoeGroup, group = threadIdx.x / kMoeGroup;
  const int64_t t = blockIdx.y;
  const int e = static_cast<int>(blockIdx.x) * kRouterRows + group;
  if (PORT_HAS_L2_PREFETCH && e < num_experts) {  // the weight row, asked of the L2 while the kernel before finishes
    constexpr int64_t kLine = 128 / sizeof(*w);
    for (int64_t i = kLine * lane; i < hidden; i += kLine * kMoeGroup) port_prefetch_l2(w + e * w_stride + i);
  }
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl): x and the residual only after this
  port_pdl_trigger();
  // the norm: add_rmsnorm_kernel's first pass and reduction, its second pass into LDS
  const bool first = blockIdx.x == 0;
  const int h = static_cast<int>(hidden);
  const int tid = static_cast<int>(threadIdx.x);
  norm_pieces<T, V> xs[kNormCache], rs[kNormCache];
#pragma unroll
  for (int c = 0; c < kNormCache; ++c) {
    const int64_t at = static_cast<int64_t>(tid + c * kNormThreads) * V;
    if (at < h) {
      norm_fetch<T, V>(x + t * x_row + at, xs[c]);
      norm_fetch<T, V>(res + t * r_row + at, rs[c]);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < kNormCache; ++c) {
    const int64_t at = static_cast<int64_t>(tid + c * kNormThreads) * V;
    if (at < h) ss += norm_sum<T, V>(xs[c], rs[c], s_out + t * hidden + at, true, first);
  }
#pragma unroll
  for (int m = PORT_WARP_SIZE / 2; m > 0; m >>= 1) ss += port_shfl_xor(ss, m);
  if (tid % PORT_WARP_SIZE == 0) partial[tid / PORT_WARP_SIZE] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormThreads / PORT_WARP_SIZE; ++k) total += partial[k];
  float r = 1.0f / port_sqrtf(total / static_cast<float>(h) + eps);
  if (total == __builtin_inff())  // the squares overflowed (norm_common.h): summed again, scaled
    r = norm_scaled_factor(norm_block_sum(norm_cached_scaled_squares<T, V>(xs, tid, h), partial, tid), h, eps);
#pragma unroll
  for (int c = 0; c < kNormCache; ++c) {
    const int64_t at = static_cast<int64_t>(tid + c * kNormThreads) * V;
    if (at < h) {
      norm_pieces<T, V> wraw, out;
      norm_fetch<T, V>(norm_w + at, wraw);
      float wv[V];
      norm_floats<T, V>(wraw, wv);
      norm_make<T, V>(xs[c], wv, r, out);
      norm_put<T, V>(ys + at, out);
      if (first) norm_put<T, V>(y_out + t * hidden + at, out);
    }
  }
  __syncthreads();
  // the router: moe_router_topk_kernel's dot, x read from LDS
  if (e < num_experts) {
    const S* wr = w + e * w_stride;
    float acc = 0.0f;
    if (vec) {
      for (int64_t i = 8 * lane; i < hidden; i += 8 * kMoeGroup) {
        float a[8], b[8];
        load8<T>(ys + i, true, a);
        load8<T>(wr + i, true, b);
#pragma unroll
        for (int c = 0; c < 8; ++c) acc += a[c] * b[c];
      }
    } else {
      for (int64_t i = lane; i < hidden; i += kMoeGroup) acc += T::load(ys + i) * T::load(wr + i);
    }
    acc = group_sum(acc);
    if (lane == 0) {
      logits[t * num_experts + e] = T::from_float(acc);
      port_fence_device();
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    port_fence_device();
    last = port_atomic_add(&counters[t], 1u) == gridDim.x - 1;
    if (last) port_fence_device();
  }
  __syncthreads();
  if (!last || group != 0) return;
  port_fence_device();
  if (lane == 0) counters[t] = 0u;
  const volatile S* row = logits + t * num_experts;
  float p[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int ex = lane + i * kMoeGroup;
    S bits{};
    if (ex < num_experts) bits = row[ex];
    p[i] = ex < num_experts ? T::load(&bits) : -__builtin_inff();
  }
  route_group<PER>(p, lane, num_experts, top_k, renorm, w_out + t * top_k, ids_out + t * top_k);
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
                                                        int64_t, int, int, int);                         \
  template __global__ void moe_router_topk_kernel<T, 4>(const T::storage*, int64_t, const T::storage*, \
                                                        int64_t, int64_t, T::storage*, float*, int32_t*, \
                                                        uint32_t*, int, int, int, bool);                 \
  template __global__ void moe_router_topk_kernel<T, 32>(const T::storage*, int64_t, const T::storage*,\
                                                         int64_t, int64_t, T::storage*, float*, int32_t*,\
                                                         uint32_t*, int, int, int, bool);
#define FTLAB_NORM_ROUTER_INSTANTIATE(T, V, PER)                                                        \
  template __global__ void moe_norm_router_topk_kernel<T, V, PER>(                                       \
      const T::storage*, int64_t, const T::storage*, int64_t, const T::storage*, T::storage*, T::storage*, \
      float, const T::storage*, int64_t, int64_t, T::storage*, float*, int32_t*, uint32_t*, int, int, int,  \
      bool);
#define FTLAB_NORM_ROUTER_WIDTHS(T, V) FTLAB_NORM_ROUTER_INSTANTIATE(T, V, 4) FTLAB_NORM_ROUTER_INSTANTIATE(T, V, 32)
FTLAB_NORM_ROUTER_WIDTHS(f32_t, 4)
FTLAB_NORM_ROUTER_WIDTHS(f16_t, 8)
FTLAB_NORM_ROUTER_WIDTHS(bf16_t, 8)
FTLAB_MOE_ROUTE_INSTANTIATE(f32_t)
FTLAB_MOE_ROUTE_INSTANTIATE(f16_t)
FTLAB_MOE_ROUTE_INSTANTIATE(bf16_t)

}  // namespace ftlab

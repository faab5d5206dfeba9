// moe_kquant.hip — device code of the routed experts on banks of GGUF Q8_0 and the K-quants
// (Q4_K, Q5_K, Q6_K; a Q4_0 bank beside one of them too: Q4_K_M is Q4_K gate/up, Q6_K down) at
// decode, on the int8 path: per (token, slot) the gate/up rows with the SwiGLU fused, then per
// token the down rows weighted and summed over the slots in order.
//
// Contract: docs/OPS.md section 3 (moe_experts); reference: ftlab/reference/moe.py (int8 terms
// of ftlab/reference/quant_matmul.py). x and h arrive as Q8_1 rows (q8 int8 [R, K], d8 / s8
// fp32 [R, K/32], quantize_q8_1_kernel). A 32-thread group owns one weight row, lane l taking
// 32-weight units l, l + 32, ... through the block types of quant_units.h (Q8_0, QK4, Q6_K)
// and QUnit4_0 below; the partial sums meet by port_shfl_xor within the group. Invalid ids
// read no expert memory. Includes quant_units.h only (not quant_matmul.hip, whose matvec
// instantiations every target would then compile twice).
#include "quant_units.h"

namespace ftlab {
namespace qmm {

// Q4_0 (18 bytes / 32) as a unit type: word i < 4 holds the low nibbles of bytes 4i..4i+3
// (weights 4i..), word 4 + i their high nibbles (weights 16 + 4i..); d * (d8 * sumi - 8 * s8).
struct QUnit4_0 {
  static constexpr int kBlock = 32, kBytes = 18, kUnits = 1;
  uint32_t q[8];
  float d;
  __device__ __forceinline__ void load(const uint8_t* blk, int) {
    d = half_at(blk);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t w = load_w16(blk + 2 + 4 * i);
      q[i] = w & 0x0F0F0F0Fu;
      q[i + 4] = (w >> 4) & 0x0F0F0F0Fu;
    }
  }
  __device__ __forceinline__ float term(const int x[8], float d8, float s8) const {
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) sumi = port_dp4a(static_cast<int>(q[i]), x[i], sumi);
    return d * (d8 * static_cast<float>(sumi) - 8.0f * s8);
  }
};

// The group's int8 dot of one weight row with one Q8_1 row of k values (every lane gets it).
template <typename Q>
__device__ __forceinline__ float group_row_dot(const uint8_t* row, const int8_t* q8, const float* d8,
                                               const float* s8, int64_t k) {
  const int lane = threadIdx.x;
  float acc = 0.0f;
  for (int64_t u = lane; u < k / 32; u += kGroup) {
    Q blk;
    blk.load(row + (u / Q::kUnits) * Q::kBytes, static_cast<int>(u % Q::kUnits));
    const int* xw = reinterpret_cast<const int*>(q8 + u * 32);
    int x[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = xw[i];
    acc += blk.term(x, d8[u], s8[u]);
  }
#pragma unroll
  for (int off = kGroup / 2; off > 0; off >>= 1) acc += port_shfl_xor(acc, off);
  return acc;
}

// h[pair, n] (fp32) = silu(g) * u, g and u the int8 dots of Q8_1 x[pair / top_k] with rows n and
// inter + n of expert ids[pair]; 0 for an invalid id. Grid (pairs, inter / kRowsPerBlock).
template <typename Q>
__global__ void __launch_bounds__(kGroup * kRowsPerBlock)
    moe_gate_up_kq_kernel(const int8_t* __restrict__ q8, const float* __restrict__ d8, const float* __restrict__ s8,
                          const uint8_t* __restrict__ w, int64_t e_bytes, int64_t row_bytes,
                          const int32_t* __restrict__ ids, float* __restrict__ h, int64_t experts, int64_t hidden,
                          int64_t inter, int64_t top_k) {
  const int64_t pair = blockIdx.x;
  const int64_t n = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock + threadIdx.y;
  if (n >= inter) return;  // a whole group leaves together
  const int e = ids[pair];
  if (e < 0 || e >= experts) {
    if (threadIdx.x == 0) h[pair * inter + n] = 0.0f;
    return;
  }
  const int64_t t = pair / top_k, xb = hidden / 32;
  const uint8_t* base = w + e * e_bytes;
  const float g = group_row_dot<Q>(base + n * row_bytes, q8 + t * hidden, d8 + t * xb, s8 + t * xb, hidden);
  const float u = group_row_dot<Q>(base + (inter + n) * row_bytes, q8 + t * hidden, d8 + t * xb, s8 + t * xb, hidden);
  if (threadIdx.x == 0) h[pair * inter + n] = g / (1.0f + port_expf(-g)) * u;
}

// y[t, n] (fp32) = sum_j wts[t, j] * (int8 dot of Q8_1 h[t * top_k + j] with row n of expert
// ids[t, j]), the slots in order, invalid ones skipped. Grid (tokens, hidden / kRowsPerBlock).
template <typename Q>
__global__ void __launch_bounds__(kGroup * kRowsPerBlock)
    moe_down_kq_kernel(const int8_t* __restrict__ q8, const float* __restrict__ d8, const float* __restrict__ s8,
                       const uint8_t* __restrict__ w, int64_t e_bytes, int64_t row_bytes,
                       const int32_t* __restrict__ ids, const float* __restrict__ wts, float* __restrict__ y,
                       int64_t experts, int64_t hidden, int64_t inter, int64_t top_k) {
  const int64_t t = blockIdx.x;
  const int64_t n = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock + threadIdx.y;
  if (n >= hidden) return;
  const int64_t hb = inter / 32;
  float acc = 0.0f;
  for (int64_t j = 0; j < top_k; ++j) {
    const int64_t pair = t * top_k + j;
    const int e = ids[pair];
    if (e < 0 || e >= experts) continue;  // the same for the whole group
    acc += wts[pair] * group_row_dot<Q>(w + e * e_bytes + n * row_bytes, q8 + pair * inter, d8 + pair * hb,
                                        s8 + pair * hb, inter);
  }
  if (threadIdx.x == 0) y[t * hidden + n] = acc;
}

#define FTLAB_MOE_KQ_INSTANTIATE(Q)                                                                         \
  template __global__ void moe_gate_up_kq_kernel<Q>(const int8_t*, const float*, const float*, const uint8_t*, \
                                                    int64_t, int64_t, const int32_t*, float*, int64_t, int64_t,  \
                                                    int64_t, int64_t);                                          \
  template __global__ void moe_down_kq_kernel<Q>(const int8_t*, const float*, const float*, const uint8_t*,    \
                                                 int64_t, int64_t, const int32_t*, const float*, float*, int64_t, \
                                                 int64_t, int64_t, int64_t);
FTLAB_MOE_KQ_INSTANTIATE(Q8_0)
FTLAB_MOE_KQ_INSTANTIATE(QK4<false>)
FTLAB_MOE_KQ_INSTANTIATE(QK4<true>)
FTLAB_MOE_KQ_INSTANTIATE(Q6_K)
FTLAB_MOE_KQ_INSTANTIATE(QUnit4_0)
#undef FTLAB_MOE_KQ_INSTANTIATE

}  // namespace qmm
}  // namespace ftlab

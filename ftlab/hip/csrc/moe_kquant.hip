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
// read no expert memory.
//
// Decode ("vec", K-quant banks: Q4_K / Q5_K / Q6_K gate/up and down, H and I multiples of 256):
// moe_gate_up_kq_vec_kernel and moe_down_kq_vec_kernel read the weights as quant_vec.h's pieces
// (eight lanes to a super-block, 16-byte loads), x is quantized to Q8_1 in every gate/up block
// (q4_0_common.h's activation records, quantize_q8_1_kernel's bits) and h leaves it as Q8_1
// (silu_mul_q8_1); y is written in x's dtype: two launches a layer, as the Q4_0 decode kernels.
//
// Includes quant_records.h (then quant_vec.h) and moe_common.h only (not quant_matmul.hip, whose matvec instantiations
// every target would then compile twice).
#include "moe_common.h"
#include "quant_records.h"

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

// ------------------------------------------------------------------ decode, "vec" pieces

constexpr int kVecHold = 2;   // steps (four super-blocks each) whose activations a lane holds: H <= 2048
constexpr int kVecGateRows = 4;  // gate rows (and as many up rows) of a group: 8 groups, 32 rows of h

// h (Q8_1: hq int8 [T*k, I], hd / hs fp32 [T*k, I/32]) = SwiGLU of the gate/up rows of expert
// ids[pair] against x[pair / top_k]: one block of 256 threads per (pair, 32 rows of h), group g
// taking gate rows 4g..4g+3 and the same up rows, a gate row and its up row at a time, the next
// pair's pieces loaded while this pair's terms are summed. x's activation records are made in
// LDS while the first pieces are in flight. An invalid id writes a zero block of h.
template <typename T, typename Q>
__global__ void __launch_bounds__(kMoeThreads)
    moe_gate_up_kq_vec_kernel(const typename T::storage* __restrict__ x, int64_t x_stride,
                              const uint8_t* __restrict__ bank, int64_t e_stride, int64_t row_bytes,
                              const int32_t* __restrict__ ids, int8_t* __restrict__ hq, float* __restrict__ hd,
                              float* __restrict__ hs, int num_experts, int hidden, int inter, int top_k) {
  using V = Vec<Q>;
  __shared__ bytes16 xrec_v[kMaxQ8Blocks / kSuperBlocks * kRecordWords / 4];
  __shared__ float gu[2 * kQK];
  uint32_t* xrec = reinterpret_cast<uint32_t*>(xrec_v);
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl): ids and x only after this
  port_pdl_trigger();
  const int64_t pair = blockIdx.x;
  const int e = ids[pair];
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kQK;
  const int64_t hb = pair * (inter / kQK) + blockIdx.y;  // h's Q8_1 block
  if (e < 0 || e >= num_experts) {
    if (threadIdx.x < kQK / 4) reinterpret_cast<uint32_t*>(hq + pair * inter + n0)[threadIdx.x] = 0u;
    if (threadIdx.x == 0) hd[hb] = hs[hb] = 0.0f;
    return;
  }
  const int group = threadIdx.x / kMoeGroup, lane = threadIdx.x % kMoeGroup;
  const int c = lane & 7, half = lane & 1, s0 = lane >> 3;
  const int supers = hidden / Q::kBlock;
  const uint8_t* gate0 = bank + e * e_stride + (n0 + kVecGateRows * group) * row_bytes;
  const uint8_t* up0 = gate0 + static_cast<int64_t>(inter) * row_bytes;
  float* g_out = gu + kVecGateRows * group;
  if (supers <= 4 * kVecHold) {  // a row in one load of each lane's steps; activations held across the rows
    bool has[kVecHold];
#pragma unroll
    for (int t = 0; t < kVecHold; ++t) has[t] = s0 + 4 * t < supers;
    V pg[2][kVecHold], pu[2][kVecHold];
    auto load_rows = [&](int r, V* g, V* u) {
#pragma unroll
      for (int t = 0; t < kVecHold; ++t) {
        if (has[t]) {
          g[t].load(gate0 + r * row_bytes + (s0 + 4 * t) * Q::kBytes, c);
          u[t].load(up0 + r * row_bytes + (s0 + 4 * t) * Q::kBytes, c);
        }
      }
    };
    load_rows(0, pg[0], pu[0]);
    quantize_records<T, 1, kMoeThreads>(x + (pair / top_k) * x_stride, 0, hidden / kQK, threadIdx.x, xrec);
    __syncthreads();
    XHalf xh[kVecHold];
#pragma unroll
    for (int t = 0; t < kVecHold; ++t) {
      if (has[t]) xhalf_of_record(xh[t], xrec + (s0 + 4 * t) * kRecordWords, V::unit_a(c), V::unit_b(c), half);
    }
#pragma unroll
    for (int r = 0; r < kVecGateRows; ++r) {
      if (r + 1 < kVecGateRows) load_rows(r + 1, pg[(r + 1) & 1], pu[(r + 1) & 1]);
      float ag = 0.0f, au = 0.0f;
#pragma unroll
      for (int t = 0; t < kVecHold; ++t) {
        if (has[t]) {
          ag += pg[r & 1][t].term(c, xh[t]);
          au += pu[r & 1][t].term(c, xh[t]);
        }
      }
      ag = group_sum(ag);
      au = group_sum(au);
      if (lane == 0) {
        g_out[r] = ag;
        g_out[kQK + r] = au;
      }
    }
  } else {  // longer rows: kVecHold steps at a time, the activation halves from LDS each step
    quantize_records<T, 1, kMoeThreads>(x + (pair / top_k) * x_stride, 0, hidden / kQK, threadIdx.x, xrec);
    __syncthreads();
    for (int r = 0; r < kVecGateRows; ++r) {
      float ag = 0.0f, au = 0.0f;
      for (int base = 0; base < supers; base += 4 * kVecHold) {
        V g[kVecHold], u[kVecHold];
#pragma unroll
        for (int t = 0; t < kVecHold; ++t) {
          const int s = base + s0 + 4 * t;
          if (s < supers) {
            g[t].load(gate0 + r * row_bytes + s * Q::kBytes, c);
            u[t].load(up0 + r * row_bytes + s * Q::kBytes, c);
          }
        }
#pragma unroll
        for (int t = 0; t < kVecHold; ++t) {
          const int s = base + s0 + 4 * t;
          if (s < supers) {
            XHalf xs;
            xhalf_of_record(xs, xrec + s * kRecordWords, V::unit_a(c), V::unit_b(c), half);
            ag += g[t].term(c, xs);
            au += u[t].term(c, xs);
          }
        }
      }
      ag = group_sum(ag);
      au = group_sum(au);
      if (lane == 0) {
        g_out[r] = ag;
        g_out[kQK + r] = au;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < kQK) silu_mul_q8_1(gu, threadIdx.x, hq + pair * inter + n0, hd + hb, hs + hb);
}

// y[t, n] (x's dtype) = sum over the slots j in order of wts[t, j] * (the int8 dot of Q8_1 h[t * k
// + j] with row n of expert ids[t, j]): one block per (token, 8 rows of y); group g takes slots g,
// g + 8, ...: a slot's 8 rows x I/256 super-blocks are its tasks, the four 8-lane quarters of the
// group taking tasks q, q + 4, ... (kVecHold at a time); each task's sum over its 8 lanes goes to
// LDS, and a row's dot is the sum of its super-blocks' in order (no atomics: the same bits every
// run). Invalid ids read no expert memory.
template <typename T, typename Q>
__global__ void __launch_bounds__(kMoeThreads)
    moe_down_kq_vec_kernel(const int8_t* __restrict__ hq, const float* __restrict__ hd, const float* __restrict__ hs,
                           const uint8_t* __restrict__ bank, int64_t e_stride, int64_t row_bytes,
                           const int32_t* __restrict__ ids, const float* __restrict__ wts,
                           typename T::storage* __restrict__ y, int64_t y_stride, int num_experts, int hidden,
                           int inter, int top_k) {
  using V = Vec<Q>;
  __shared__ float parts[kDownRows * kMaxQ8Blocks / kSuperBlocks];  // [slot][row][super]: k * I / 32 floats
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl)
  port_pdl_trigger();
  const int64_t t = blockIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kDownRows;
  const int group = threadIdx.x / kMoeGroup, lane = threadIdx.x % kMoeGroup;
  const int c = lane & 7, half = lane & 1, quarter = lane >> 3;
  const int nb = inter / kQK, supers = inter / Q::kBlock, tasks = kDownRows * supers;
  for (int j = group; j < top_k; j += kMoeThreads / kMoeGroup) {
    const int64_t pair = t * top_k + j;
    const int e = ids[pair];
    if (e < 0 || e >= num_experts) continue;  // the same for the whole group
    const uint8_t* base = bank + e * e_stride + n0 * row_bytes;
    const int8_t* q8 = hq + pair * inter;
    const float* d8 = hd + pair * nb;
    const float* s8 = hs + pair * nb;
    for (int f0 = 0; f0 < tasks; f0 += 4 * kVecHold) {
      V p[kVecHold];
      XHalf xs[kVecHold];
      bool has[kVecHold];
#pragma unroll
      for (int i = 0; i < kVecHold; ++i) {
        const int f = f0 + quarter + 4 * i, r = f / supers, s = f - r * supers;
        has[i] = f < tasks && n0 + r < hidden;
        if (has[i]) p[i].load(base + r * row_bytes + s * Q::kBytes, c);
        xs[i].load(q8, d8, s8, s * Q::kUnits + V::unit_a(c), s * Q::kUnits + V::unit_b(c), half, has[i]);
      }
#pragma unroll
      for (int i = 0; i < kVecHold; ++i) {
        float v = has[i] ? p[i].term(c, xs[i]) : 0.0f;
        v += port_shfl_xor(v, 1);  // the task's 8 lanes (xor below 8 stays in them)
        v += port_shfl_xor(v, 2);
        v += port_shfl_xor(v, 4);
        if (c == 0 && has[i]) parts[j * tasks + f0 + quarter + 4 * i] = v;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < kDownRows && n0 + threadIdx.x < hidden) {
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const int e = ids[t * top_k + j];
      if (e < 0 || e >= num_experts) continue;
      float dot = 0.0f;
      for (int s = 0; s < supers; ++s) dot += parts[j * tasks + threadIdx.x * supers + s];
      sum += wts[t * top_k + j] * dot;
    }
    y[t * y_stride + n0 + threadIdx.x] = T::from_float(sum);
  }
}

#define FTLAB_MOE_KQ_VEC_INSTANTIATE(T, Q)                                                                          \
  template __global__ void moe_gate_up_kq_vec_kernel<T, Q>(const T::storage*, int64_t, const uint8_t*, int64_t,    \
                                                           int64_t, const int32_t*, int8_t*, float*, float*, int,  \
                                                           int, int, int);                                         \
  template __global__ void moe_down_kq_vec_kernel<T, Q>(const int8_t*, const float*, const float*, const uint8_t*, \
                                                        int64_t, int64_t, const int32_t*, const float*,            \
                                                        T::storage*, int64_t, int, int, int, int);
#define FTLAB_MOE_KQ_VEC_TYPES(T)                    \
  FTLAB_MOE_KQ_VEC_INSTANTIATE(T, QK4<false>)        \
  FTLAB_MOE_KQ_VEC_INSTANTIATE(T, QK4<true>)         \
  FTLAB_MOE_KQ_VEC_INSTANTIATE(T, Q6_K)
FTLAB_MOE_KQ_VEC_TYPES(f32_t)
FTLAB_MOE_KQ_VEC_TYPES(f16_t)
FTLAB_MOE_KQ_VEC_TYPES(bf16_t)
#undef FTLAB_MOE_KQ_VEC_TYPES
#undef FTLAB_MOE_KQ_VEC_INSTANTIATE

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

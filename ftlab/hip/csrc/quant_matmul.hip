// quant_matmul.hip — device code of the int8-dot matvecs (up to 8 rows) and the prefill GEMM of
// GGUF Q8_0, Q4_K, Q5_K and Q6_K weights with Q8_1 activations.
//
// Contract: docs/OPS.md section 11 (quant_matmul, int8 path); reference:
// ftlab/reference/quant_matmul.py. A "unit" is 32 consecutive weights of a row, the span of one
// Q8_1 block (d8, q8[32], s8 = d8 * sum(q8)): a Q8_0 block, a Q4_K / Q5_K sub-block, a Q6_K
// quarter (two 16-sub-blocks). Per unit, with dp4a / sudot4 / sdot4 (port_dp4a) on 32-bit words
// of four weights and four activations:
//   Q8_0:        d * (d8 * sumi)
//   Q4_K / Q5_K: d * (d8 * (sc * sumi)) - dmin * (m * s8)            (q 0..15 / 0..31)
//   Q6_K:        d * (d8 * (sc_a * sumi_a)) + d * (d8 * (sc_b * sumi_b))   (16 weights each;
//                sumi = dot(q, q8) - 32 * sum(q8), q 0..63 unsigned in the bytes)
//
// A group of 32 threads (a warp; half a wave on CDNA) owns one weight row: lane l takes units
// l, l + 32, ..., so the 32 lanes of a step read 32 consecutive units (for the K-quants, four
// consecutive super-blocks), and the partial sums meet through port_shfl_xor within the group.
// Blocks of 34 and 210 bytes are only 2-byte aligned: those are read as 16-bit words (the "vec"
// matvec, mv1_vec, cuts Q6_K's pieces from aligned 16-byte loads instead: quant_vec.h).
//
// Includes quant_vec.h (the "vec" pieces; then quant_units.h, the weight units, q4_0_common.h and
// port.h) only: the gfx compile check compiles this file alone.
#pragma once
#include "quant_vec.h"

namespace ftlab {
namespace qmm {

constexpr int kMv1BlocksPerSm = 16;  // quant_mv1_kernel's persistent grid: at most these blocks an SM / CU
// quant_mv1_kernel's variants (the launcher's and ftlab.hip.quant_matmul's names)
constexpr int kMv1Lanes = 0, kMv1Vec = 1;

// y[m, n] (fp32) = sum over the row's units of the unit terms, for M = MV_M rows of Q8_1
// activations q8 [M, K] (int8, rows contiguous), d8 / s8 [M, K/32].
template <typename Q, int MV_M>
__global__ void __launch_bounds__(kGroup * kRowsPerBlock)
    quant_mv_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, const int8_t* __restrict__ q8,
                    const float* __restrict__ d8, const float* __restrict__ s8, float* __restrict__ y,
                    int64_t n_rows, int64_t k) {
  const int lane = threadIdx.x;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (n >= n_rows) return;  // a whole group leaves together: the shuffles below stay in-group
  const uint8_t* row = w + n * row_bytes;
  const int64_t units = k / 32;  // also the Q8_1 blocks of an activation row
  float acc[MV_M];
#pragma unroll
  for (int m = 0; m < MV_M; ++m) acc[m] = 0.0f;
  // two units a step, both loaded before either is used: twice the weight loads in flight
  for (int64_t u = lane; u < units; u += 2 * kGroup) {
    const int64_t v = u + kGroup;
    const bool has_v = v < units;
    Q a, b;
    a.load(row + (u / Q::kUnits) * Q::kBytes, static_cast<int>(u % Q::kUnits));
    if (has_v) b.load(row + (v / Q::kUnits) * Q::kBytes, static_cast<int>(v % Q::kUnits));
#pragma unroll
    for (int m = 0; m < MV_M; ++m) acc[m] += unit_term(a, q8 + m * k, d8 + m * units, s8 + m * units, u);
    if (has_v) {
#pragma unroll
      for (int m = 0; m < MV_M; ++m) acc[m] += unit_term(b, q8 + m * k, d8 + m * units, s8 + m * units, v);
    }
  }
#pragma unroll
  for (int m = 0; m < MV_M; ++m) {
    float v = acc[m];
#pragma unroll
    for (int off = kGroup / 2; off > 0; off >>= 1) v += port_shfl_xor(v, off);
    if (lane == 0) y[m * n_rows + n] = v;
  }
}

// quant_mv1_kernel's rows for the K-quants as quant_vec.h's pieces: lane c = l % 8 of super-block
// l / 8 of each step of four (super-blocks s, s + 4, ... of the row), every piece (and activation
// half) of kVecSteps steps loaded before the first is used. Where a row is at most two steps
// (K <= 2048: the lm_head and the attention projections) the lane's activation halves stay in
// registers across the rows. w must start 16-byte aligned (the launcher checks).
constexpr int kVecSteps = 2;
template <typename Q>
__device__ __forceinline__ void mv1_vec(const uint8_t* __restrict__ w, int64_t row_bytes,
                                        const int8_t* __restrict__ q8, const float* __restrict__ d8,
                                        const float* __restrict__ s8, float* __restrict__ y, int64_t n_rows,
                                        int64_t supers, int64_t first, int64_t stride, int lane) {
  using V = Vec<Q>;
  const int c = lane & 7, half = lane & 1;
  const int64_t s0 = lane >> 3;
  if (supers <= 4 * kVecSteps) {
    bool has[kVecSteps];
    XHalf x[kVecSteps];
#pragma unroll
    for (int t = 0; t < kVecSteps; ++t) {
      const int64_t s = s0 + 4 * t;
      has[t] = s < supers;
      x[t].load(q8, d8, s8, s * Q::kUnits + V::unit_a(c), s * Q::kUnits + V::unit_b(c), half, has[t]);
    }
    for (int64_t n = first; n < n_rows; n += stride) {  // uniform in a group: the shuffles stay in-group
      const uint8_t* row = w + n * row_bytes;
      V p[kVecSteps];
#pragma unroll
      for (int t = 0; t < kVecSteps; ++t)
        if (has[t]) p[t].load(row + (s0 + 4 * t) * Q::kBytes, c);
      float acc = 0.0f;
#pragma unroll
      for (int t = 0; t < kVecSteps; ++t)
        if (has[t]) acc += p[t].term(c, x[t]);
      acc = group_sum(acc);
      if (lane == 0) y[n] = acc;
    }
    return;
  }
  for (int64_t n = first; n < n_rows; n += stride) {
    const uint8_t* row = w + n * row_bytes;
    float acc = 0.0f;
    for (int64_t base = 0; base < supers; base += 4 * kVecSteps) {
      V p[kVecSteps];
      XHalf x[kVecSteps];
#pragma unroll
      for (int t = 0; t < kVecSteps; ++t) {
        const int64_t s = base + s0 + 4 * t;
        if (s < supers) p[t].load(row + s * Q::kBytes, c);
        x[t].load(q8, d8, s8, s * Q::kUnits + V::unit_a(c), s * Q::kUnits + V::unit_b(c), half, s < supers);
      }
#pragma unroll
      for (int t = 0; t < kVecSteps; ++t)
        if (base + s0 + 4 * t < supers) acc += p[t].term(c, x[t]);
    }
    acc = group_sum(acc);
    if (lane == 0) y[n] = acc;
  }
}

// quant_mv_kernel for one activation row, with a persistent grid: each group walks rows n, n +
// rows_in_grid, ... When the row's units fit one step of the group (K <= 2048: the lm_head and
// the attention projections of the Qwen MoE models) each lane's two units are the same for every
// row, so their activation words stay in registers and the row loop loads weight bytes only.
// kVariant kMv1Vec (K-quants): mv1_vec instead, eight lanes to a super-block with 16-byte loads;
// one kernel a variant, so that each has the registers (and occupancy) of its own code.
template <typename Q, int kVariant>
__global__ void __launch_bounds__(kGroup * kRowsPerBlock)
    quant_mv1_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, const int8_t* __restrict__ q8,
                     const float* __restrict__ d8, const float* __restrict__ s8, float* __restrict__ y,
                     int64_t n_rows, int64_t k) {
  const int lane = threadIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  const int64_t units = k / 32;
  if constexpr (Q::kVec && kVariant == kMv1Vec) {  // the K-quants
    mv1_vec<Q>(w, row_bytes, q8, d8, s8, y, n_rows, k / Q::kBlock, first, stride, lane);
    return;
  }
  if (units <= 2 * kGroup) {
    const int64_t u = lane, v = lane + kGroup;
    const bool has_u = u < units, has_v = v < units;
    int xu[8], xv[8];
    const int* wu = reinterpret_cast<const int*>(q8 + u * 32);
    const int* wv = reinterpret_cast<const int*>(q8 + v * 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      xu[i] = has_u ? wu[i] : 0;
      xv[i] = has_v ? wv[i] : 0;
    }
    const float du = has_u ? d8[u] : 0.0f, su = has_u ? s8[u] : 0.0f;
    const float dv = has_v ? d8[v] : 0.0f, sv = has_v ? s8[v] : 0.0f;
    for (int64_t n = first; n < n_rows; n += stride) {  // uniform in a group: the shuffles stay in-group
      const uint8_t* row = w + n * row_bytes;
      Q a, b;
      float acc = 0.0f;
      if (has_u) a.load(row + (u / Q::kUnits) * Q::kBytes, static_cast<int>(u % Q::kUnits));
      if (has_v) b.load(row + (v / Q::kUnits) * Q::kBytes, static_cast<int>(v % Q::kUnits));
      if (has_u) acc += a.term(xu, du, su);
      if (has_v) acc += b.term(xv, dv, sv);
      acc = group_sum(acc);
      if (lane == 0) y[n] = acc;
    }
    return;
  }
  for (int64_t n = first; n < n_rows; n += stride) {
    const uint8_t* row = w + n * row_bytes;
    float acc = 0.0f;
    for (int64_t u = lane; u < units; u += 2 * kGroup) {
      const int64_t v = u + kGroup;
      const bool has_v = v < units;
      Q a, b;
      a.load(row + (u / Q::kUnits) * Q::kBytes, static_cast<int>(u % Q::kUnits));
      if (has_v) b.load(row + (v / Q::kUnits) * Q::kBytes, static_cast<int>(v % Q::kUnits));
      acc += unit_term(a, q8, d8, s8, u);
      if (has_v) acc += unit_term(b, q8, d8, s8, v);
    }
    acc = group_sum(acc);
    if (lane == 0) y[n] = acc;
  }
}

constexpr int kGemmThreads = 256;
constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kTileU = 4;  // units (128 of K) per stage

// y[M, N] (fp32) = the same unit terms for any M (prefill): 64x64 output tiles, 256 threads, 4x4
// outputs per thread. Each stage unpacks 4 units of 64 weight rows into LDS (the decoded words
// and scales of each unit, as the matvec holds them in registers) beside 4 Q8_1 blocks of 64
// activation rows, so the inner loop is dp4a and the unit's scale arithmetic only.
template <typename Q>
__global__ void __launch_bounds__(kGemmThreads)
    quant_gemm_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, const int8_t* __restrict__ q8,
                      const float* __restrict__ d8, const float* __restrict__ s8, float* __restrict__ y,
                      int64_t m_rows, int64_t n_rows, int64_t k) {
  __shared__ int xs[kTileU][kTileM][8 + 1];  // +1: no bank conflicts on the strided reads
  __shared__ float xd[kTileU][kTileM], xsum[kTileU][kTileM];
  __shared__ Q ws[kTileU][kTileN];
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int64_t units = k / 32;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int64_t u0 = 0; u0 < units; u0 += kTileU) {
    const int r = tid / kTileU, ku = tid % kTileU;  // one (row, unit) of each tile per thread
    {
      const int64_t m = m0 + r, u = u0 + ku;
      const bool ok = m < m_rows && u < units;
      const int* src = reinterpret_cast<const int*>(q8 + (ok ? m * k + u * 32 : 0));
#pragma unroll
      for (int i = 0; i < 8; ++i) xs[ku][r][i] = ok ? src[i] : 0;
      xd[ku][r] = ok ? d8[m * units + u] : 0.0f;
      xsum[ku][r] = ok ? s8[m * units + u] : 0.0f;
    }
    {
      const int64_t n = n0 + r, u = u0 + ku;
      Q blk;
      if (n < n_rows && u < units) {
        blk.load(w + n * row_bytes + (u / Q::kUnits) * Q::kBytes, static_cast<int>(u % Q::kUnits));
      } else {
        blk.zero();
      }
      ws[ku][r] = blk;
    }
    __syncthreads();
#pragma unroll
    for (int ku = 0; ku < kTileU; ++ku) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int rm = ty + 16 * i;
        int xv[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) xv[t] = xs[ku][rm][t];
        const float dx = xd[ku][rm], sx = xsum[ku][rm];
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += ws[ku][tx + 16 * j].term(xv, dx, sx);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t m = m0 + ty + 16 * i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (m < m_rows && n < n_rows) y[m * n_rows + n] = acc[i][j];
    }
  }
}

#define FTLAB_QMM_INSTANTIATE(Q, M)                                                              \
  template __global__ void quant_mv_kernel<Q, M>(const uint8_t*, int64_t, const int8_t*, const float*, \
                                                 const float*, float*, int64_t, int64_t);
#define FTLAB_QMM_ROWS(Q)                                                                        \
  FTLAB_QMM_INSTANTIATE(Q, 1) FTLAB_QMM_INSTANTIATE(Q, 2) FTLAB_QMM_INSTANTIATE(Q, 3)            \
  FTLAB_QMM_INSTANTIATE(Q, 4) FTLAB_QMM_INSTANTIATE(Q, 5) FTLAB_QMM_INSTANTIATE(Q, 6)            \
  FTLAB_QMM_INSTANTIATE(Q, 7) FTLAB_QMM_INSTANTIATE(Q, 8)
FTLAB_QMM_ROWS(Q8_0)
FTLAB_QMM_ROWS(QK4<false>)
FTLAB_QMM_ROWS(QK4<true>)
FTLAB_QMM_ROWS(Q6_K)
#define FTLAB_QMM_MV1(Q, V)                                                                               \
  template __global__ void quant_mv1_kernel<Q, V>(const uint8_t*, int64_t, const int8_t*, const float*, const float*, \
                                                  float*, int64_t, int64_t);
FTLAB_QMM_MV1(Q8_0, kMv1Lanes)
#define FTLAB_QMM_MV1_K(Q) \
  FTLAB_QMM_MV1(Q, kMv1Lanes) FTLAB_QMM_MV1(Q, kMv1Vec)
FTLAB_QMM_MV1_K(QK4<false>)
FTLAB_QMM_MV1_K(QK4<true>)
FTLAB_QMM_MV1_K(Q6_K)
#undef FTLAB_QMM_MV1_K
#undef FTLAB_QMM_MV1
template __global__ void quant_gemm_kernel<Q8_0>(const uint8_t*, int64_t, const int8_t*, const float*, const float*,
                                                 float*, int64_t, int64_t, int64_t);
template __global__ void quant_gemm_kernel<QK4<false>>(const uint8_t*, int64_t, const int8_t*, const float*,
                                                       const float*, float*, int64_t, int64_t, int64_t);
template __global__ void quant_gemm_kernel<QK4<true>>(const uint8_t*, int64_t, const int8_t*, const float*,
                                                      const float*, float*, int64_t, int64_t, int64_t);
template __global__ void quant_gemm_kernel<Q6_K>(const uint8_t*, int64_t, const int8_t*, const float*, const float*,
                                                 float*, int64_t, int64_t, int64_t);
#undef FTLAB_QMM_ROWS
#undef FTLAB_QMM_INSTANTIATE

}  // namespace qmm
}  // namespace ftlab

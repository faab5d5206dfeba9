// deltanet.hip — the gated delta rule (Gated DeltaNet linear attention): decode step and prefill scan.
// Contract: ftlab/ops/deltanet.py; reference: ftlab/reference/deltanet.py.
//
// A block owns kDnCols columns of one (sequence, value head)'s fp32 state S [Dk, Dv] and holds
// them in registers: thread (r, c) keeps rows r, r + kDnRows, ... (at most kDnMaxPer of them,
// so Dk <= kDnRows * kDnMaxPer) of column c. Per token: q and k of the key head h / (Hv / Hk)
// go to shared memory and are L2-normalised there (x * rsqrt(sum x^2 + 1e-6)), then
//   S *= exp(g); delta = (v - k^T S) * beta; S += outer(k, delta); o = (scale q)^T S
// with the two column sums over Dk reduced through shared memory. The step kernel does one
// token and writes the state back in place; the scan kernel runs the recurrence over all T
// tokens of a sequence with the state in registers (the prefill: a token-by-token scan, not
// the chunked form). fp32 throughout; o rounded once to v's dtype. Wave-size generic.
#pragma once
#include "q4_0_common.h"

namespace ftlab {

constexpr int kDnCols = 32;                   // state columns a block
constexpr int kDnRows = 8;                    // threads along Dk
constexpr int kDnMaxPer = 16;                 // state rows a thread: Dk <= 128
constexpr int kDnMaxDk = kDnRows * kDnMaxPer;
constexpr int kDnThreads = kDnRows * kDnCols;

struct DnShared {
  float q[kDnMaxDk], k[kDnMaxDk];
  float part[kDnRows][kDnCols], part_o[kDnRows][kDnCols];
  float qscale, kscale;
};

// Loads token t's q and k (already offset to the key head) into shared memory and their
// normalising factors (times scale for q); ends with a barrier.
template <typename T>
__device__ __forceinline__ void dn_load_qk(DnShared& sh, const typename T::storage* q, const typename T::storage* k,
                                           int dk, float scale, bool l2norm) {
  const int tid = threadIdx.x;
  for (int i = tid; i < kDnMaxDk; i += kDnThreads) {  // zeros past Dk: the rows there stay 0
    sh.q[i] = i < dk ? T::load(q + i) : 0.0f;
    sh.k[i] = i < dk ? T::load(k + i) : 0.0f;
  }
  __syncthreads();
  if (tid == 0 || tid == kDnCols) {  // two threads, one sum each (Dk <= 256 shared reads)
    const float* x = tid == 0 ? sh.q : sh.k;
    float ss = 0.0f;
    for (int i = 0; i < kDnMaxDk; ++i) ss += x[i] * x[i];
    const float r = l2norm ? 1.0f / port_sqrtf(ss + 1e-6f) : 1.0f;
    if (tid == 0)
      sh.qscale = r * scale;
    else
      sh.kscale = r;
  }
  __syncthreads();
}

// One token on the registers s[] of thread (r, c) (rows past Dk hold 0 and meet k = q = 0);
// returns o for column c in thread r == 0.
template <typename T>
__device__ __forceinline__ float dn_token(DnShared& sh, float (&s)[kDnMaxPer], int r, int c, float v,
                                          float decay, float beta) {
  float kv = 0.0f;
#pragma unroll
  for (int m = 0; m < kDnMaxPer; ++m) {
    s[m] *= decay;
    kv += sh.k[r + m * kDnRows] * s[m];
  }
  sh.part[r][c] = kv;
  __syncthreads();
  kv = 0.0f;
#pragma unroll
  for (int j = 0; j < kDnRows; ++j) kv += sh.part[j][c];
  const float ks = sh.kscale;
  const float delta = (v - kv * ks) * beta;
  float o = 0.0f;
#pragma unroll
  for (int m = 0; m < kDnMaxPer; ++m) {
    s[m] += sh.k[r + m * kDnRows] * ks * delta;
    o += sh.q[r + m * kDnRows] * s[m];
  }
  sh.part_o[r][c] = o;
  __syncthreads();
  o = 0.0f;
  if (r == 0) {
#pragma unroll
    for (int j = 0; j < kDnRows; ++j) o += sh.part_o[j][c];
  }
  return o * sh.qscale;
}

// q, k [B, Hk, Dk]; v, o [B, Hv, Dv]; g, beta [B, Hv] fp32; state [B, Hv, Dk, Dv] fp32 in place.
// Grid (B * Hv, ceil(Dv / kDnCols)).
template <typename T>
__global__ void __launch_bounds__(kDnThreads)
    gated_delta_step_kernel(const typename T::storage* __restrict__ q, const typename T::storage* __restrict__ k,
                            const typename T::storage* __restrict__ v, const float* __restrict__ g,
                            const float* __restrict__ beta, float* __restrict__ state,
                            typename T::storage* __restrict__ o, int hk, int hv, int dk, int dv, float scale,
                            int l2norm) {
  __shared__ DnShared sh;
  const int bh = blockIdx.x, b = bh / hv, h = bh % hv;
  const int kh = h / (hv / hk);
  const int r = threadIdx.x / kDnCols, c = threadIdx.x % kDnCols;
  const int col = blockIdx.y * kDnCols + c;
  const bool live = col < dv;
  const int64_t head = static_cast<int64_t>(b) * hk + kh;
  dn_load_qk<T>(sh, q + head * dk, k + head * dk, dk, scale, l2norm != 0);
  float* s_col = state + static_cast<int64_t>(bh) * dk * dv + col;
  float s[kDnMaxPer];
#pragma unroll
  for (int m = 0; m < kDnMaxPer; ++m) {
    const int i = r + m * kDnRows;
    s[m] = live && i < dk ? s_col[static_cast<int64_t>(i) * dv] : 0.0f;
  }
  const float vv = live ? T::load(v + static_cast<int64_t>(bh) * dv + col) : 0.0f;
  const float out = dn_token<T>(sh, s, r, c, vv, port_expf(g[bh]), beta[bh]);
  if (!live) return;
#pragma unroll
  for (int m = 0; m < kDnMaxPer; ++m) {
    const int i = r + m * kDnRows;
    if (i < dk) s_col[static_cast<int64_t>(i) * dv] = s[m];
  }
  if (r == 0) o[static_cast<int64_t>(bh) * dv + col] = T::from_float(out);
}

// q, k [B, T, Hk, Dk]; v, o [B, T, Hv, Dv]; g, beta [B, T, Hv] fp32; state [B, Hv, Dk, Dv] fp32:
// the initial state in, the final state out. Grid (B * Hv, ceil(Dv / kDnCols)).
template <typename T>
__global__ void __launch_bounds__(kDnThreads)
    gated_delta_scan_kernel(const typename T::storage* __restrict__ q, const typename T::storage* __restrict__ k,
                            const typename T::storage* __restrict__ v, const float* __restrict__ g,
                            const float* __restrict__ beta, float* __restrict__ state,
                            typename T::storage* __restrict__ o, int tokens, int hk, int hv, int dk, int dv,
                            float scale, int l2norm) {
  __shared__ DnShared sh;
  const int bh = blockIdx.x, b = bh / hv, h = bh % hv;
  const int kh = h / (hv / hk);
  const int r = threadIdx.x / kDnCols, c = threadIdx.x % kDnCols;
  const int col = blockIdx.y * kDnCols + c;
  const bool live = col < dv;
  float* s_col = state + static_cast<int64_t>(bh) * dk * dv + col;
  float s[kDnMaxPer];
#pragma unroll
  for (int m = 0; m < kDnMaxPer; ++m) {
    const int i = r + m * kDnRows;
    s[m] = live && i < dk ? s_col[static_cast<int64_t>(i) * dv] : 0.0f;
  }
  const int64_t first = static_cast<int64_t>(b) * tokens;
  const typename T::storage* qt = q + (first * hk + kh) * dk;
  const typename T::storage* kt = k + (first * hk + kh) * dk;
  const int64_t vh0 = first * hv + h;
  const typename T::storage* vt = v + vh0 * dv + col;
  typename T::storage* ot = o + vh0 * dv + col;
  const float* gt = g + vh0;
  const float* bt = beta + vh0;
  const int qk_step = hk * dk, vo_step = hv * dv;
  for (int t = 0; t < tokens; ++t) {
    dn_load_qk<T>(sh, qt, kt, dk, scale, l2norm != 0);
    const float vv = live ? T::load(vt) : 0.0f;
    const float out = dn_token<T>(sh, s, r, c, vv, port_expf(*gt), *bt);
    if (live && r == 0) *ot = T::from_float(out);
    qt += qk_step;
    kt += qk_step;
    vt += vo_step;
    ot += vo_step;
    gt += hv;
    bt += hv;
  }
  if (!live) return;
#pragma unroll
  for (int m = 0; m < kDnMaxPer; ++m) {
    const int i = r + m * kDnRows;
    if (i < dk) s_col[static_cast<int64_t>(i) * dv] = s[m];
  }
}

#define FTLAB_DELTANET_INSTANTIATE(T)                                                                          \
  template __global__ void gated_delta_step_kernel<T>(const T::storage*, const T::storage*, const T::storage*, \
                                                      const float*, const float*, float*, T::storage*, int, int, \
                                                      int, int, float, int);                                   \
  template __global__ void gated_delta_scan_kernel<T>(const T::storage*, const T::storage*, const T::storage*, \
                                                      const float*, const float*, float*, T::storage*, int, int, \
                                                      int, int, int, float, int);
FTLAB_DELTANET_INSTANTIATE(f32_t)
FTLAB_DELTANET_INSTANTIATE(f16_t)
FTLAB_DELTANET_INSTANTIATE(bf16_t)

}  // namespace ftlab

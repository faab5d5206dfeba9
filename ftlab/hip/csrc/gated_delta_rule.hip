// gated_delta_rule.hip — the gated delta rule (Gated DeltaNet linear attention): decode step and prefill scan.
// Contract: ftlab/ops/gated_delta_rule.py; reference: ftlab/reference/gated_delta_rule.py.
//
// Both kernels hold a slice of one (sequence, value head)'s fp32 state S [Dk, Dv] in registers.
// Per token: q and k of the key head h / (Hv / Hk) go to shared memory and are L2-normalised
// (x * rsqrt(sum x^2 + 1e-6)), then
//   S *= exp(g); delta = (v - k^T S) * beta; S += outer(k, delta); o = (scale q)^T S
// with the two column sums over Dk reduced across the block. The scan kernel (the prefill: a
// token-by-token scan, not the chunked form) gives a block kDnCols columns, thread (r, c) rows
// r, r + kDnRows, ... (at most kDnMaxPer, so Dk <= kDnRows * kDnMaxPer) of column c, and runs
// the recurrence over all T tokens of a sequence. The step kernel (decode, one token, the state
// written back in place) has its own layout of column quads, described above it. fp32
// throughout; o rounded once to v's dtype. Wave-size generic.
#pragma once
#include "q4_0_common.h"

namespace ftlab {

constexpr int kDnCols = 16;                   // state columns a block
constexpr int kDnRows = 8;                    // threads along Dk
constexpr int kDnMaxPer = 16;                 // state rows a thread: Dk <= 128
constexpr int kDnMaxDk = kDnRows * kDnMaxPer;
constexpr int kDnThreads = kDnRows * kDnCols;
static_assert(kDnThreads >= kDnMaxDk, "a thread a row of q and k when a token is fetched");

struct DnShared {
  float q[kDnMaxDk], k[kDnMaxDk];
  float part[kDnRows][kDnCols], part_o[kDnRows][kDnCols];
  float kk[kDnRows], qq[kDnRows];
};

// One token's operands in registers: thread tid's element of q and k (0 past Dk), its column's v,
// the head's g and beta.
struct DnToken {
  float q, k, v, g, beta;
};

template <typename T>
__device__ __forceinline__ DnToken dn_fetch(const typename T::storage* q, const typename T::storage* k,
                                            const typename T::storage* v, const float* g, const float* beta, int dk,
                                            bool live) {
  const int tid = threadIdx.x;
  DnToken tok;
  tok.q = tid < dk ? T::load(q + tid) : 0.0f;
  tok.k = tid < dk ? T::load(k + tid) : 0.0f;
  tok.v = live ? T::load(v) : 0.0f;
  tok.g = *g;
  tok.beta = *beta;
  return tok;
}

// One token on the registers s[] of thread (r, c) (rows past Dk hold 0 and meet k = q = 0):
// the sums over Dk (k^T S, |k|^2, q^T S, |q|^2) reduced through shared memory, three barriers;
// returns o for column c in thread r == 0.
__device__ __forceinline__ float dn_token(DnShared& sh, float (&s)[kDnMaxPer], int r, int c, const DnToken& tok,
                                          float scale, bool l2norm) {
  const int tid = threadIdx.x;
  if (tid < kDnMaxDk) {
    sh.q[tid] = tok.q;
    sh.k[tid] = tok.k;
  }
  __syncthreads();
  const float decay = port_expf(tok.g);
  float kv = 0.0f, kk = 0.0f;
#pragma unroll
  for (int m = 0; m < kDnMaxPer; ++m) {
    const float ki = sh.k[r + m * kDnRows];
    s[m] *= decay;
    kv += ki * s[m];
    kk += ki * ki;
  }
  sh.part[r][c] = kv;
  if (c == 0) sh.kk[r] = kk;
  __syncthreads();
  kv = 0.0f;
  kk = 0.0f;
#pragma unroll
  for (int j = 0; j < kDnRows; ++j) {
    kv += sh.part[j][c];
    kk += sh.kk[j];
  }
  const float ks = l2norm ? 1.0f / port_sqrtf(kk + 1e-6f) : 1.0f;
  const float delta = (tok.v - kv * ks) * tok.beta;
  float o = 0.0f, qq = 0.0f;
#pragma unroll
  for (int m = 0; m < kDnMaxPer; ++m) {
    const float qi = sh.q[r + m * kDnRows];
    s[m] += sh.k[r + m * kDnRows] * ks * delta;
    o += qi * s[m];
    qq += qi * qi;
  }
  sh.part_o[r][c] = o;
  if (c == 0) sh.qq[r] = qq;
  __syncthreads();
  if (r != 0) return 0.0f;
  o = 0.0f;
  qq = 0.0f;
#pragma unroll
  for (int j = 0; j < kDnRows; ++j) {
    o += sh.part_o[j][c];
    qq += sh.qq[j];
  }
  return o * (l2norm ? 1.0f / port_sqrtf(qq + 1e-6f) : 1.0f) * scale;
}

// ---------------------------------------------------------------- the decode step
// A block of kDsThreads owns 4 * Quads state columns of one (sequence, value head): thread
// (r, c) = (tid / Quads, tid % Quads) keeps columns 4c .. 4c + 3 of rows r, r + R, ... (R =
// kDsThreads / Quads row threads, Dk <= kDnMaxDk), so a wave's load covers whole 16-byte column
// quads of consecutive rows (16-byte loads and stores when `vec`: Dv % 4 == 0 and the state
// 16-byte aligned; else four guarded scalar accesses). The sums over Dk are reduced over a
// wave's row threads by lane exchange (masks Quads .. 16: within 32 lanes, any wave size), then
// over the block's kDsGroups 32-lane groups through shared memory: two barriers for the two
// sums and one for q, k.
constexpr int kDsThreads = 256;
static_assert(kDsThreads == 2 * kDnMaxDk, "the step kernel: a thread a row of q, then of k");
constexpr int kDsGroups = kDsThreads / 32;

template <int Quads>
struct DsShared {
  float q[kDnMaxDk], k[kDnMaxDk];
  float part[kDsGroups][4 * Quads], part_o[kDsGroups][4 * Quads];
  float kk[kDsGroups], qq[kDsGroups];
};

// Sum over the row threads of a 32-lane group (lanes Quads apart), every lane the total.
template <int Quads>
__device__ __forceinline__ float ds_rows_sum(float x) {
#pragma unroll
  for (int m = Quads; m < 32; m *= 2) x += port_shfl_xor(x, m);
  return x;
}

__device__ __forceinline__ void ds_load(const float* p, bool vec, int left, float out[4]) {
  if (vec) {
    load4f(p, out);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = j < left ? p[j] : 0.0f;
}

__device__ __forceinline__ void ds_store(float* p, bool vec, int left, const float in[4]) {
  if (vec) {
    store4f(p, in);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (j < left) p[j] = in[j];
}

// A step's decay and write strength: g and beta [B, Hv] fp32 as given, or with Gates the raw
// projections a and b in T, from which g = a_neg[h] * softplus(a + dt_bias[h]) (softplus x past
// 20, else log(1 + exp(x))) and beta = sigmoid(b), in fp32.
template <typename T, bool Gates>
__device__ __forceinline__ void ds_gates(const void* g, const void* beta, const float* a_neg, const float* dt_bias,
                                         int bh, int h, float& decay, float& bt) {
  if constexpr (Gates) {
    const float x = T::load(static_cast<const typename T::storage*>(g) + bh) + dt_bias[h];
    const float sp = x > 20.0f ? x : port_logf(1.0f + port_expf(x));
    decay = port_expf(a_neg[h] * sp);
    bt = 1.0f / (1.0f + port_expf(-T::load(static_cast<const typename T::storage*>(beta) + bh)));
  } else {
    decay = port_expf(static_cast<const float*>(g)[bh]);
    bt = static_cast<const float*>(beta)[bh];
  }
}

// q, k [B, Hk, Dk]; v, o [B, Hv, Dv]; g, beta [B, Hv] (ds_gates); state [B, Hv, Dk, Dv] fp32 in
// place; reset [B] bytes or null: a nonzero row's state is taken as zeros (never read).
// Grid (B * Hv, ceil(Dv / (4 * Quads))), kDsThreads threads.
template <typename T, int Quads, bool Gates>
__global__ void __launch_bounds__(kDsThreads)
    gated_delta_step_kernel(const typename T::storage* __restrict__ q, const typename T::storage* __restrict__ k,
                            const typename T::storage* __restrict__ v, const void* __restrict__ g,
                            const void* __restrict__ beta, float* __restrict__ state,
                            typename T::storage* __restrict__ o, const float* __restrict__ a_neg,
                            const float* __restrict__ dt_bias, const uint8_t* __restrict__ reset, int hk, int hv,
                            int dk, int dv, float scale, int l2norm, int vec) {
  constexpr int kRowThreads = kDsThreads / Quads, kPer = kDnMaxDk / kRowThreads;
  static_assert(kDsThreads % Quads == 0 && kDnMaxDk % kRowThreads == 0 && Quads <= 16, "block shape");
  __shared__ DsShared<Quads> sh;
  const int tid = threadIdx.x, bh = blockIdx.x, b = bh / hv, h = bh % hv;
  const int kh = h / (hv / hk);
  const int r = tid / Quads, c = tid % Quads, group = tid / 32;
  const int col = blockIdx.y * 4 * Quads + 4 * c, left = dv - col;  // this thread's columns: col .. col + 3
  const bool live = left > 0;
  const int64_t head = static_cast<int64_t>(b) * hk + kh;
  if (tid < kDnMaxDk) sh.q[tid] = tid < dk ? T::load(q + head * dk + tid) : 0.0f;
  else sh.k[tid - kDnMaxDk] = tid - kDnMaxDk < dk ? T::load(k + head * dk + tid - kDnMaxDk) : 0.0f;
  float* s_cols = state + static_cast<int64_t>(bh) * dk * dv + col;
  const bool fresh = reset != nullptr && reset[b] != 0;
  float s[kPer][4];
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const int i = r + m * kRowThreads;
    if (live && i < dk && !fresh) ds_load(s_cols + static_cast<int64_t>(i) * dv, vec != 0, left, s[m]);
    else
#pragma unroll
      for (int j = 0; j < 4; ++j) s[m][j] = 0.0f;
  }
  float vv[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) vv[j] = j < left ? T::load(v + static_cast<int64_t>(bh) * dv + col + j) : 0.0f;
  float decay, bt;
  ds_gates<T, Gates>(g, beta, a_neg, dt_bias, bh, h, decay, bt);
  __syncthreads();
  // k^T S (per column) and |k|^2 over this thread's rows, then over the block
  float kv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, kk = 0.0f;
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const float ki = sh.k[r + m * kRowThreads];
    kk += ki * ki;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      s[m][j] *= decay;
      kv[j] += ki * s[m][j];
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) kv[j] = ds_rows_sum<Quads>(kv[j]);
  kk = ds_rows_sum<Quads>(kk);
  if (tid % 32 < Quads) {  // the group's first row thread of each column quad
#pragma unroll
    for (int j = 0; j < 4; ++j) sh.part[group][4 * c + j] = kv[j];
    if (c == 0) sh.kk[group] = kk;
  }
  __syncthreads();
  kk = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) kv[j] = 0.0f;
#pragma unroll
  for (int w = 0; w < kDsGroups; ++w) {
    kk += sh.kk[w];
#pragma unroll
    for (int j = 0; j < 4; ++j) kv[j] += sh.part[w][4 * c + j];
  }
  const float ks = l2norm ? 1.0f / port_sqrtf(kk + 1e-6f) : 1.0f;
  float delta[4], ov[4] = {0.0f, 0.0f, 0.0f, 0.0f}, qq = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) delta[j] = (vv[j] - kv[j] * ks) * bt;
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const float ki = sh.k[r + m * kRowThreads] * ks, qi = sh.q[r + m * kRowThreads];
    qq += qi * qi;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      s[m][j] += ki * delta[j];
      ov[j] += qi * s[m][j];
    }
  }
  if (live)  // the new state goes out before the output's reduction
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
      const int i = r + m * kRowThreads;
      if (i < dk) ds_store(s_cols + static_cast<int64_t>(i) * dv, vec != 0, left, s[m]);
    }
#pragma unroll
  for (int j = 0; j < 4; ++j) ov[j] = ds_rows_sum<Quads>(ov[j]);
  qq = ds_rows_sum<Quads>(qq);
  if (tid % 32 < Quads) {
#pragma unroll
    for (int j = 0; j < 4; ++j) sh.part_o[group][4 * c + j] = ov[j];
    if (c == 0) sh.qq[group] = qq;
  }
  __syncthreads();
  if (r != 0 || !live) return;
  qq = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) ov[j] = 0.0f;
#pragma unroll
  for (int w = 0; w < kDsGroups; ++w) {
    qq += sh.qq[w];
#pragma unroll
    for (int j = 0; j < 4; ++j) ov[j] += sh.part_o[w][4 * c + j];
  }
  const float qs = (l2norm ? 1.0f / port_sqrtf(qq + 1e-6f) : 1.0f) * scale;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (j < left) o[static_cast<int64_t>(bh) * dv + col + j] = T::from_float(ov[j] * qs);
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
  DnToken tok = dn_fetch<T>(qt, kt, vt, gt, bt, dk, live);
  for (int t = 0; t < tokens; ++t) {
    const DnToken now = tok;
    if (t + 1 < tokens) {  // the next token's loads overlap this token's work
      qt += qk_step;
      kt += qk_step;
      vt += vo_step;
      gt += hv;
      bt += hv;
      tok = dn_fetch<T>(qt, kt, vt, gt, bt, dk, live);
    }
    const float out = dn_token(sh, s, r, c, now, scale, l2norm != 0);
    if (live && r == 0) *ot = T::from_float(out);
    ot += vo_step;
  }
  if (!live) return;
#pragma unroll
  for (int m = 0; m < kDnMaxPer; ++m) {
    const int i = r + m * kDnRows;
    if (i < dk) s_col[static_cast<int64_t>(i) * dv] = s[m];
  }
}

#define FTLAB_DELTANET_STEP(T, Q, G)                                                                          \
  template __global__ void gated_delta_step_kernel<T, Q, G>(                                                   \
      const T::storage*, const T::storage*, const T::storage*, const void*, const void*, float*, T::storage*,  \
      const float*, const float*, const uint8_t*, int, int, int, int, float, int, int);
#define FTLAB_DELTANET_INSTANTIATE(T)                                                                          \
  FTLAB_DELTANET_STEP(T, 4, false)                                                                             \
  FTLAB_DELTANET_STEP(T, 8, false)                                                                             \
  FTLAB_DELTANET_STEP(T, 4, true)                                                                              \
  FTLAB_DELTANET_STEP(T, 8, true)                                                                              \
  template __global__ void gated_delta_scan_kernel<T>(const T::storage*, const T::storage*, const T::storage*, \
                                                      const float*, const float*, float*, T::storage*, int, int, \
                                                      int, int, int, float, int);
FTLAB_DELTANET_INSTANTIATE(f32_t)
FTLAB_DELTANET_INSTANTIATE(f16_t)
FTLAB_DELTANET_INSTANTIATE(bf16_t)

}  // namespace ftlab

// moe_gemm.hip — device code of the prefill experts: grouped GEMMs over moe_align's rows
// (gate/up + SwiGLU, then down weighted by the routing weight), Q4_0 banks through dp4a tiles
// over Q8_1 rows, fp16 / bf16 banks on the matrix cores (mma.h; fp32 FMA tiles where rows are
// not 16-byte aligned) and fp32 banks through fp32 FMA tiles.
//
// Contract: docs/OPS.md section 3 (moe_experts, prefill); reference: ftlab/reference/moe.py.
// Includes moe_common.h and mma.h (then q4_0_common.h and port.h) only: the gfx compile check
// compiles this file alone.
#include "mma.h"
#include "moe_common.h"

namespace ftlab {

// ------------------------------------------------------------------ prefill grouped GEMM

// Both GEMMs walk moe_align's rows: a block takes 64 sorted rows (one expert: block_m = 64)
// and 64 output columns, 256 threads with 4 x 4 outputs each; blocks past
// num_tokens_post_padded return at once, sentinel rows load zeros and store nothing.
// GATED: out[pair, n] = silu(a[pair / k] . W[n]) * (a[pair / k] . W[N + n]) (gate/up + SwiGLU);
// else out[pair, n] = w[pair] * (a[pair] . W[n]) (down, weighted). out is fp32 [pairs, N].
constexpr int kGemmTile = 64;
constexpr int kGemmKB = 4;   // Q4_0 blocks per step (int8 GEMM)
constexpr int kGemmK = 16;   // K per step (dense GEMM)

struct TileRows {
  int32_t pair[kGemmTile];
};

template <typename O = f32_t>
__device__ __forceinline__ void store_tile(const float (&acc)[4][4], const float (&acc_up)[4][4], bool gated,
                                           const TileRows& rows, const float* wts, typename O::storage* out,
                                           int64_t pairs, int64_t n_out, int64_t n0, int tx, int ty) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t pair = rows.pair[ty + 16 * i];
    if (pair >= pairs) continue;
    const float scale = gated ? 1.0f : wts[pair];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n >= n_out) continue;
      const float g = acc[i][j];
      out[pair * n_out + n] = O::from_float(gated ? g / (1.0f + port_expf(-g)) * acc_up[i][j] : scale * g);
    }
  }
}

// Q4_0 banks, int8 path: Q8_1 activations (rows of K) and nibble words of the weights in LDS.
template <bool GATED>
__global__ void __launch_bounds__(kMoeThreads)
    moe_gemm_q4_kernel(const uint8_t* __restrict__ bank, int64_t e_stride, int64_t row_bytes,
                       const int8_t* __restrict__ q8, const float* __restrict__ d8, const float* __restrict__ s8,
                       const int32_t* __restrict__ sorted, const int32_t* __restrict__ expert_ids,
                       const int32_t* __restrict__ npad, const float* __restrict__ wts, float* __restrict__ out,
                       int64_t pairs, int top_k, int64_t n_out, int64_t k) {
  __shared__ TileRows rows;
  __shared__ int xs[kGemmKB][kGemmTile][8 + 1];
  __shared__ float xd[kGemmKB][kGemmTile], xsum[kGemmKB][kGemmTile];
  __shared__ int ws[GATED ? 2 : 1][kGemmKB][kGemmTile][8 + 1];
  __shared__ float wd[GATED ? 2 : 1][kGemmKB][kGemmTile];
  if (static_cast<int64_t>(blockIdx.y) * kGemmTile >= *npad) return;
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int e = expert_ids[blockIdx.y];
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGemmTile;
  const int64_t nb = k / kQK;
  const uint8_t* w = bank + e * e_stride;
  if (tid < kGemmTile) rows.pair[tid] = sorted[static_cast<int64_t>(blockIdx.y) * kGemmTile + tid];
  __syncthreads();
  float acc[4][4], acc_up[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = acc_up[i][j] = 0.0f;

  for (int64_t b0 = 0; b0 < nb; b0 += kGemmKB) {
    {  // activations: thread -> (row, block), 8 words each
      const int r = tid / kGemmKB, kb = tid % kGemmKB;
      const int64_t pair = rows.pair[r], b = b0 + kb;
      const bool ok = pair < pairs && b < nb;
      const int64_t arow = GATED ? pair / top_k : pair;
      const int* src = reinterpret_cast<const int*>(q8 + (ok ? arow * k + b * kQK : 0));
#pragma unroll
      for (int i = 0; i < 8; ++i) xs[kb][r][i] = ok ? src[i] : 0;
      xd[kb][r] = ok ? d8[arow * nb + b] : 0.0f;
      xsum[kb][r] = ok ? s8[arow * nb + b] : 0.0f;
    }
#pragma unroll
    for (int half = 0; half < (GATED ? 2 : 1); ++half) {  // weights, unpacked to nibble words
      const int r = tid / kGemmKB, kb = tid % kGemmKB;
      const int64_t n = n0 + r, b = b0 + kb;
      const bool ok = n < n_out && b < nb;
      const uint16_t* src =
          reinterpret_cast<const uint16_t*>(w + (ok ? (n + half * n_out) * row_bytes + b * kBlockBytes : 0));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t word =
            ok ? (static_cast<uint32_t>(src[1 + 2 * i]) | (static_cast<uint32_t>(src[2 + 2 * i]) << 16)) : 0u;
        ws[half][kb][r][i] = static_cast<int>(word & 0x0F0F0F0Fu);
        ws[half][kb][r][4 + i] = static_cast<int>((word >> 4) & 0x0F0F0F0Fu);
      }
      wd[half][kb][r] = ok ? port_half_to_float(src[0]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kb = 0; kb < kGemmKB; ++kb) {
#pragma unroll
      for (int half = 0; half < (GATED ? 2 : 1); ++half) {
        int wv[4][8];
        float wdv[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int i = 0; i < 8; ++i) wv[j][i] = ws[half][kb][tx + 16 * j][i];
          wdv[j] = wd[half][kb][tx + 16 * j];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = ty + 16 * i;
          int xv[8];
#pragma unroll
          for (int q = 0; q < 8; ++q) xv[q] = xs[kb][r][q];
          const float dx = xd[kb][r], sx = xsum[kb][r];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            int sumi = 0;
#pragma unroll
            for (int q = 0; q < 8; ++q) sumi = port_dp4a(wv[j][q], xv[q], sumi);
            const float v = wdv[j] * (dx * static_cast<float>(sumi) - 8.0f * sx);
            if (half == 0) {
              acc[i][j] += v;
            } else {
              acc_up[i][j] += v;
            }
          }
        }
      }
    }
    __syncthreads();
  }
  store_tile(acc, acc_up, GATED, rows, wts, out, pairs, n_out, n0, tx, ty);
}

// Dense banks: fp32 FMA tiles. A: the activations' dtype (x for gate/up, h for down: the bank's
// dtype, as the output O of gate/up); the down output is fp32.
template <typename A, typename W, typename O, bool GATED>
__global__ void __launch_bounds__(kMoeThreads)
    moe_gemm_dense_kernel(const typename A::storage* __restrict__ a, int64_t a_stride,
                          const typename W::storage* __restrict__ bank, int64_t e_stride, int64_t row_stride,
                          const int32_t* __restrict__ sorted, const int32_t* __restrict__ expert_ids,
                          const int32_t* __restrict__ npad, const float* __restrict__ wts,
                          typename O::storage* __restrict__ out, int64_t pairs, int top_k, int64_t n_out, int64_t k) {
  __shared__ TileRows rows;
  __shared__ float as[kGemmK][kGemmTile + 1];
  __shared__ float bs[GATED ? 2 : 1][kGemmK][kGemmTile + 1];
  if (static_cast<int64_t>(blockIdx.y) * kGemmTile >= *npad) return;
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int e = expert_ids[blockIdx.y];
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGemmTile;
  const typename W::storage* w = bank + e * e_stride;
  if (tid < kGemmTile) rows.pair[tid] = sorted[static_cast<int64_t>(blockIdx.y) * kGemmTile + tid];
  __syncthreads();
  float acc[4][4], acc_up[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = acc_up[i][j] = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kGemmK) {
    // 64 rows x 16 of K each for A and B: thread -> (row tid / 4, 4 consecutive k)
    const int r = tid / 4, c0 = (tid % 4) * 4;
    {
      const int64_t pair = rows.pair[r];
      const bool ok = pair < pairs;
      const int64_t arow = GATED ? pair / top_k : pair;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t kk = k0 + c0 + c;
        as[c0 + c][r] = ok && kk < k ? A::load(a + arow * a_stride + kk) : 0.0f;
      }
    }
#pragma unroll
    for (int half = 0; half < (GATED ? 2 : 1); ++half) {
      const int64_t n = n0 + r;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t kk = k0 + c0 + c;
        bs[half][c0 + c][r] = n < n_out && kk < k ? W::load(w + (n + half * n_out) * row_stride + kk) : 0.0f;
      }
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kGemmK; ++c) {
      float av[4], bv[4], uv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[c][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        bv[j] = bs[0][c][tx + 16 * j];
        uv[j] = GATED ? bs[GATED ? 1 : 0][c][tx + 16 * j] : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[i][j] += av[i] * bv[j];
          if (GATED) acc_up[i][j] += av[i] * uv[j];
        }
    }
    __syncthreads();
  }
  store_tile<O>(acc, acc_up, GATED, rows, wts, out, pairs, n_out, n0, tx, ty);
}

// fp16 / bf16 banks on the matrix cores: a block takes 64 sorted rows (one expert) and 64 output
// columns (64 more of up when GATED), K in steps of kMmaStep through kMmaStages LDS buffers, one
// barrier a step, two steps' 16-byte loads in flight while one multiplies: cp.async copies where
// the target has them (FTLAB_MMA_ASYNC), else two register sets. Each warp-sized group owns one
// 16-row tile of the 64 and kMmaTiles 16-column tiles, its A fragment read once a 16-K slice; a
// group whose 16 rows are all padding (the tail of an expert's rows) skips its products and
// stores. Needs K, the row strides and the base addresses in whole 16-byte chunks (the launcher
// checks; the FMA kernel above takes the rest). a and the GATED output h in T, the down output
// fp32 (weighted).
constexpr int kMmaStep = 32;
constexpr int kMmaLd = kMmaStep + 8;  // LDS row stride in elements: 80 bytes, 16-byte chunks stay aligned
constexpr int kMmaGroups = kMoeThreads / PORT_WARP_SIZE;
constexpr int kMmaTiles = 16 / kMmaGroups;  // 16 x 16 tiles of the 64 x 64 block a group owns
#if defined(FTLAB_MMA_ASYNC)
constexpr int kMmaStages = 3;
#define FTLAB_MMA_BOUNDS __launch_bounds__(kMoeThreads, 3)
#else
constexpr int kMmaStages = 2;
#if defined(PORT_CUDA)  // sm_70 / sm_75 (scalar products)
#define FTLAB_MMA_BOUNDS __launch_bounds__(kMoeThreads, 2)
#else
#define FTLAB_MMA_BOUNDS __launch_bounds__(kMoeThreads)
#endif
#endif

template <typename T, bool GATED>
__global__ void FTLAB_MMA_BOUNDS
    moe_gemm_mma_kernel(const uint16_t* __restrict__ a, int64_t a_stride, const uint16_t* __restrict__ bank,
                        int64_t e_stride, int64_t row_stride, const int32_t* __restrict__ sorted,
                        const int32_t* __restrict__ expert_ids, const int32_t* __restrict__ npad,
                        const float* __restrict__ wts, void* __restrict__ out, int64_t pairs, int top_k,
                        int64_t n_out, int64_t k) {
  constexpr int kHalves = GATED ? 2 : 1;
  __shared__ TileRows rows;
  __shared__ __attribute__((aligned(16))) uint16_t as[kMmaStages][kGemmTile * kMmaLd];
  __shared__ __attribute__((aligned(16))) uint16_t bs[kMmaStages][kHalves][kGemmTile * kMmaLd];
  if (static_cast<int64_t>(blockIdx.y) * kGemmTile >= *npad) return;
  const int tid = threadIdx.x;
  const int e = expert_ids[blockIdx.y];
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGemmTile;
  if (tid < kGemmTile) rows.pair[tid] = sorted[static_cast<int64_t>(blockIdx.y) * kGemmTile + tid];
  __syncthreads();

  // loads: thread -> row lr of A and of each B half, 8 elements (16 bytes) at K offset lc
  const int lr = tid / 4, lc = 8 * (tid % 4);
  const int64_t pair = rows.pair[lr];
  const bool a_ok = pair < pairs;
  const uint16_t* a_src = a + (a_ok ? (GATED ? pair / top_k : pair) * a_stride : 0) + lc;
  const bool b_ok = n0 + lr < n_out;
  const uint16_t* b_src = bank + e * e_stride + (b_ok ? (n0 + lr) * row_stride : 0) + lc;

  const int group = tid / PORT_WARP_SIZE;
  const int mt = group % 4, nt0 = (group / 4) * kMmaTiles;
  bool live = false;
#pragma unroll
  for (int i = 0; i < 16; ++i) live = live || rows.pair[16 * mt + i] < pairs;
  MmaAcc acc[kHalves][kMmaTiles];
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int j = 0; j < kMmaTiles; ++j)
#pragma unroll
      for (int i = 0; i < kMmaAcc; ++i) acc[h][j].v[i] = 0.0f;

  auto multiply = [&](int s) {
    if (!live) return;
#pragma unroll
    for (int kk = 0; kk < kMmaStep; kk += 16) {
      const MmaFrag fa = mma_frag(&as[s][16 * mt * kMmaLd + kk], kMmaLd);
#pragma unroll
      for (int j = 0; j < kMmaTiles; ++j)
#pragma unroll
        for (int h = 0; h < kHalves; ++h)
          mma_16x16x16<T>(acc[h][j], fa, mma_frag(&bs[s][h][16 * (nt0 + j) * kMmaLd + kk], kMmaLd));
    }
  };

#if defined(FTLAB_MMA_ASYNC)
  auto copy = [&](int s, int k0) {  // step k0 into buffer s; past K: zeros, nothing read
    const bool in = k0 + lc < k;     // K is whole chunks: a chunk is all in or all out
    const int kc = in ? k0 : 0;
    mma_copy16(&as[s][lr * kMmaLd + lc], a_src + kc, a_ok && in);
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
      mma_copy16(&bs[s][h][lr * kMmaLd + lc], b_src + h * n_out * row_stride + kc, b_ok && in);
    mma_commit();
  };
  copy(0, 0);
  copy(1, kMmaStep);
  int s = 0;
  for (int k0 = 0; k0 < k; k0 += kMmaStep) {  // K < 2^30 (the launcher checks)
    mma_wait<1>();                             // this step's copies (all but the newest group) landed
    __syncthreads();                           // everyone's; and buffer s - 1 is free again
    copy(s == 0 ? 2 : s - 1, k0 + 2 * kMmaStep);
    multiply(s);
    s = s == 2 ? 0 : s + 1;
  }
  mma_wait<0>();
#else
  bytes16 ra[2], rb[2][kHalves];
  auto fetch = [&](int set, int k0) {
    const bool in = k0 + lc < k;  // K is whole chunks: a chunk is all in or all out
    ra[set] = a_ok && in ? *reinterpret_cast<const bytes16*>(a_src + k0) : bytes16{};
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
      rb[set][h] = b_ok && in ? *reinterpret_cast<const bytes16*>(b_src + h * n_out * row_stride + k0) : bytes16{};
  };
  fetch(0, 0);
  fetch(1, kMmaStep);
  auto step = [&](int s, int k0) {  // step k0 through LDS buffer (and register set) s
    *reinterpret_cast<bytes16*>(&as[s][lr * kMmaLd + lc]) = ra[s];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) *reinterpret_cast<bytes16*>(&bs[s][h][lr * kMmaLd + lc]) = rb[s][h];
    __syncthreads();
    if (k0 + 2 * kMmaStep < k) fetch(s, k0 + 2 * kMmaStep);
    multiply(s);
  };
  for (int k0 = 0; k0 < k; k0 += 2 * kMmaStep) {  // K < 2^30 (the launcher checks)
    step(0, k0);
    if (k0 + kMmaStep < k) step(1, k0 + kMmaStep);
  }
#endif
  if (!live) return;
#pragma unroll
  for (int j = 0; j < kMmaTiles; ++j)
#pragma unroll
    for (int i = 0; i < kMmaAcc; ++i) {
      const int64_t p = rows.pair[16 * mt + mma_row(i)];
      const int64_t n = n0 + 16 * (nt0 + j) + mma_col(i);
      if (p >= pairs || n >= n_out) continue;
      const float g = acc[0][j].v[i];
      if constexpr (GATED) {
        static_cast<typename T::storage*>(out)[p * n_out + n] =
            T::from_float(g / (1.0f + port_expf(-g)) * acc[kHalves - 1][j].v[i]);
      } else {
        static_cast<float*>(out)[p * n_out + n] = wts[p] * g;
      }
    }
}

// Every configuration the launcher uses.
#define FTLAB_MOE_GEMM_DENSE_INSTANTIATE(T)                                                                \
  template __global__ void moe_gemm_dense_kernel<T, T, T, true>(                                           \
      const T::storage*, int64_t, const T::storage*, int64_t, int64_t, const int32_t*, const int32_t*,     \
      const int32_t*, const float*, T::storage*, int64_t, int, int64_t, int64_t);                          \
  template __global__ void moe_gemm_dense_kernel<T, T, f32_t, false>(                                      \
      const T::storage*, int64_t, const T::storage*, int64_t, int64_t, const int32_t*, const int32_t*,     \
      const int32_t*, const float*, float*, int64_t, int, int64_t, int64_t);
FTLAB_MOE_GEMM_DENSE_INSTANTIATE(f32_t)
FTLAB_MOE_GEMM_DENSE_INSTANTIATE(f16_t)
FTLAB_MOE_GEMM_DENSE_INSTANTIATE(bf16_t)

#define FTLAB_MOE_GEMM_MMA_INSTANTIATE(T, G)                                                                  \
  template __global__ void moe_gemm_mma_kernel<T, G>(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, \
                                                     const int32_t*, const int32_t*, const int32_t*, const float*, \
                                                     void*, int64_t, int, int64_t, int64_t);
FTLAB_MOE_GEMM_MMA_INSTANTIATE(f16_t, true)
FTLAB_MOE_GEMM_MMA_INSTANTIATE(f16_t, false)
FTLAB_MOE_GEMM_MMA_INSTANTIATE(bf16_t, true)
FTLAB_MOE_GEMM_MMA_INSTANTIATE(bf16_t, false)

#define FTLAB_MOE_GEMM_Q4_INSTANTIATE(G)                                                                   \
  template __global__ void moe_gemm_q4_kernel<G>(const uint8_t*, int64_t, int64_t, const int8_t*,         \
                                                 const float*, const float*, const int32_t*, const int32_t*, \
                                                 const int32_t*, const float*, float*, int64_t, int, int64_t, \
                                                 int64_t);
FTLAB_MOE_GEMM_Q4_INSTANTIATE(true)
FTLAB_MOE_GEMM_Q4_INSTANTIATE(false)

}  // namespace ftlab

// moe_gemm.hip — device code of the prefill experts: grouped GEMMs over moe_align's rows
// (gate/up + SwiGLU, then down weighted by the routing weight), Q4_0 banks through dp4a tiles
// over Q8_1 rows and dense banks through fp32 FMA tiles.
//
// Contract: docs/OPS.md section 3 (moe_experts, prefill); reference: ftlab/reference/moe.py.
// Includes moe_common.h (then q4_0_common.h and port.h) only: the gfx compile check compiles
// this file alone.
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

__device__ __forceinline__ void store_tile(const float (&acc)[4][4], const float (&acc_up)[4][4], bool gated,
                                           const TileRows& rows, const float* wts, float* out, int64_t pairs,
                                           int64_t n_out, int64_t n0, int tx, int ty) {
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
      out[pair * n_out + n] = gated ? g / (1.0f + port_expf(-g)) * acc_up[i][j] : scale * g;
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

// Dense banks: fp32 FMA tiles. A: the activations' dtype (x for gate/up, fp32 h for down).
template <typename A, typename W, bool GATED>
__global__ void __launch_bounds__(kMoeThreads)
    moe_gemm_dense_kernel(const typename A::storage* __restrict__ a, int64_t a_stride,
                          const typename W::storage* __restrict__ bank, int64_t e_stride, int64_t row_stride,
                          const int32_t* __restrict__ sorted, const int32_t* __restrict__ expert_ids,
                          const int32_t* __restrict__ npad, const float* __restrict__ wts, float* __restrict__ out,
                          int64_t pairs, int top_k, int64_t n_out, int64_t k) {
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
  store_tile(acc, acc_up, GATED, rows, wts, out, pairs, n_out, n0, tx, ty);
}

// Every configuration the launcher uses.
#define FTLAB_MOE_GEMM_DENSE_INSTANTIATE(T)                                                             \
  template __global__ void moe_gemm_dense_kernel<T, T, true>(                                           \
      const T::storage*, int64_t, const T::storage*, int64_t, int64_t, const int32_t*, const int32_t*,  \
      const int32_t*, const float*, float*, int64_t, int, int64_t, int64_t);                            \
  template __global__ void moe_gemm_dense_kernel<f32_t, T, false>(                                      \
      const float*, int64_t, const T::storage*, int64_t, int64_t, const int32_t*, const int32_t*,       \
      const int32_t*, const float*, float*, int64_t, int, int64_t, int64_t);
FTLAB_MOE_GEMM_DENSE_INSTANTIATE(f32_t)
FTLAB_MOE_GEMM_DENSE_INSTANTIATE(f16_t)
FTLAB_MOE_GEMM_DENSE_INSTANTIATE(bf16_t)

#define FTLAB_MOE_GEMM_Q4_INSTANTIATE(G)                                                                   \
  template __global__ void moe_gemm_q4_kernel<G>(const uint8_t*, int64_t, int64_t, const int8_t*,         \
                                                 const float*, const float*, const int32_t*, const int32_t*, \
                                                 const int32_t*, const float*, float*, int64_t, int, int64_t, \
                                                 int64_t);
FTLAB_MOE_GEMM_Q4_INSTANTIATE(true)
FTLAB_MOE_GEMM_Q4_INSTANTIATE(false)

}  // namespace ftlab

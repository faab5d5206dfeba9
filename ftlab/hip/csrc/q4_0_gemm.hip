// q4_0_gemm.hip — device code of the GGUF Q4_0 prefill GEMM: the int8 dot of Q8_1 activations
// with Q4_0 weights in dp4a tiles.
//
// Contract: docs/OPS.md section 2 (q4_0_matmul, int8 path at prefill); reference:
// ftlab/reference/q4_0.py. Includes q4_0_common.h and port.h only: the gfx compile check
// compiles this file alone.
#include "q4_0_common.h"

namespace ftlab {

constexpr int kGemmThreads = 256;
constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kTileKB = 4;  // Q4_0 blocks (128 of K) per stage

// y[M, N] = int8 dot of Q8_1 activations with Q4_0 weights, 64x64 tiles, 256 threads,
// 4x4 outputs per thread. Weights are unpacked into LDS as nibble words (4 low, 4 high per
// block) so the inner loop is only dp4a and the per-block scale update.
__global__ void __launch_bounds__(kGemmThreads)
    q4_0_gemm_kernel(const uint8_t* __restrict__ w, int64_t row_bytes,
                     const int8_t* __restrict__ q8, const float* __restrict__ d8,
                     const float* __restrict__ s8, float* __restrict__ y, int64_t m_rows,
                     int64_t n_rows, int64_t k) {
  __shared__ int xs[kTileKB][kTileM][8 + 1];  // +1: no bank conflicts on the strided reads
  __shared__ float xd[kTileKB][kTileM], xsum[kTileKB][kTileM];
  __shared__ int ws[kTileKB][kTileN][8 + 1];
  __shared__ float wd[kTileKB][kTileN];
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int64_t nb = k / kQK;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int64_t b0 = 0; b0 < nb; b0 += kTileKB) {
    // stage activations: 64 rows x 4 blocks x 8 words; thread -> (row, block), 8 words each
    {
      const int r = tid / kTileKB, kb = tid % kTileKB;
      const int64_t m = m0 + r, b = b0 + kb;
      const bool ok = m < m_rows && b < nb;
      const int* src = reinterpret_cast<const int*>(q8 + (ok ? m * k + b * kQK : 0));
#pragma unroll
      for (int i = 0; i < 8; ++i) xs[kb][r][i] = ok ? src[i] : 0;
      xd[kb][r] = ok ? d8[m * nb + b] : 0.0f;
      xsum[kb][r] = ok ? s8[m * nb + b] : 0.0f;
    }
    // stage weights: 64 rows x 4 blocks, unpacked to 4 low + 4 high nibble words
    {
      const int r = tid / kTileKB, kb = tid % kTileKB;
      const int64_t n = n0 + r, b = b0 + kb;
      const bool ok = n < n_rows && b < nb;
      const uint16_t* src = reinterpret_cast<const uint16_t*>(w + (ok ? n * row_bytes + b * kBlockBytes : 0));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t word = ok ? (static_cast<uint32_t>(src[1 + 2 * i]) |
                                    (static_cast<uint32_t>(src[2 + 2 * i]) << 16))
                                 : 0u;
        ws[kb][r][i] = static_cast<int>(word & 0x0F0F0F0Fu);
        ws[kb][r][4 + i] = static_cast<int>((word >> 4) & 0x0F0F0F0Fu);
      }
      wd[kb][r] = ok ? port_half_to_float(src[0]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kb = 0; kb < kTileKB; ++kb) {
      int wv[4][8];
      float wdv[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int i = 0; i < 8; ++i) wv[j][i] = ws[kb][tx + 16 * j][i];
        wdv[j] = wd[kb][tx + 16 * j];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = ty + 16 * i;
        int xv[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) xv[t] = xs[kb][r][t];
        const float dx = xd[kb][r], sx = xsum[kb][r];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          int sumi = 0;
#pragma unroll
          for (int t = 0; t < 8; ++t) sumi = port_dp4a(wv[j][t], xv[t], sumi);
          acc[i][j] += wdv[j] * (dx * static_cast<float>(sumi) - 8.0f * sx);
        }
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

}  // namespace ftlab

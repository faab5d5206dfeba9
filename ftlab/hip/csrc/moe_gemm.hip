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

// fp16 / bf16 banks on the matrix cores: a block takes BM sorted rows (one expert; BM is
// moe_align's block_m) and BN output columns (BN more of up when GATED), K in steps of KS through
// MmaShape::kStages LDS buffers (dynamic LDS: MmaShape::lds_bytes), one barrier a step, the next steps'
// 16-byte loads in flight while one multiplies: kStages - 1 steps of cp.async copies where the
// target has them (FTLAB_MMA_ASYNC), else one step in registers. Each warp-sized group owns one
// 16-column tile in kPerGroup of the 16-row tiles, interleaved so that every group has one of the
// first rows (a block of an expert's rows is mostly filled from the start), its B fragments read
// once a 16-K slice; a row tile all padding (the tail of an expert's rows) is skipped. Needs K, the row strides and the base addresses in whole 16-byte chunks (the launcher
// checks; the FMA kernel above takes the rest). a and the GATED output h in T, the down output
// fp32 (weighted). KS = 64 reads 128 contiguous bytes of each row a step: with KS = 32 the same
// kernel took 1.3-1.45x longer on the H200 (benchmarks/NOTES.md).
#if defined(PORT_CUDA)  // blocks an SM by the LDS (227 KB), which caps the registers
#define FTLAB_MMA_BOUNDS __launch_bounds__(kMoeThreads, (MmaShape<BM, BN, KS, GATED>::kBlocks))
#else
#define FTLAB_MMA_BOUNDS __launch_bounds__(kMoeThreads)
#endif

template <int BM, int BN, int KS, bool GATED>
struct MmaShape {
  static constexpr int kHalves = GATED ? 2 : 1;
  // LDS buffers: on NVIDIA (sm_80+ cp.async) 4 for 64 rows (two blocks an SM either way), 3
  // for 32 (three blocks); 2 elsewhere. Host and device passes agree: the launcher sizes the LDS.
#if defined(PORT_CUDA)
  static constexpr int kStages = BM == 64 ? 4 : 3;
#else
  static constexpr int kStages = 2;
#endif
  static constexpr int kLd = KS + 8;  // LDS row stride (elements): chunks stay 16-byte aligned, fragment reads spread over the banks
  static constexpr int kRows = BM + kHalves * BN;  // LDS rows a stage: A's, then each B half's
  static constexpr int kChunks = KS / 8;            // 16-byte chunks of a row a step
  static constexpr int kSlots = (kRows * kChunks + kMoeThreads - 1) / kMoeThreads;  // chunks a thread copies
  static constexpr int lds_bytes() { return 2 * kStages * kRows * kLd; }
  static constexpr int kBlocks = lds_bytes() * 3 + 3 * 1024 <= 227 * 1024 ? 3 : lds_bytes() * 2 + 2048 <= 227 * 1024 ? 2 : 1;
  static_assert(BM % 16 == 0 && BN % 16 == 0 && KS % 16 == 0, "16 x 16 x 16 tiles");
};

template <typename T, bool GATED, int BM, int BN, int KS>
__global__ void FTLAB_MMA_BOUNDS
    moe_gemm_mma_kernel(const uint16_t* __restrict__ a, int64_t a_stride, const uint16_t* __restrict__ bank,
                        int64_t e_stride, int64_t row_stride, const int32_t* __restrict__ sorted,
                        const int32_t* __restrict__ expert_ids, const int32_t* __restrict__ npad,
                        const float* __restrict__ wts, void* __restrict__ out, int64_t pairs, int top_k,
                        int64_t n_out, int64_t k) {
  typedef MmaShape<BM, BN, KS, GATED> S;
  constexpr int kHalves = S::kHalves, kLd = S::kLd, kStage = S::kRows * kLd, kMmaStages = S::kStages;
  constexpr int kGroups = kMoeThreads / PORT_WARP_SIZE, kTilesM = BM / 16;
  // a group owns one 16-column tile (ct) in the row tiles rt = group / kTilesN + j kRowStride: so
  // the groups of the first rows -- the live ones of a partly filled block -- are all busy
  constexpr int kTilesN = BN / 16, kRowStride = kGroups / kTilesN, kPerGroup = kTilesM / kRowStride;
  static_assert(kGroups % kTilesN == 0 && kTilesM % kRowStride == 0 && kPerGroup >= 1, "tiles per group");
  extern __shared__ __attribute__((aligned(16))) uint16_t mma_lds[];  // [kStages][kRows][kLd]
  __shared__ int32_t rows[BM];
  if (static_cast<int64_t>(blockIdx.y) * BM >= *npad) return;
  const int tid = threadIdx.x;
  const int e = expert_ids[blockIdx.y];
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN;
  if (tid < BM) rows[tid] = sorted[static_cast<int64_t>(blockIdx.y) * BM + tid];
  __syncthreads();

  // the chunks this thread copies a step: chunk c = tid + kMoeThreads i is 8 elements at K offset
  // koff of LDS row c / kChunks (A's rows, then B's); src is its row's global start (+ koff), dst
  // its LDS offset in a stage. Only the last slot can be past the stage's chunks (copies_last).
  constexpr int kTotal = S::kRows * S::kChunks;
  const bool copies_last = kTotal % kMoeThreads == 0 || tid + kMoeThreads * (S::kSlots - 1) < kTotal;
  const uint16_t* src[S::kSlots];
  int dst[S::kSlots], koff[S::kSlots];
  unsigned ok = 0;  // bit i: slot i reads global memory (a live row or column); else it writes zeros
#pragma unroll
  for (int i = 0; i < S::kSlots; ++i) {
    const int c = tid + kMoeThreads * i < kTotal ? tid + kMoeThreads * i : kTotal - 1;
    const int r = c / S::kChunks;
    koff[i] = 8 * (c % S::kChunks);
    dst[i] = r * kLd + koff[i];
    bool reads;
    if (r < BM) {
      const int64_t pair = rows[r];
      reads = pair < pairs;
      src[i] = a + (reads ? (GATED ? pair / top_k : pair) * a_stride : 0) + koff[i];
    } else {
      const int h = (r - BM) / BN;
      const int64_t n = n0 + (r - BM) % BN;
      reads = n < n_out;
      src[i] = bank + e * e_stride + (reads ? (n + h * n_out) * row_stride : 0) + koff[i];
    }
    ok |= (reads ? 1u : 0u) << i;
  }

  const int group = tid / PORT_WARP_SIZE;
  const int ct = group % kTilesN, rt0 = group / kTilesN;
  bool live[kPerGroup];  // row tile j holds a real row (else its products and stores are skipped)
#pragma unroll
  for (int j = 0; j < kPerGroup; ++j) {
    live[j] = false;
#pragma unroll
    for (int i = 0; i < 16; ++i) live[j] = live[j] || rows[16 * (rt0 + j * kRowStride) + i] < pairs;
  }
  MmaAcc acc[kHalves][kPerGroup];
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int j = 0; j < kPerGroup; ++j)
#pragma unroll
      for (int i = 0; i < kMmaAcc; ++i) acc[h][j].v[i] = 0.0f;

  auto multiply = [&](int s) {
    if (!live[0]) return;  // row tiles fill in order: the first dead, all dead
    const uint16_t* st = mma_lds + s * kStage;
#pragma unroll
    for (int kk = 0; kk < KS; kk += 16) {
      MmaFrag fb[kHalves];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) fb[h] = mma_frag(st + (BM + h * BN + 16 * ct) * kLd + kk, kLd);
#pragma unroll
      for (int j = 0; j < kPerGroup; ++j) {
        if (!live[j]) continue;
        const MmaFrag fa = mma_frag(st + 16 * (rt0 + j * kRowStride) * kLd + kk, kLd);
#pragma unroll
        for (int h = 0; h < kHalves; ++h) mma_16x16x16<T>(acc[h][j], fa, fb[h]);
      }
    }
  };

#if defined(FTLAB_MMA_ASYNC)
  auto copy = [&](int s, int k0) {  // step k0 into buffer s; past K: zeros, nothing read
    uint16_t* st = mma_lds + s * kStage;
#pragma unroll
    for (int i = 0; i < S::kSlots; ++i) {
      if (i == S::kSlots - 1 && !copies_last) break;
      const bool in = k0 + koff[i] < k;  // K is whole chunks: a chunk is all in or all out
      mma_copy16(st + dst[i], src[i] + (in ? k0 : 0), in && ((ok >> i) & 1u));
    }
    mma_commit();
  };
#pragma unroll
  for (int i = 0; i + 1 < kMmaStages; ++i) copy(i, i * KS);
  int s = 0;
  for (int k0 = 0; k0 < k; k0 += KS) {  // K < 2^30 (the launcher checks)
    mma_wait<kMmaStages - 2>();         // this step's copies (all but the newest groups) landed
    __syncthreads();                    // everyone's; and the buffer multiplied last step is free
    copy(s == 0 ? kMmaStages - 1 : s - 1, k0 + (kMmaStages - 1) * KS);
    multiply(s);
    s = s == kMmaStages - 1 ? 0 : s + 1;
  }
  mma_wait<0>();
#else
  bytes16 reg[S::kSlots];  // the next step's chunks, loaded while this one multiplies
  auto fetch = [&](int k0) {
#pragma unroll
    for (int i = 0; i < S::kSlots; ++i) {
      const bool in = k0 + koff[i] < k;  // K is whole chunks: a chunk is all in or all out
      reg[i] = in && ((ok >> i) & 1u) ? *reinterpret_cast<const bytes16*>(src[i] + k0) : bytes16{};
    }
  };
  fetch(0);
  int s = 0;
  for (int k0 = 0; k0 < k; k0 += KS) {  // K < 2^30 (the launcher checks)
    uint16_t* st = mma_lds + s * kStage;  // free: its last readers passed the previous barrier
#pragma unroll
    for (int i = 0; i < S::kSlots; ++i) {
      if (i == S::kSlots - 1 && !copies_last) break;
      *reinterpret_cast<bytes16*>(st + dst[i]) = reg[i];
    }
    __syncthreads();
    if (k0 + KS < k) fetch(k0 + KS);
    multiply(s);
    s = s == kMmaStages - 1 ? 0 : s + 1;
  }
#endif
#pragma unroll
  for (int j = 0; j < kPerGroup; ++j)
#pragma unroll
    for (int i = 0; i < kMmaAcc; ++i) {
      if (!live[j]) break;
      const int64_t p = rows[16 * (rt0 + j * kRowStride) + mma_row(i)];
      const int64_t n = n0 + 16 * ct + mma_col(i);
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

// The matrix-core shapes (BM, BN, KS), one for each block_m the launcher takes (32, 64):
// FTLAB_MMA_SHAPES(X, T, G) calls X(T, G, BM, BN, KS) once each.
#define FTLAB_MMA_SHAPES(X, T, G) X(T, G, 32, 64, 64) X(T, G, 64, 64, 64)
#define FTLAB_MOE_GEMM_MMA_INSTANTIATE_ONE(T, G, BM, BN, KS)                                                   \
  template __global__ void moe_gemm_mma_kernel<T, G, BM, BN, KS>(                                              \
      const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, const int32_t*, const int32_t*,             \
      const int32_t*, const float*, void*, int64_t, int, int64_t, int64_t);
FTLAB_MMA_SHAPES(FTLAB_MOE_GEMM_MMA_INSTANTIATE_ONE, f16_t, true)
FTLAB_MMA_SHAPES(FTLAB_MOE_GEMM_MMA_INSTANTIATE_ONE, f16_t, false)
FTLAB_MMA_SHAPES(FTLAB_MOE_GEMM_MMA_INSTANTIATE_ONE, bf16_t, true)
FTLAB_MMA_SHAPES(FTLAB_MOE_GEMM_MMA_INSTANTIATE_ONE, bf16_t, false)

#define FTLAB_MOE_GEMM_Q4_INSTANTIATE(G)                                                                   \
  template __global__ void moe_gemm_q4_kernel<G>(const uint8_t*, int64_t, int64_t, const int8_t*,         \
                                                 const float*, const float*, const int32_t*, const int32_t*, \
                                                 const int32_t*, const float*, float*, int64_t, int, int64_t, \
                                                 int64_t);
FTLAB_MOE_GEMM_Q4_INSTANTIATE(true)
FTLAB_MOE_GEMM_Q4_INSTANTIATE(false)

}  // namespace ftlab

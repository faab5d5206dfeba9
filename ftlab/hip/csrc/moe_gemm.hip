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
// and 64 output columns, 256 threads with 4 x 4 outputs each; blocks past num_tokens_post_padded
// return at once, sentinel rows load zeros and store nothing. GATED: out[pair, n] = silu(a[pair /
// k] . W[n]) * (a[pair / k] . W[N + n]) (gate/up + SwiGLU); else out[pair, n] = w[pair] * (a[pair]
// . W[n]) (down, weighted). out is fp32 [pairs, N].
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
// MmaShape::kStages LDS buffers (dynamic LDS, lds_bytes), one barrier a step, the next steps'
// 16-byte loads in flight while one multiplies (cp.async where the target has them,
// FTLAB_MMA_ASYNC; else one step in registers). Each warp-sized group owns one 16-column tile in
// kPerGroup of the 16-row tiles, interleaved so that every group has one of the first (live) rows
// of a partly filled block; row tiles all padding are skipped. K, the row strides and the base
// addresses must be whole 16-byte chunks (the launcher checks; the FMA kernel above takes the
// rest). a and the GATED output h in T, the down output fp32 (weighted). KS = 64 (128 bytes of a
// row a step) and 3 blocks an SM (unpadded, swizzled rows: mma.h's mma_lds_at) were each faster
// (benchmarks/NOTES.md, "The hip grouped GEMM on the matrix cores in 64-wide K steps").
#if defined(PORT_CUDA)  // blocks an SM by the LDS (227 KB), which caps the registers
#define FTLAB_MMA_BOUNDS __launch_bounds__(kMoeThreads, (MmaShape<BM, BN, KS, GATED>::kBlocks))
#else
#define FTLAB_MMA_BOUNDS __launch_bounds__(kMoeThreads)
#endif

template <int BM, int BN, int KS, bool GATED>
struct MmaShape {
  static constexpr int kHalves = GATED ? 2 : 1;
  // LDS: on NVIDIA 3 buffers (sm_80+ cp.async) of rows KS long, their 16-byte chunks swizzled
  // (mma_lds_at: 3 blocks an SM at 64 rows); elsewhere 2 buffers of rows padded by 16 bytes
  // (chunks stay aligned, fragment reads spread over the banks). Host and device passes agree:
  // the launcher sizes the LDS.
#if defined(PORT_CUDA) && !defined(FTLAB_MMA_EMULATE)  // (the host tests' AMD layouts take AMD's)
  static constexpr int kStages = 3;
  static constexpr int kLd = KS;
#else
  static constexpr int kStages = 2;
  static constexpr int kLd = KS + 8;
#endif
  static constexpr int kRows = BM + kHalves * BN;  // LDS rows a stage: A's, then each B half's
  static constexpr int kChunks = KS / 8;            // 16-byte chunks of a row a step
  static constexpr int lds_bytes() { return 2 * kStages * kRows * kLd; }
  static constexpr int kBlocks =  // an H100 / H200 SM's 227 KB (elsewhere only the register cap is off)
      lds_bytes() * 3 + 3 * 1024 <= 227 * 1024 ? 3 : lds_bytes() * 2 + 2048 <= 227 * 1024 ? 2 : 1;
  static_assert(BM % 16 == 0 && BN % 16 == 0 && KS == 64, "16 x 16 x 16 tiles; 8 chunks a row (the swizzle)");
  static_assert(kMoeThreads % kChunks == 0, "a thread copies one chunk column");
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
  PORT_DYNAMIC_LDS(uint16_t, mma_lds);  // [kStages][kRows][kLd]
  __shared__ int32_t rows[BM];
  if (static_cast<int64_t>(blockIdx.y) * BM >= *npad) return;
  const int tid = threadIdx.x;
  const int e = expert_ids[blockIdx.y];
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN;
  if (tid < BM) rows[tid] = sorted[static_cast<int64_t>(blockIdx.y) * BM + tid];
  __syncthreads();

  // the chunks this thread copies a step: 8 elements at K offset koff of LDS rows r0 + kRowStep i
  // (slot i), A's rows for the first kSlotsA slots, then B's (gate, then up). A slot's LDS offset
  // is dst0 + i kRowStep kLd (kRowStep is a multiple of the swizzle's 8 rows); an A slot reads
  // from its own row (asrc), a B slot from bsrc + its row offset.
  constexpr int kRowStep = kMoeThreads / S::kChunks, kSlots = S::kRows / kRowStep, kSlotsA = BM / kRowStep;
  static_assert(BM % kRowStep == 0 && BN % kRowStep == 0 && kRowStep % 8 == 0, "whole slots of rows");
  const int koff = 8 * (tid % S::kChunks), r0 = tid / S::kChunks;
  const int dst0 = mma_lds_at<kLd>(r0, koff);
  const uint16_t* asrc[kSlotsA];
  unsigned ok = 0;  // bit i: slot i reads global memory (a live row or column); else it writes zeros
#pragma unroll
  for (int i = 0; i < kSlotsA; ++i) {
    const int64_t pair = rows[r0 + kRowStep * i];
    const bool reads = pair < pairs;
    asrc[i] = a + (reads ? (GATED ? pair / top_k : pair) * a_stride : 0) + koff;
    ok |= (reads ? 1u : 0u) << i;
  }
  const bool b_any = n0 + r0 < n_out;
  const uint16_t* bsrc = bank + e * e_stride + (b_any ? (n0 + r0) * row_stride : 0) + koff;
#pragma unroll
  for (int i = kSlotsA; i < kSlots; ++i)
    ok |= (n0 + r0 + (kRowStep * i - BM) % BN < n_out ? 1u : 0u) << i;
  // slot i's global source at K offset k0 (a live slot's; others read nothing)
  auto src_of = [&](int i, int k0) -> const uint16_t* {
    if (i < kSlotsA) return asrc[i] + k0;
    const int q = kRowStep * i - BM;
    return bsrc + ((q % BN) + static_cast<int64_t>(q / BN) * n_out) * row_stride + k0;
  };

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
#pragma unroll 2  // two 16-K slices at a time: 3 blocks an SM fit gate/up at 64 rows without spills
    for (int kk = 0; kk < KS; kk += 16) {
      MmaFrag fb[kHalves];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) fb[h] = mma_frag_at<kLd>(st, BM + h * BN + 16 * ct, kk);
#pragma unroll
      for (int j = 0; j < kPerGroup; ++j) {
        if (!live[j]) continue;
        const MmaFrag fa = mma_frag_at<kLd>(st, 16 * (rt0 + j * kRowStride), kk);
#pragma unroll
        for (int h = 0; h < kHalves; ++h) mma_16x16x16<T>(acc[h][j], fa, fb[h]);
      }
    }
  };

#if defined(FTLAB_MMA_ASYNC)
  auto copy = [&](int s, int k0) {  // step k0 into buffer s; past K: zeros, nothing read
    uint16_t* st = mma_lds + s * kStage + dst0;
    const bool in = k0 + koff < k;  // K is whole chunks: a chunk is all in or all out
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const bool reads = in && ((ok >> i) & 1u);
      mma_copy16(st + i * kRowStep * kLd, reads ? src_of(i, k0) : a, reads);
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
  bytes16 reg[kSlots];  // the next step's chunks, loaded while this one multiplies
  auto fetch = [&](int k0) {
    const bool in = k0 + koff < k;  // K is whole chunks: a chunk is all in or all out
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      reg[i] = in && ((ok >> i) & 1u) ? *reinterpret_cast<const bytes16*>(src_of(i, k0)) : bytes16{};
  };
  fetch(0);
  int s = 0;
  for (int k0 = 0; k0 < k; k0 += KS) {  // K < 2^30 (the launcher checks)
    uint16_t* st = mma_lds + s * kStage + dst0;  // free: its last readers passed the previous barrier
#pragma unroll
    for (int i = 0; i < kSlots; ++i) *reinterpret_cast<bytes16*>(st + i * kRowStep * kLd) = reg[i];
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

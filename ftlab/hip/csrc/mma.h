// mma.h — one 16 x 16 x 16 product on the matrix cores, for 16-bit operands (fp16 or bf16) and
// fp32 sums: a warp-sized group (a warp on NVIDIA, a wave on AMD) does
//   D[16 x 16] += A[16 x 16] . B[16 x 16]^T,
// A's and B's rows of K read from LDS (row-major, ld elements apart, 4-byte aligned rows).
//
// Per target (the fragment layouts are the instructions', as their ISA documents give them):
//   - NVIDIA sm_80+: two mma.sync.m16n8k16 (B's rows 0-7, then 8-15); lane = 4 g + t holds
//     D rows g and g + 8, columns 2t, 2t + 1 of each half.
//   - CDNA (gfx90a, gfx94x, wave64): v_mfma_f32_16x16x16 (bf16_1k / f16); lane l holds A's and B's
//     row l % 16, K 4 (l / 16) .. +3; D rows 4 (l / 16) .. +3 of column l % 16.
//   - RDNA3 / 3.5 (gfx11, wave32): v_wmma_f32_16x16x16 (_w32); lane l holds row l % 16, all of K
//     (lanes 16-31 repeat 0-15); D rows 2 i + l / 16 of column l % 16.
//   - RDNA4 (gfx12, wave32): v_wmma_f32_16x16x16 (_w32_gfx12); lane l holds row l % 16, K
//     8 (l / 16) .. +7; D rows 8 (l / 16) .. +7 of column l % 16.
//   - anything else (sm_70 / sm_75, the host pass): scalar FMAs from LDS, lane l holding the
//     kMmaAcc consecutive elements of D from l * kMmaAcc on (row-major).
// mma_row / mma_col give the place in D of a lane's accumulator i, so kernels store D without
// knowing the target. Callers: moe_gemm.hip (the grouped GEMM on 16-bit banks).
#pragma once
#include "q4_0_common.h"

namespace ftlab {

#if defined(PORT_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FTLAB_MMA_SYNC 1
#elif defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || \
    defined(__gfx950__)
#define FTLAB_MMA_MFMA 1
#elif defined(__GFX12__)
#define FTLAB_MMA_WMMA12 1
#elif defined(__GFX11__)
#define FTLAB_MMA_WMMA11 1
#endif

// fp32 sums a lane holds of one 16 x 16 D: 256 over the group's lanes.
constexpr int kMmaAcc = 256 / PORT_WARP_SIZE;

struct MmaAcc {
  float v[kMmaAcc];
};

__device__ __forceinline__ int mma_lane() { return static_cast<int>(threadIdx.x) % PORT_WARP_SIZE; }

// Row (A's row) and column (B's row) in D of accumulator i of this lane.
__device__ __forceinline__ int mma_row(int i) {
  const int l = mma_lane();
#if defined(FTLAB_MMA_SYNC)
  return l / 4 + 8 * ((i / 2) % 2);
#elif defined(FTLAB_MMA_MFMA)
  return 4 * (l / 16) + i;
#elif defined(FTLAB_MMA_WMMA12)
  return 8 * (l / 16) + i;
#elif defined(FTLAB_MMA_WMMA11)
  return 2 * i + l / 16;
#else
  return (l * kMmaAcc + i) / 16;
#endif
}
__device__ __forceinline__ int mma_col(int i) {
  const int l = mma_lane();
#if defined(FTLAB_MMA_SYNC)
  return 8 * (i / 4) + 2 * (l % 4) + i % 2;
#elif defined(FTLAB_MMA_MFMA) || defined(FTLAB_MMA_WMMA12) || defined(FTLAB_MMA_WMMA11)
  return l % 16;
#else
  return (l * kMmaAcc + i) % 16;
#endif
}

__device__ __forceinline__ uint32_t mma_word(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// D += A . B^T; T is f16_t or bf16_t (q4_0_common.h), a and b point at row 0, K 0 in LDS.
template <typename T>
__device__ __forceinline__ void mma_16x16x16(MmaAcc& d, const uint16_t* a, int lda, const uint16_t* b, int ldb) {
  constexpr bool kBf16 = T::kIsBf16;
  const int l = mma_lane();
#if defined(FTLAB_MMA_SYNC)
  const int g = l / 4, t = l % 4;
  const uint32_t a0 = mma_word(a + g * lda + 2 * t), a1 = mma_word(a + (g + 8) * lda + 2 * t);
  const uint32_t a2 = mma_word(a + g * lda + 2 * t + 8), a3 = mma_word(a + (g + 8) * lda + 2 * t + 8);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint16_t* bh = b + (8 * h + g) * ldb + 2 * t;
    const uint32_t b0 = mma_word(bh), b1 = mma_word(bh + 8);
    float* c = d.v + 4 * h;
    if constexpr (kBf16) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
#elif defined(FTLAB_MMA_MFMA) || defined(FTLAB_MMA_WMMA12) || defined(FTLAB_MMA_WMMA11)
#if defined(FTLAB_MMA_MFMA)
  constexpr int kN = 4;  // K values a lane holds
  const int k0 = 4 * (l / 16);
#elif defined(FTLAB_MMA_WMMA12)
  constexpr int kN = 8;
  const int k0 = 8 * (l / 16);
#else
  constexpr int kN = 16;
  const int k0 = 0;
#endif
  typedef uint32_t wordv __attribute__((ext_vector_type(kN / 2)));
  typedef float accv __attribute__((ext_vector_type(kMmaAcc)));
  wordv aw, bw;
  const uint16_t* ar = a + (l % 16) * lda + k0;
  const uint16_t* br = b + (l % 16) * ldb + k0;
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) {
    aw[i] = mma_word(ar + 2 * i);
    bw[i] = mma_word(br + 2 * i);
  }
  accv c;
#pragma unroll
  for (int i = 0; i < kMmaAcc; ++i) c[i] = d.v[i];
  if constexpr (kBf16) {
    typedef __bf16 opv __attribute__((ext_vector_type(kN)));
    const opv ao = __builtin_bit_cast(opv, aw), bo = __builtin_bit_cast(opv, bw);
#if defined(FTLAB_MMA_MFMA)
    c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(ao, bo, c, 0, 0, 0);
#elif defined(FTLAB_MMA_WMMA12)
    c = __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12(ao, bo, c);
#else
    c = __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(ao, bo, c);
#endif
  } else {
    typedef _Float16 opv __attribute__((ext_vector_type(kN)));
    const opv ao = __builtin_bit_cast(opv, aw), bo = __builtin_bit_cast(opv, bw);
#if defined(FTLAB_MMA_MFMA)
    c = __builtin_amdgcn_mfma_f32_16x16x16f16(ao, bo, c, 0, 0, 0);
#elif defined(FTLAB_MMA_WMMA12)
    c = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12(ao, bo, c);
#else
    c = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(ao, bo, c);
#endif
  }
#pragma unroll
  for (int i = 0; i < kMmaAcc; ++i) d.v[i] = c[i];
#else
  (void)l;
  (void)kBf16;
#pragma unroll
  for (int i = 0; i < kMmaAcc; ++i) {
    const uint16_t* ar = a + mma_row(i) * lda;
    const uint16_t* br = b + mma_col(i) * ldb;
    float s = d.v[i];
    for (int k = 0; k < 16; ++k) s += T::load(ar + k) * T::load(br + k);
    d.v[i] = s;
  }
#endif
}

}  // namespace ftlab

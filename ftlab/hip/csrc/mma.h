// mma.h — one 16 x 16 x 16 product on the matrix cores, for 16-bit operands (fp16 or bf16) and
// fp32 sums: a warp-sized group (a warp on NVIDIA, a wave on AMD) does
//   D[16 x 16] += A[16 x 16] . B[16 x 16]^T,
// A's and B's rows of K read from LDS (row-major, ld elements apart; rows 16-byte aligned on
// NVIDIA, 4-byte elsewhere).
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
//   - host tests with FTLAB_MMA_EMULATE (1 CDNA, 2 RDNA4, 3 RDNA3; tests/unit/host/port.h): that
//     target's fragments and accumulators, its instruction emulated across the group's lanes.
// mma_row / mma_col give the place in D of a lane's accumulator i, so kernels store D without
// knowing the target; mma_lds_at / mma_frag_at lay operands out in swizzled LDS rows on sm_80+.
// Callers: moe_gemm.hip (the grouped GEMM on 16-bit banks).
#pragma once
#include "q4_0_common.h"

namespace ftlab {

#if defined(FTLAB_MMA_EMULATE)  // host tests only: an AMD layout, its instruction emulated (below)
#if FTLAB_MMA_EMULATE == 1
#define FTLAB_MMA_MFMA 1
#elif FTLAB_MMA_EMULATE == 2
#define FTLAB_MMA_WMMA12 1
#else
#define FTLAB_MMA_WMMA11 1
#endif
#elif defined(PORT_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
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

// A lane's share of a 16 x 16 operand (16 rows of 16 K, row-major in LDS at p, ld elements
// apart): A's rows are D's rows, B's rows D's columns. One fragment type serves both.
#if defined(FTLAB_MMA_SYNC)
struct MmaFrag {
  uint32_t w[4];
};
// A: rows g and g + 8, K 2t (+1) and 2t + 8 (+1), in mma.sync's register order; B the same
// words, read as the two n8 halves (rows g, then g + 8). One ldmatrix.x4: lane l gives the
// address of row l % 16 at K 8 (l / 16), so its four 8 x 8 matrices are (rows 0-7, K 0-7),
// (rows 8-15, K 0-7), (rows 0-7, K 8-15), (rows 8-15, K 8-15) -- the register order above. Rows
// must start 16-byte aligned in LDS (ld a multiple of 8).
// mma_frag_lane: the same from each lane's own address (row l % 16, K 8 (l / 16) of the
// operand), for layouts that place rows' 16-byte chunks elsewhere (a swizzle).
__device__ __forceinline__ MmaFrag mma_frag_lane(const uint16_t* lane_row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(lane_row));
  MmaFrag f;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(f.w[0]), "=r"(f.w[1]), "=r"(f.w[2]), "=r"(f.w[3])
               : "r"(a));
  return f;
}
__device__ __forceinline__ MmaFrag mma_frag(const uint16_t* p, int ld) {
  const int l = mma_lane();
  return mma_frag_lane(p + (l % 16) * ld + 8 * (l / 16));
}
#elif defined(FTLAB_MMA_MFMA) || defined(FTLAB_MMA_WMMA12) || defined(FTLAB_MMA_WMMA11)
#if defined(FTLAB_MMA_MFMA)
constexpr int kMmaLaneK = 4;  // K values a lane holds, from 4 (l / 16) on
#elif defined(FTLAB_MMA_WMMA12)
constexpr int kMmaLaneK = 8;  // from 8 (l / 16) on
#else
constexpr int kMmaLaneK = 16;  // all of them
#endif
#if defined(FTLAB_MMA_EMULATE)
struct MmaFrag {
  uint32_t w[kMmaLaneK / 2];
};
#else
typedef uint32_t mma_words __attribute__((ext_vector_type(kMmaLaneK / 2)));
struct MmaFrag {
  mma_words w;
};
#endif
__device__ __forceinline__ MmaFrag mma_frag(const uint16_t* p, int ld) {
  const int l = mma_lane();
  const uint16_t* r = p + (l % 16) * ld + (kMmaLaneK == 16 ? 0 : kMmaLaneK * (l / 16));
  MmaFrag f;
#pragma unroll
  for (int i = 0; i < kMmaLaneK / 2; ++i) f.w[i] = mma_word(r + 2 * i);
  return f;
}
#else
struct MmaFrag {  // the scalar path reads LDS in the product itself
  const uint16_t* p;
  int ld;
};
__device__ __forceinline__ MmaFrag mma_frag(const uint16_t* p, int ld) { return {p, ld}; }
#endif

// Operands in LDS rows LD elements long: the offset (elements) of row r, K offset kc (a multiple
// of 8). On sm_80+ (LD = 64, eight 16-byte chunks a row) chunk c of row r sits at c ^ (r % 8):
// the eight rows an ldmatrix phase reads at one K fall in eight different bank quads. Elsewhere
// rows are padded by the caller (LD = K step + 8) and stored as they are.
template <int LD>
__device__ __forceinline__ int mma_lds_at(int r, int kc) {
#if defined(FTLAB_MMA_SYNC)
  return r * LD + 8 * ((kc / 8) ^ (r % 8));
#else
  return r * LD + kc;
#endif
}

// The fragment of the 16 x 16 operand at rows r0.., K kk.. of such rows from st (mma_frag, each
// lane's address through mma_lds_at on sm_80+).
template <int LD>
__device__ __forceinline__ MmaFrag mma_frag_at(const uint16_t* st, int r0, int kk) {
#if defined(FTLAB_MMA_SYNC)
  const int l = mma_lane(), r = r0 + l % 16;
  return mma_frag_lane(st + mma_lds_at<LD>(r, kk + 8 * (l / 16)));
#else
  return mma_frag(st + r0 * LD + kk, LD);
#endif
}

#if defined(FTLAB_MMA_SYNC)
#define FTLAB_MMA_SYNC_ASM(TYPE)                                                                      \
  "mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, " \
  "{%8, %9}, {%0, %1, %2, %3};"
#define FTLAB_MMA_SYNC_OPERANDS                                    \
  : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                 \
  : "r"(a.w[0]), "r"(a.w[1]), "r"(a.w[2]), "r"(a.w[3]), "r"(b0), "r"(b1)
#elif (defined(FTLAB_MMA_MFMA) || defined(FTLAB_MMA_WMMA12) || defined(FTLAB_MMA_WMMA11)) && \
    !defined(FTLAB_MMA_EMULATE)
typedef __bf16 mma_bf16v __attribute__((ext_vector_type(kMmaLaneK)));
typedef _Float16 mma_f16v __attribute__((ext_vector_type(kMmaLaneK)));
typedef float mma_accv __attribute__((ext_vector_type(kMmaAcc)));
__device__ __forceinline__ mma_accv mma_amd(mma_bf16v a, mma_bf16v b, mma_accv c) {
#if defined(FTLAB_MMA_MFMA)
  return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
#elif defined(FTLAB_MMA_WMMA12)
  return __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12(a, b, c);
#else
  return __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(a, b, c);
#endif
}
__device__ __forceinline__ mma_accv mma_amd(mma_f16v a, mma_f16v b, mma_accv c) {
#if defined(FTLAB_MMA_MFMA)
  return __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, 0, 0, 0);
#elif defined(FTLAB_MMA_WMMA12)
  return __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12(a, b, c);
#else
  return __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c);
#endif
}
template <bool kBf16>
struct MmaOperand {
  typedef mma_f16v type;
};
template <>
struct MmaOperand<true> {
  typedef mma_bf16v type;
};
#endif

// D += A . B^T; T is f16_t or bf16_t (q4_0_common.h).
template <typename T>
__device__ __forceinline__ void mma_16x16x16(MmaAcc& d, const MmaFrag& a, const MmaFrag& b) {
#if defined(FTLAB_MMA_SYNC)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t b0 = b.w[h], b1 = b.w[2 + h];  // rows 8h + g: K 2t (+1), 2t + 8 (+1)
    float* c = d.v + 4 * h;
    if constexpr (T::kIsBf16) {
      asm volatile(FTLAB_MMA_SYNC_ASM("bf16") FTLAB_MMA_SYNC_OPERANDS);
    } else {
      asm volatile(FTLAB_MMA_SYNC_ASM("f16") FTLAB_MMA_SYNC_OPERANDS);
    }
  }
#elif defined(FTLAB_MMA_EMULATE)
  // The instruction as its ISA document describes it, for the host tests: the group's lanes
  // publish their fragments, then each lane forms its accumulators' sums over K from the lanes
  // that hold A's row and B's row (lane 16 (k / kMmaLaneK) + row, word (k % kMmaLaneK) / 2).
  // Accumulator i of lane l is D's (row, column) as the ISA lays it out, spelled here apart from
  // mma_row / mma_col, so that a mistake in either shows.
  static uint32_t frag_a[1024][kMmaLaneK / 2], frag_b[1024][kMmaLaneK / 2];
  const int tid = static_cast<int>(threadIdx.x), l = mma_lane(), base = tid - l;
  for (int i = 0; i < kMmaLaneK / 2; ++i) {
    frag_a[tid][i] = a.w[i];
    frag_b[tid][i] = b.w[i];
  }
  port_sync_group();
  for (int i = 0; i < kMmaAcc; ++i) {
#if FTLAB_MMA_EMULATE == 1
    const int r = (l >> 4) * 4 + i;  // v_mfma_f32_16x16x16: 4 rows a lane, lanes 16 apart 4 rows on
#elif FTLAB_MMA_EMULATE == 2
    const int r = (l >> 4) * 8 + i;  // gfx12 WMMA: 8 rows a lane, lanes 16-31 the lower half
#else
    const int r = i * 2 + (l >> 4);  // gfx11 WMMA: every other row, lanes 16-31 the odd ones
#endif
    const int c = l & 15;
    float s = d.v[i];
    for (int k = 0; k < 16; ++k) {
      const int lane = 16 * (k / kMmaLaneK), w = (k % kMmaLaneK) / 2, half = 16 * (k % 2);
      const uint16_t x = static_cast<uint16_t>(frag_a[base + lane + r][w] >> half);
      const uint16_t y = static_cast<uint16_t>(frag_b[base + lane + c][w] >> half);
      s += T::load(&x) * T::load(&y);
    }
    d.v[i] = s;
  }
  port_sync_group();
#elif defined(FTLAB_MMA_MFMA) || defined(FTLAB_MMA_WMMA12) || defined(FTLAB_MMA_WMMA11)
  typedef typename MmaOperand<T::kIsBf16>::type opv;
  mma_accv c;
#pragma unroll
  for (int i = 0; i < kMmaAcc; ++i) c[i] = d.v[i];
  c = mma_amd(__builtin_bit_cast(opv, a.w), __builtin_bit_cast(opv, b.w), c);
#pragma unroll
  for (int i = 0; i < kMmaAcc; ++i) d.v[i] = c[i];
#else
#pragma unroll
  for (int i = 0; i < kMmaAcc; ++i) {
    const uint16_t* ar = a.p + mma_row(i) * a.ld;
    const uint16_t* br = b.p + mma_col(i) * b.ld;
    float s = d.v[i];
    for (int k = 0; k < 16; ++k) s += T::load(ar + k) * T::load(br + k);
    d.v[i] = s;
  }
#endif
}

// Copies of 16 bytes from global memory into LDS that run in the background (cp.async, sm_80+;
// FTLAB_MMA_ASYNC says the target has them): mma_copy16 starts one (zeros when !ok, reading
// nothing), mma_commit closes the group of copies this thread started since the last one, and
// mma_wait<N>() waits until at most N of its groups are still in flight.
#if defined(FTLAB_MMA_SYNC)
#define FTLAB_MMA_ASYNC 1
__device__ __forceinline__ void mma_copy16(void* lds, const void* src, bool ok) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(lds));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void mma_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void mma_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#endif

}  // namespace ftlab

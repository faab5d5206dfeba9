// gated_delta_rule_chunk.h — what the chunked prefill's two kernels share (gated_delta_rule_chunk_prep.hip,
// gated_delta_rule_chunk.hip): the chunk's sizes, the three-plane bf16 split of fp32 and its products, loads.
// The design is in gated_delta_rule_chunk.hip's head comment.
#pragma once
#include "mma.h"

namespace ftlab {

constexpr int kCk = 64;          // tokens a chunk
constexpr int kCkDk = 128;       // key rows (Dk padded with zeros)
constexpr int kCkBV = 32;        // state columns a scan block
constexpr int kCkHeads = 4;      // value heads a prep block
constexpr int kCkThreads = 256;
constexpr int kCkGroups = kCkThreads / PORT_WARP_SIZE;
constexpr int kLdK = kCkDk + 8;  // LDS row of Dk bf16 (16-byte aligned rows, banks spread)
constexpr int kLdT = kCk + 8;    // LDS row of 64 tokens
constexpr int kCkKQ = kCk * kCkDk / 8 / kCkThreads;  // 16-byte pieces of K (of Q) a thread
constexpr int kCkPlanes = kCk * kCk;  // elements a bf16 plane of ab (of attn)
// 16-byte pieces of ab's (attn's) P planes a thread (the scan asserts they divide evenly)
template <int P>
constexpr int kCkAB = P * kCkPlanes / 8 / kCkThreads;

// fp32 -> bf16 rounded to nearest even: one cvt on sm_80+ (port_float_to_bf16's bits for every
// finite x; a NaN stays a NaN), port_float_to_bf16 elsewhere
__device__ __forceinline__ uint16_t ck_bf16(float x) {
#if defined(PORT_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint16_t b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(x));
  return b;
#else
  return port_float_to_bf16(x);
#endif
}
// x = bf16(p0) + bf16(p1) + bf16(p2) + r, |r| <= 2^-24 |x| for normal parts
__device__ __forceinline__ void ck_split3(float x, uint16_t& p0, uint16_t& p1, uint16_t& p2) {
  p0 = ck_bf16(x);
  const float r = x - port_bf16_to_float(p0);
  p1 = ck_bf16(r);
  p2 = ck_bf16(r - port_bf16_to_float(p1));
}
// x's three planes, `plane` elements apart, at p
__device__ __forceinline__ void ck_put3(uint16_t* p, int plane, float x) {
  uint16_t p0, p1, p2;
  ck_split3(x, p0, p1, p2);
  p[0] = p0;
  p[plane] = p1;
  p[2 * plane] = p2;
}

// x's P planes (P = 1: x rounded to bf16 once; P = 3: ck_put3)
template <int P>
__device__ __forceinline__ void ck_putp(uint16_t* p, int plane, float x) {
  static_assert(P == 1 || P == 3, "one or three planes");
  if constexpr (P == 3) ck_put3(p, plane, x);
  else p[0] = ck_bf16(x);
}

// D += A B^T, A exact in bf16 (one plane), B in three planes bplane elements apart; the two small
// products go to t (added to D by the caller after its last call), so that D's and t's chains of
// dependent products run side by side
__device__ __forceinline__ void ck_mma_x3(MmaAcc& d, MmaAcc& t, const uint16_t* a, int lda, const uint16_t* b,
                                          int ldb, int bplane) {
  const MmaFrag fa = mma_frag(a, lda);
  mma_16x16x16<bf16_t>(t, fa, mma_frag(b + 2 * bplane, ldb));
  mma_16x16x16<bf16_t>(d, fa, mma_frag(b, ldb));
  mma_16x16x16<bf16_t>(t, fa, mma_frag(b + bplane, ldb));
}
// D += A B^T, both in three planes: the six products of parts down to 2^-16 relative, the three
// small ones to t (as ck_mma_x3)
__device__ __forceinline__ void ck_mma_x6(MmaAcc& d, MmaAcc& t, const uint16_t* a, int lda, int aplane,
                                          const uint16_t* b, int ldb, int bplane) {
  const MmaFrag a0 = mma_frag(a, lda), a1 = mma_frag(a + aplane, lda), a2 = mma_frag(a + 2 * aplane, lda);
  const MmaFrag b0 = mma_frag(b, ldb), b1 = mma_frag(b + bplane, ldb), b2 = mma_frag(b + 2 * bplane, ldb);
  mma_16x16x16<bf16_t>(t, a2, b0);
  mma_16x16x16<bf16_t>(d, a1, b0);
  mma_16x16x16<bf16_t>(t, a1, b1);
  mma_16x16x16<bf16_t>(d, a0, b1);
  mma_16x16x16<bf16_t>(t, a0, b2);
  mma_16x16x16<bf16_t>(d, a0, b0);
}
// D += A B^T with B (ck_mma_p) or both (ck_mma_pp) in P planes: P = 3, ck_mma_x3 / ck_mma_x6; P =
// 1, the one product of the bf16 operands (t untouched)
template <int P>
__device__ __forceinline__ void ck_mma_p(MmaAcc& d, MmaAcc& t, const uint16_t* a, int lda, const uint16_t* b, int ldb,
                                         int bplane) {
  if constexpr (P == 3) ck_mma_x3(d, t, a, lda, b, ldb, bplane);
  else mma_16x16x16<bf16_t>(d, mma_frag(a, lda), mma_frag(b, ldb));
}
template <int P>
__device__ __forceinline__ void ck_mma_pp(MmaAcc& d, MmaAcc& t, const uint16_t* a, int lda, int aplane,
                                          const uint16_t* b, int ldb, int bplane) {
  if constexpr (P == 3) ck_mma_x6(d, t, a, lda, aplane, b, ldb, bplane);
  else mma_16x16x16<bf16_t>(d, mma_frag(a, lda), mma_frag(b, ldb));
}
// d += t, t = 0
__device__ __forceinline__ void ck_fold(MmaAcc& d, MmaAcc& t) {
#pragma unroll
  for (int i = 0; i < kMmaAcc; ++i) {
    d.v[i] += t.v[i];
    t.v[i] = 0.0f;
  }
}

// ck_fold where the products had small terms (P = 3); nothing for one plane
template <int P>
__device__ __forceinline__ void ck_foldp(MmaAcc& d, MmaAcc& t) {
  if constexpr (P == 3) ck_fold(d, t);
}

// A token's log decay at least ftlab.reference.gated_delta_rule.G_FLOOR (-110: fp32 exp is 0 below it, so
// -inf or -1e30 still forget fully), so that a chunk's cumulative sums stay finite and keep the small
// decays after a forget; a NaN stays a NaN
constexpr float kCkGFloor = -110.0f;
__device__ __forceinline__ float ck_floor_g(float g) { return g < kCkGFloor ? kCkGFloor : g; }
// Whether a cumulative log decay is finite (not NaN, not +inf): a row whose c is not has its decays
// selected out of every sum over the chunk's rows (a select: NaN * 0 is NaN)
__device__ __forceinline__ bool ck_finite(float c) { return c - c == 0.0f; }

// min(a, b) without a comparison (|a - b| < 2^31): no lane mask for the compiler to keep
__device__ __forceinline__ int ck_min(int a, int b) { return b + ((a - b) & ((a - b) >> 31)); }

// Eight bf16 of row p from element d on, zeros past dk or where past < 0 (a row past the sequence;
// p must then still be a row inside it): one 16-byte load when vec (Dk % 8 == 0 and the tensor
// 16-byte aligned), else element by element. In-bounds loads masked by bits, no branches: on
// wave64 every lane mask is two SGPRs, and the compiler keeps them live across unrolled loads.
__device__ __forceinline__ bytes16 ck_load8(const uint16_t* p, int d, int dk, int past, bool vec) {
  if (vec) {
    const uint32_t keep = ~static_cast<uint32_t>((past | (dk - 1 - d)) >> 31);
    const bytes16 w = *reinterpret_cast<const bytes16*>(p + ck_min(d, dk - 8));
    uint32_t x[4];
    words_of(w, x);
    const bytes16 y = {x[0] & keep, x[1] & keep, x[2] & keep, x[3] & keep};
    return y;
  }
  uint32_t e[8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
    e[i] = p[ck_min(d + i, dk - 1)] & ~static_cast<uint32_t>((past | (dk - 1 - d - i)) >> 31) & 0xffffu;
  const bytes16 x = {e[0] | e[1] << 16, e[2] | e[3] << 16, e[4] | e[5] << 16, e[6] | e[7] << 16};
  return x;
}

// Whether q and k take ck_load8's 16-byte loads: Dk % 8 == 0 and both 16-byte aligned
__device__ __forceinline__ bool ck_kq16(const uint16_t* q, const uint16_t* k, int dk) {
  return dk % 8 == 0 && ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k)) & 15) == 0;
}
// K's and Q's eight bf16 from element d of token t0 + r (q, k [B, T, Hk, Dk]; sequence b, key head
// kh), zeros past the sequence or Dk
__device__ __forceinline__ void ck_load_kq(const uint16_t* q, const uint16_t* k, int b, int tokens, int hk, int kh,
                                           int dk, int t0, int r, int d, bool vec, bytes16& kv, bytes16& qv) {
  const int rlast = tokens - 1 - t0;
  const int64_t row = ((static_cast<int64_t>(b) * tokens + ck_min(t0 + r, tokens - 1)) * hk + kh) * dk;
  kv = ck_load8(k + row, d, dk, rlast - r, vec);
  qv = ck_load8(q + row, d, dk, rlast - r, vec);
}

__device__ __forceinline__ void ck_zero(MmaAcc& d) {
#pragma unroll
  for (int i = 0; i < kMmaAcc; ++i) d.v[i] = 0.0f;
}

// Row tile i and column tile j of the w-th of the 10 lower 16 x 16 tiles of a 64 x 64 matrix.
__device__ __forceinline__ void ck_lower_tile(int w, int& i, int& j) {
  i = w < 1 ? 0 : w < 3 ? 1 : w < 6 ? 2 : 3;
  j = w - i * (i + 1) / 2;
}

}  // namespace ftlab

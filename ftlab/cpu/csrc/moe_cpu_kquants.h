// moe_cpu_kquants.h — int8 row dots of GGUF Q8_0 / Q4_K / Q5_K / Q6_K rows with Q8_1 activations
// (32-blocks: q int8, d = amax / 127, s = d * sum q), for the CPU expert kernel (moe_cpu.cc).
//
// Each weight sub-block meets the Q8_1 block it lies in through an exact integer dot sumi, and the
// terms are those of ftlab/reference/quant_matmul.py (docs/OPS.md sections 3 and 11):
//   Q8_0, per 32-block:               d * (d8 * sumi)
//   Q4_K / Q5_K, per 32-sub-block j:  d * (d8 * (sc[j] * sumi)) - dmin * (m[j] * s8)
//   Q6_K, per 16-sub-block j:         d * (d8 * (scales[j] * sumi)), q - 32 in -32..31
// sc * sumi is an exact integer; only the fp32 scaling and the order of the sum differ from the
// reference. With AVX2 + FMA + F16C the integer lane sums of a block (maddubs + madd, exact) are
// scaled and accumulated in 8 fp32 lanes a row, added up once a row; scalar code elsewhere.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

#include "cpu_job.h"

namespace ftlab {
namespace cpu {

inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    int shift = 0;
    while (!(man & 0x400u)) {
      man <<= 1;
      ++shift;
    }
    return bits_to_float(sign | (static_cast<uint32_t>(113 - shift) << 23) | ((man & 0x3ffu) << 13));
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}

namespace kq {

constexpr int kQ8_0Bytes = 34, kQ4KBytes = 144, kQ5KBytes = 176, kQ6KBytes = 210;

inline float f16_at(const uint8_t* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(b);
#else
  return half_to_float(b);
#endif
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's 12 scale bytes.
inline void scale_min(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define FTLAB_KQ_VECTOR 1
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 8 int32 lane sums of 32 unsigned weights (each <= 63) times 32 int8 activations, exact.
inline __m256i lanes_u8(__m256i w, __m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
}

// 32 bytes shifted right by `shift` (< 8) bit for bit, then masked: a 16-bit shift carries the
// high byte's bits into the low byte's top, which the mask clears for masks below 1 << (8 - shift).
inline __m256i shr_mask(__m256i v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(static_cast<char>(mask)));
}
#endif

inline float q8_0_row_dot(const uint8_t* row, int nb32, const int8_t* q, const float* d) {
#if defined(FTLAB_KQ_VECTOR)
  __m256 acc = _mm256_setzero_ps();
  for (int b = 0; b < nb32; ++b) {
    const uint8_t* blk = row + b * kQ8_0Bytes;
    const __m256i w = load32(blk + 2), a = load32(q + b * 32);
    // |w| as unsigned (-128 -> 128) times a with w's sign: |a| <= 127, so no overflow
    const __m256i lanes = lanes_u8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(blk) * d[b]), _mm256_cvtepi32_ps(lanes), acc);
  }
  return hsum8(acc);
#else
  float acc = 0.0f;
  for (int b = 0; b < nb32; ++b) {
    const uint8_t* blk = row + b * kQ8_0Bytes;
    const int8_t* w = reinterpret_cast<const int8_t*>(blk + 2);
    int sumi = 0;
    for (int l = 0; l < 32; ++l) sumi += static_cast<int>(w[l]) * q[b * 32 + l];
    acc += f16_at(blk) * (d[b] * static_cast<float>(sumi));
  }
  return acc;
#endif
}

// Q4_K (FIFTH false) and Q5_K (FIFTH true): 256-blocks of 8 sub-blocks of 32; sub-block j takes
// the low (j even) or high (j odd) nibbles of bytes 32 * (j / 2) .. + 32 of qs, and for Q5_K
// bit j of qh[l] as the fifth bit of its element l.
template <bool FIFTH>
inline float q45_k_row_dot(const uint8_t* row, int nb32, const int8_t* q, const float* d, const float* s) {
  constexpr int bytes = FIFTH ? kQ5KBytes : kQ4KBytes;
  constexpr int qs_off = FIFTH ? 48 : 16;
#if defined(FTLAB_KQ_VECTOR)
  // two accumulators (the even and the odd sub-blocks) and the dmin * (m * s8) terms in 8 lanes
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), corr = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int blk = 0; blk < nb32 / 8; ++blk) {
    const uint8_t* p = row + blk * bytes;
    const float dd = f16_at(p);
    alignas(32) int sc[8], mn[8];
    for (int j = 0; j < 8; ++j) scale_min(j, p + 4, &sc[j], &mn[j]);
    const __m256 mins = _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(mn)));
    corr = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(p + 2)), _mm256_mul_ps(mins, _mm256_loadu_ps(s + blk * 8)), corr);
    const __m256i qh = FIFTH ? load32(p + 16) : _mm256_setzero_si256();
    for (int pr = 0; pr < 4; ++pr) {
      const int b = blk * 8 + 2 * pr;
      const __m256i raw = load32(p + qs_off + 32 * pr);
      __m256i w0 = _mm256_and_si256(raw, low4), w1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      if (FIFTH) {
        w0 = _mm256_or_si256(w0, _mm256_slli_epi16(shr_mask(qh, 2 * pr, 1), 4));
        w1 = _mm256_or_si256(w1, _mm256_slli_epi16(shr_mask(qh, 2 * pr + 1, 1), 4));
      }
      // pairs in int16 (|.| <= 2 * 31 * 127), then pairs of those times sc in int32: sc * sumi exact
      const __m256i l0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w0, load32(q + b * 32)),
                                           _mm256_set1_epi16(static_cast<int16_t>(sc[2 * pr])));
      const __m256i l1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w1, load32(q + (b + 1) * 32)),
                                           _mm256_set1_epi16(static_cast<int16_t>(sc[2 * pr + 1])));
      acc0 = _mm256_fmadd_ps(_mm256_set1_ps(dd * d[b]), _mm256_cvtepi32_ps(l0), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_set1_ps(dd * d[b + 1]), _mm256_cvtepi32_ps(l1), acc1);
    }
  }
  return hsum8(_mm256_add_ps(acc0, acc1)) - hsum8(corr);
#else
  float acc = 0.0f, corr = 0.0f;
  for (int blk = 0; blk < nb32 / 8; ++blk) {
    const uint8_t* p = row + blk * bytes;
    const float dd = f16_at(p), dmin = f16_at(p + 2);
    for (int j = 0; j < 8; ++j) {
      const int b = blk * 8 + j;
      int sc, m;
      scale_min(j, p + 4, &sc, &m);
      corr += dmin * (static_cast<float>(m) * s[b]);
      int sumi = 0;
      for (int l = 0; l < 32; ++l) {
        int v = (p[qs_off + 32 * (j / 2) + l] >> (4 * (j & 1))) & 0x0F;
        if (FIFTH) v |= ((p[16 + l] >> j) & 1) << 4;
        sumi += v * q[b * 32 + l];
      }
      acc += dd * (d[b] * static_cast<float>(sc * sumi));
    }
  }
  return acc - corr;
#endif
}

// Q6_K: 256-blocks of two halves of 128; in half h, group g (0..3) of 32 elements takes the low
// (g < 2) or high nibbles of ql[64 h + 32 (g & 1) + l] and bits 2g, 2g+1 of qh[32 h + l] as its
// top two bits; 16-sub-blocks with int8 scales[8 h + 2 g + l / 16]; q - 32.
inline float q6_k_row_dot(const uint8_t* row, int nb32, const int8_t* q, const float* d) {
#if defined(FTLAB_KQ_VECTOR)
  __m256 acc = _mm256_setzero_ps();
  const __m256i m32 = _mm256_set1_epi8(32);
#else
  float acc = 0.0f;
#endif
  for (int blk = 0; blk < nb32 / 8; ++blk) {
    const uint8_t* p = row + blk * kQ6KBytes;
    const int8_t* scales = reinterpret_cast<const int8_t*>(p + 192);
    const float dd = f16_at(p + 208);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = p + 64 * h;
      const uint8_t* qh = p + 128 + 32 * h;
#if defined(FTLAB_KQ_VECTOR)
      const __m256i qhv = load32(qh);
#endif
      for (int g = 0; g < 4; ++g) {
        const int b = blk * 8 + h * 4 + g;
        const int s0 = scales[8 * h + 2 * g], s1 = scales[8 * h + 2 * g + 1];
#if defined(FTLAB_KQ_VECTOR)
        const __m256i w = _mm256_or_si256(shr_mask(load32(ql + 32 * (g & 1)), 4 * (g >> 1), 0x0F),
                                          _mm256_slli_epi16(shr_mask(qhv, 2 * g, 3), 4));
        const __m256i a = load32(q + b * 32);
        // pairs of (q - 32) * a in int16 (|.| <= 2 * 32 * 127), then times the scale of each half
        const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(w, a), _mm256_maddubs_epi16(m32, a));
        const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(s1)),
                                            _mm_set1_epi16(static_cast<int16_t>(s0)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dd * d[b]), _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, sc)), acc);
#else
        int sumi[2] = {0, 0};
        for (int l = 0; l < 32; ++l) {
          const int v = (((ql[32 * (g & 1) + l] >> (4 * (g >> 1))) & 0x0F) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
          sumi[l / 16] += v * q[b * 32 + l];
        }
        acc += dd * (d[b] * static_cast<float>(s0 * sumi[0])) + dd * (d[b] * static_cast<float>(s1 * sumi[1]));
#endif
      }
    }
  }
#if defined(FTLAB_KQ_VECTOR)
  return hsum8(acc);
#else
  return acc;
#endif
}

inline bool is_kquant(int kind) { return kind >= FTLAB_BANK_Q8_0 && kind <= FTLAB_BANK_Q6_K; }

// Bytes of a row of k weights of a quantized kind.
inline int64_t row_bytes(int kind, int64_t k) {
  switch (kind) {
    case FTLAB_BANK_Q4_0: return k / 32 * 18;
    case FTLAB_BANK_Q8_0: return k / 32 * kQ8_0Bytes;
    case FTLAB_BANK_Q4_K: return k / 256 * kQ4KBytes;
    case FTLAB_BANK_Q5_K: return k / 256 * kQ5KBytes;
    default: return k / 256 * kQ6KBytes;
  }
}

// The int8 dot of one row of a K-quant / Q8_0 kind with a Q8_1 row of nb32 blocks.
inline float row_dot(int kind, const uint8_t* row, int nb32, const int8_t* q, const float* d, const float* s) {
  switch (kind) {
    case FTLAB_BANK_Q8_0: return q8_0_row_dot(row, nb32, q, d);
    case FTLAB_BANK_Q4_K: return q45_k_row_dot<false>(row, nb32, q, d, s);
    case FTLAB_BANK_Q5_K: return q45_k_row_dot<true>(row, nb32, q, d, s);
    default: return q6_k_row_dot(row, nb32, q, d);
  }
}

}  // namespace kq
}  // namespace cpu
}  // namespace ftlab

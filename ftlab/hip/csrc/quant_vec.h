// quant_vec.h — the one-row K-quant matvec's "vec" pieces (quant_matmul.hip, mv1_vec): eight lanes
// to a super-block, lane c reading 16 contiguous bytes of its quant field with one 16-byte load, so
// that the eight lanes of a super-block read its 128 qs / ql bytes in one coalesced sweep (a
// 32-lane group: four super-blocks a load instruction), where the lanes kernel reads 4-byte
// words of eight scattered 32-byte runs per instruction.
//
// Lane c's 16 bytes hold 16 weights of two 32-weight units, a (low nibbles) and b (high nibbles):
//   Q4_K / Q5_K: qs bytes 16c .. 16c + 15 = weights 16 (c % 2) .. of sub-blocks 2 (c / 2) and
//                2 (c / 2) + 1; the header (d, dmin, the 12 scale bytes) is one more 16-byte load
//                shared by the eight lanes, Q5_K's qh bytes 16 (c % 2) .. another.
//   Q6_K:        ql bytes 16c .. = weights 16 (c % 2) .. of quarters t and t + 2 (t = (c / 2) % 2)
//                of half c / 4, with qh bytes 128 + 32 (c / 4) + 16 (c % 2) ..; its blocks are
//                210 bytes, 2-byte aligned only, so a piece is cut from the two aligned 16-byte
//                loads that cover it (load16_a2; w must start 16-byte aligned).
// Terms, as in quant_units.h but over the lane's 16 weights of each unit: the Q4_K / Q5_K min term
// (dmin * m * s8, s8 covering the unit's 32 weights) is subtracted by the lane holding the first 16.
#pragma once
#include "quant_units.h"

namespace ftlab {
namespace qmm {

// A lane's activations: words 4 (c % 2) .. of the Q8_1 blocks of its units a and b, their d8, s8.
struct XHalf {
  int a[4], b[4];
  float da, db, sa, sb;
  __device__ __forceinline__ void load(const int8_t* q8, const float* d8, const float* s8, int64_t ua, int64_t ub,
                                       int half, bool has) {
    const int* wa = reinterpret_cast<const int*>(q8 + ua * 32 + 16 * half);
    const int* wb = reinterpret_cast<const int*>(q8 + ub * 32 + 16 * half);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a[i] = has ? wa[i] : 0;
      b[i] = has ? wb[i] : 0;
    }
    da = has ? d8[ua] : 0.0f;
    db = has ? d8[ub] : 0.0f;
    sa = has ? s8[ua] : 0.0f;
    sb = has ? s8[ub] : 0.0f;
  }
};

template <typename Q>
struct Vec;

template <bool kFifth>
struct Vec<QK4<kFifth>> {
  static __device__ __forceinline__ int unit_a(int c) { return 2 * (c >> 1); }
  static __device__ __forceinline__ int unit_b(int c) { return 2 * (c >> 1) + 1; }
  uint32_t h[4], q[4], e[4];  // header words, qs words, (Q5_K) qh words
  __device__ __forceinline__ void load(const uint8_t* blk, int c) {
    words_of(*reinterpret_cast<const bytes16*>(blk), h);
    words_of(*reinterpret_cast<const bytes16*>(blk + QK4<kFifth>::kQs + 16 * c), q);
    if (kFifth) words_of(*reinterpret_cast<const bytes16*>(blk + 16 + 16 * (c & 1)), e);
  }
  __device__ __forceinline__ float term(int c, const XHalf& x) const {
    const int ja = 2 * (c >> 1), jb = ja + 1;
    // llama.cpp's get_scale_min_k4 for sub-blocks ja, jb at once, on the 16-bit words of the
    // scale field (bytes ja, jb are word c / 2), branch-free: the lanes of a group differ in c, so
    // branches on it would run both sides. Sub-blocks 0..3: scales in bytes j, mins in j + 4 (low
    // six bits); 4..7: low four bits from byte j + 4, high two from the top of bytes j - 4 (scale)
    // and j (min).
    const bool up = c >= 4;
    const int sh = 16 * ((c >> 1) & 1);
    const uint32_t a = ((up ? h[2] : h[1]) >> sh) & 0xFFFFu;  // bytes ja, jb
    const uint32_t b = ((up ? h[3] : h[2]) >> sh) & 0xFFFFu;  // bytes ja + 4, jb + 4
    const uint32_t lo = (h[1] >> sh) & 0xFFFFu;               // bytes ja - 4, jb - 4 (c >= 4)
    const uint32_t sc = up ? ((b & 0x0F0Fu) | ((lo & 0xC0C0u) >> 2)) : (a & 0x3F3Fu);
    const uint32_t mn = up ? (((b >> 4) & 0x0F0Fu) | ((a & 0xC0C0u) >> 2)) : (b & 0x3F3Fu);
    const float sca = static_cast<float>(sc & 0xFFu), scb = static_cast<float>(sc >> 8);
    const float mna = static_cast<float>(mn & 0xFFu), mnb = static_cast<float>(mn >> 8);
    int ia = 0, ib = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t wa = q[i] & 0x0F0F0F0Fu, wb = (q[i] >> 4) & 0x0F0F0F0Fu;
      if (kFifth) {
        wa |= ((e[i] >> ja) & 0x01010101u) << 4;
        wb |= ((e[i] >> jb) & 0x01010101u) << 4;
      }
      ia = port_dp4a(static_cast<int>(wa), x.a[i], ia);
      ib = port_dp4a(static_cast<int>(wb), x.b[i], ib);
    }
    const float d = port_half_to_float(static_cast<uint16_t>(h[0] & 0xFFFFu));
    const float dmin = port_half_to_float(static_cast<uint16_t>(h[0] >> 16));
    const float r = d * (x.da * (sca * static_cast<float>(ia)) + x.db * (scb * static_cast<float>(ib)));
    const float m = dmin * (mna * x.sa + mnb * x.sb);
    return (c & 1) == 0 ? r - m : r;  // a select, not a branch (see above)
  }
};

// The 16 bytes `mis` (0..15) bytes past the 16-byte aligned p, as four words, cut from the two
// aligned 16-byte loads p[0], p[1] by 64-bit funnel shifts of named values (an array indexed by
// the offset would land in scratch on AMD).
__device__ __forceinline__ void cut16(const bytes16* p, int mis, uint32_t out[4]) {
  uint32_t w[4], v[4];
  words_of(p[0], w);
  words_of(p[1], v);
  const uint64_t q0 = w[0] | (static_cast<uint64_t>(w[1]) << 32), q1 = w[2] | (static_cast<uint64_t>(w[3]) << 32);
  const uint64_t q2 = v[0] | (static_cast<uint64_t>(v[1]) << 32), q3 = v[2] | (static_cast<uint64_t>(v[3]) << 32);
  const bool up = (mis & 8) != 0;  // the piece starts in the second 8 bytes
  const uint64_t x0 = up ? q1 : q0, x1 = up ? q2 : q1, x2 = up ? q3 : q2;
  const int sh = (mis & 7) * 8;  // 0, 16, 32 or 48 bits (pieces start at even offsets)
  const uint64_t r0 = sh == 0 ? x0 : (x0 >> sh) | (x1 << (64 - sh));
  const uint64_t r1 = sh == 0 ? x1 : (x1 >> sh) | (x2 << (64 - sh));
  out[0] = static_cast<uint32_t>(r0);
  out[1] = static_cast<uint32_t>(r0 >> 32);
  out[2] = static_cast<uint32_t>(r1);
  out[3] = static_cast<uint32_t>(r1 >> 32);
}

// The 16 bytes at p (2-byte aligned), cut from the two aligned 16-byte loads that cover them (the
// 32 bytes from p & ~15 must be readable).
__device__ __forceinline__ void load16_a2(const uint8_t* p, uint32_t out[4]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  cut16(reinterpret_cast<const bytes16*>(a & ~static_cast<uintptr_t>(15)), static_cast<int>(a & 15), out);
}

template <>
struct Vec<Q6_K> {
  static __device__ __forceinline__ int unit_a(int c) { return 4 * (c >> 2) + ((c >> 1) & 1); }
  static __device__ __forceinline__ int unit_b(int c) { return 4 * (c >> 2) + ((c >> 1) & 1) + 2; }
  uint32_t l[4], e[4];  // ql words, qh words
  float d, sca, scb;
  __device__ __forceinline__ void load(const uint8_t* blk, int c) {
    const int hf = c >> 2, t = (c >> 1) & 1, half = c & 1;
    load16_a2(blk + 16 * c, l);  // = 64 hf + 32 t + 16 half
    load16_a2(blk + 128 + 32 * hf + 16 * half, e);
    const int8_t* scales = reinterpret_cast<const int8_t*>(blk + 192);
    sca = static_cast<float>(scales[8 * hf + 2 * t + half]);
    scb = static_cast<float>(scales[8 * hf + 2 * t + 4 + half]);
    d = half_at(blk + 208);
  }
  __device__ __forceinline__ float term(int c, const XHalf& x) const {
    const int t = (c >> 1) & 1;
    int ia = 0, ib = 0, sa = 0, sb = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t wa = (l[i] & 0x0F0F0F0Fu) | (((e[i] >> (2 * t)) & 0x03030303u) << 4);
      const uint32_t wb = ((l[i] >> 4) & 0x0F0F0F0Fu) | (((e[i] >> (2 * t + 4)) & 0x03030303u) << 4);
      ia = port_dp4a(static_cast<int>(wa), x.a[i], ia);
      ib = port_dp4a(static_cast<int>(wb), x.b[i], ib);
      sa = port_dp4a(0x01010101, x.a[i], sa);
      sb = port_dp4a(0x01010101, x.b[i], sb);
    }
    return d * (x.da * (sca * static_cast<float>(ia - 32 * sa)) + x.db * (scb * static_cast<float>(ib - 32 * sb)));
  }
};

}  // namespace qmm
}  // namespace ftlab

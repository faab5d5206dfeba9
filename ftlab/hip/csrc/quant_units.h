// quant_units.h — the 32-weight units of GGUF Q8_0, Q4_K, Q5_K and Q6_K weights as the int8-dot
// kernels (quant_matmul.hip, moe_kquant.hip) decode them into registers, and their terms against a
// Q8_1 activation block; the layouts and the arithmetic are described in quant_matmul.hip's header.
#pragma once
#include "q4_0_common.h"

namespace ftlab {
namespace qmm {

constexpr int kGroup = 32;        // threads per weight row (the matvecs and moe_kquant.hip's experts)
constexpr int kRowsPerBlock = 4;  // rows per 128-thread block

__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ uint32_t load_w16(const uint8_t* p) { return load_u16(p) | (load_u16(p + 2) << 16); }
__device__ __forceinline__ uint32_t load_w32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ float half_at(const uint8_t* p) { return port_half_to_float(static_cast<uint16_t>(load_u16(p))); }

// Q8_0 (34 bytes / 32): d fp16, q[32] int8.
struct Q8_0 {
  static constexpr int kBlock = 32, kBytes = 34, kUnits = 1;
  static constexpr bool kVec = false;  // no quant_vec.h pieces (the K-quants have them)
  uint32_t q[8];
  float d;
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = 0;
    d = 0.0f;
  }
  __device__ __forceinline__ void load(const uint8_t* blk, int) {
    d = half_at(blk);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = load_w16(blk + 2 + 4 * i);
  }
  __device__ __forceinline__ float term(const int x[8], float d8, float) const {
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) sumi = port_dp4a(static_cast<int>(q[i]), x[i], sumi);
    return d * (d8 * static_cast<float>(sumi));
  }
};

// Q4_K (144 bytes / 256) and Q5_K (176: qh[32] before qs): unit j is sub-block j, the low
// (j even) or high (j odd) nibbles of qs bytes 32 (j / 2) ..; Q5_K's fifth bit is bit j of qh[l].
template <bool kFifth>
struct QK4 {
  static constexpr int kBlock = 256, kBytes = kFifth ? 176 : 144, kUnits = 8;
  static constexpr int kQs = kFifth ? 48 : 16;
  uint32_t q[8];
  float d, dmin, sc, mn;
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = 0;
    d = dmin = sc = mn = 0.0f;
  }
  __device__ __forceinline__ void load(const uint8_t* blk, int j) {
    d = half_at(blk);
    dmin = half_at(blk + 2);
    const uint8_t* s = blk + 4;  // llama.cpp's get_scale_min_k4
    if (j < 4) {
      sc = static_cast<float>(s[j] & 63);
      mn = static_cast<float>(s[j + 4] & 63);
    } else {
      sc = static_cast<float>((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
      mn = static_cast<float>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
    const uint8_t* qs = blk + kQs + 32 * (j >> 1);
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      q[i] = (load_w32(qs + 4 * i) >> shift) & 0x0F0F0F0Fu;
      if (kFifth) q[i] |= ((load_w32(blk + 16 + 4 * i) >> j) & 0x01010101u) << 4;
    }
  }
  __device__ __forceinline__ float term(const int x[8], float d8, float s8) const {
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) sumi = port_dp4a(static_cast<int>(q[i]), x[i], sumi);
    return d * (d8 * (sc * static_cast<float>(sumi))) - dmin * (mn * s8);
  }
  static constexpr bool kVec = true;
};

// Q6_K (210 bytes / 256): unit u is quarter t = u % 4 of half h = u / 4: weight l (0..31) is
// nibble t / 2 of ql byte 64h + 32 (t % 2) + l with bits 2t, 2t + 1 of qh byte 128 + 32h + l;
// weights 0..15 take scale 8h + 2t, 16..31 scale 8h + 2t + 1.
struct Q6_K {
  static constexpr int kBlock = 256, kBytes = 210, kUnits = 8;
  uint32_t q[8];  // q + 32, 0..63
  float d, sc_a, sc_b;
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = 0;
    d = sc_a = sc_b = 0.0f;
  }
  __device__ __forceinline__ void load(const uint8_t* blk, int u) {
    const int h = u >> 2, t = u & 3;
    d = half_at(blk + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(blk + 192);
    sc_a = static_cast<float>(scales[8 * h + 2 * t]);
    sc_b = static_cast<float>(scales[8 * h + 2 * t + 1]);
    const uint8_t* ql = blk + 64 * h + 32 * (t & 1);
    const uint8_t* qh = blk + 128 + 32 * h;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      q[i] = ((load_w16(ql + 4 * i) >> (4 * (t >> 1))) & 0x0F0F0F0Fu) |
             (((load_w16(qh + 4 * i) >> (2 * t)) & 0x03030303u) << 4);
    }
  }
  __device__ __forceinline__ float term(const int x[8], float d8, float) const {
    int a = 0, b = 0, xa = 0, xb = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a = port_dp4a(static_cast<int>(q[i]), x[i], a);
      xa = port_dp4a(0x01010101, x[i], xa);
      b = port_dp4a(static_cast<int>(q[i + 4]), x[i + 4], b);
      xb = port_dp4a(0x01010101, x[i + 4], xb);
    }
    const float sa = static_cast<float>(a - 32 * xa), sb = static_cast<float>(b - 32 * xb);
    return d * (d8 * (sc_a * sa)) + d * (d8 * (sc_b * sb));
  }
  static constexpr bool kVec = true;
};

// The sum of a group's partial sums, in every lane.
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int off = kGroup / 2; off > 0; off >>= 1) v += port_shfl_xor(v, off);
  return v;
}

// The term of unit u of a row of activations (q8 row, its d8 / s8).
template <typename Q>
__device__ __forceinline__ float unit_term(const Q& blk, const int8_t* q8, const float* d8, const float* s8,
                                           int64_t u) {
  const int* xw = reinterpret_cast<const int*>(q8 + u * 32);
  int x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = xw[i];
  return blk.term(x, d8[u], s8[u]);
}

}  // namespace qmm
}  // namespace ftlab

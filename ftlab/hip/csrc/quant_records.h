// quant_records.h — K-quant pieces against activations held as q4_0_common.h's activation records
// in LDS, for the one-launch kernels that quantize x themselves: quant_vec.h's pieces and a lane's
// halves of a record (moe_kquant.hip's decode experts, quant_matmul_mv1.hip), and the one-row
// matvecs' view of each type (MvOf: VecMv for Q4_K / Q5_K, Q6Quad for Q6_K, Q4Eighth / Q8Eighth for
// Q4_0 / Q8_0 in groups of eight blocks).
#pragma once
#include "quant_vec.h"

namespace ftlab {
namespace qmm {

// One super-block's Q8_1 activations (256 of them) as 32-bit words: q the 64 words of its eight
// blocks' int8 (block j's at 8j .. 8j + 7), d and s the eight blocks' d8 and s8 as float bits. From an
// activation record in LDS (q4_0_common.h: d8 at word 64 + j, s8 at 72 + j) or from Q8_1 arrays in
// memory (q [K] int8, d and s [K / 32] fp32: quantize_q8_1_kernel's, which the records copy).
struct Acts {
  const uint32_t *q, *d, *s;
};
__device__ __forceinline__ Acts acts_of_record(const uint32_t* rec) { return {rec, rec + 64, rec + 72}; }
__device__ __forceinline__ Acts acts_of_q8(const int8_t* q8, const float* d8, const float* s8, int sb) {
  return {reinterpret_cast<const uint32_t*>(q8) + 64 * sb, reinterpret_cast<const uint32_t*>(d8) + 8 * sb,
          reinterpret_cast<const uint32_t*>(s8) + 8 * sb};
}

// Lane c's activation halves of units ja, jb (words 4 half ..) of a super-block's activations.
__device__ __forceinline__ void xhalf_of(XHalf& x, const Acts& a, int ja, int jb, int half) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x.a[i] = static_cast<int>(a.q[8 * ja + 4 * half + i]);
    x.b[i] = static_cast<int>(a.q[8 * jb + 4 * half + i]);
  }
  x.da = port_bits_to_float(a.d[ja]);
  x.db = port_bits_to_float(a.d[jb]);
  x.sa = port_bits_to_float(a.s[ja]);
  x.sb = port_bits_to_float(a.s[jb]);
}
__device__ __forceinline__ void xhalf_of_record(XHalf& x, const uint32_t* rec, int ja, int jb, int half) {
  xhalf_of(x, acts_of_record(rec), ja, jb, half);
}

// The one-row kernels' view of a type (quant_matmul_mv1.hip): kLanes lanes to a super-block (a group
// takes kGroup / kLanes super-blocks a step), X a lane's activations of one super-block, read from
// its activation record by xload, kHeld steps of them held in registers where a row is that
// short. For Q4_K / Q5_K quant_vec.h's pieces (eight lanes, two 16-weight halves each).
template <typename Q>
struct VecMv : Vec<Q> {
  static constexpr int kLanes = 8, kHeld = 2;
  using X = XHalf;
  static __device__ __forceinline__ void xload(X& x, const Acts& a, int c) {
    xhalf_of(x, a, Vec<Q>::unit_a(c), Vec<Q>::unit_b(c), c & 1);
  }
  // the super-block `off` bytes into a 16-byte aligned LDS row (the staged kernel)
  __device__ __forceinline__ void load_slot(const uint8_t* slot, int off, int c) { this->load(slot + off, c); }
};

// The 16 bytes `off` (even) bytes past `base` (16-byte aligned; LDS or global), as load16_a2 cuts
// them, but from an offset rather than an address, so that a pointer into LDS stays one (the
// compiler then emits shared-memory loads, where an address cast to an integer makes them generic).
__device__ __forceinline__ void load16_at(const uint8_t* base, int off, uint32_t out[4]) {
  cut16(reinterpret_cast<const bytes16*>(base + (off & ~15)), off & 15, out);
}

// Q6_K in quads: four lanes to a super-block, lane c taking weights 16 (c % 2) .. + 15 of all four
// quarters of half c / 2 (64 weights, as Triton's word matvec cuts Q6_K): three 16-byte pieces
// (ql bytes 64 h + 16 s and 64 h + 32 + 16 s, qh bytes 128 + 32 h + 16 s; 2-byte aligned, cut by
// load16_a2), where eight lanes of quant_vec.h's Vec<Q6_K> load four pieces for half as many
// weights each and one qh piece twice. The q - 32 offset is taken from the activations' sums,
// which xload computes into X: once a kernel where the activations are held (K <= 2048), once a
// super-block a row on longer rows (as vec's eight extra dp4a a piece would be).
struct Q6QuadX {
  int q[16];  // words 4 s .. 4 s + 3 of the Q8_1 blocks of quarters 0..3 (blocks 4 h + t)
  float d[4];
  int sum[4];  // the sums of those 16 int8 activations, per quarter
};
struct Q6Quad {
  static constexpr int kLanes = 4, kHeld = 1;
  using X = Q6QuadX;
  uint32_t l0[4], l1[4], e[4];  // ql (quarters 0 / 2), ql (1 / 3), qh
  float sc[4], d;
  static __device__ __forceinline__ void xload(X& x, const Acts& a, int c) {
    const int h = c >> 1, s = c & 1;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int j = 4 * h + t;
      int sum = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x.q[4 * t + i] = static_cast<int>(a.q[8 * j + 4 * s + i]);
        sum = port_dp4a(0x01010101, x.q[4 * t + i], sum);
      }
      x.d[t] = port_bits_to_float(a.d[j]);
      x.sum[t] = sum;
    }
  }
  __device__ __forceinline__ void load(const uint8_t* blk, int c) {
    const int h = c >> 1, s = c & 1;
    load16_a2(blk + 64 * h + 16 * s, l0);
    load16_a2(blk + 64 * h + 32 + 16 * s, l1);
    load16_a2(blk + 128 + 32 * h + 16 * s, e);
    scales_of(blk, c);
  }
  // the super-block `off` bytes into a 16-byte aligned LDS row (the staged kernel)
  __device__ __forceinline__ void load_slot(const uint8_t* slot, int off, int c) {
    const int h = c >> 1, s = c & 1;
    load16_at(slot, off + 64 * h + 16 * s, l0);
    load16_at(slot, off + 64 * h + 32 + 16 * s, l1);
    load16_at(slot, off + 128 + 32 * h + 16 * s, e);
    scales_of(slot + off, c);
  }
  __device__ __forceinline__ void scales_of(const uint8_t* blk, int c) {
    const int8_t* scales = reinterpret_cast<const int8_t*>(blk + 192 + 8 * (c >> 1) + (c & 1));  // 8 h + 2 t + s
#pragma unroll
    for (int t = 0; t < 4; ++t) sc[t] = static_cast<float>(scales[2 * t]);
    d = half_at(blk + 208);
  }
  __device__ __forceinline__ float term(int, const X& x) const {
    float r = 0.0f;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      int sum = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t lw = (t & 1) ? l1[i] : l0[i];
        const uint32_t wq = ((lw >> (4 * (t >> 1))) & 0x0F0F0F0Fu) | (((e[i] >> (2 * t)) & 0x03030303u) << 4);
        sum = port_dp4a(static_cast<int>(wq), x.q[4 * t + i], sum);
      }
      r += x.d[t] * (sc[t] * static_cast<float>(sum - 32 * x.sum[t]));
    }
    return d * r;
  }
};

// Q4_0 and Q8_0 to the one-row kernels: eight blocks (256 weights; 144 / 272 bytes, so every group
// of eight starts 16-byte aligned where w does) taken as one super-block.
struct Q4_0x8 {
  static constexpr int kBlock = 256, kBytes = 8 * 18;
};
struct Q8_0x8 {
  static constexpr int kBlock = 256, kBytes = 8 * 34;
};

// The 16 bytes `off` (even) bytes past `base` (16-byte aligned), as load16_at cuts them, but never
// reading the aligned 16 bytes after them when they are aligned themselves (the last of a row's
// blocks then ends its buffer).
__device__ __forceinline__ void load16_in(const uint8_t* base, int off, uint32_t out[4]) {
  const bytes16* p = reinterpret_cast<const bytes16*>(base + (off & ~15));
  const int mis = off & 15;
  const bytes16 two[2] = {p[0], p[mis != 0 ? 1 : 0]};
  cut16(two, mis, out);
}

// A lane's activations of one Q8_1 block: its eight q8 words, d8, s8.
struct BlockX {
  int q[8];
  float d, s;
};
__device__ __forceinline__ void block_x_of(BlockX& x, const Acts& a, int c) {
#pragma unroll
  for (int i = 0; i < 8; ++i) x.q[i] = static_cast<int>(a.q[8 * c + i]);
  x.d = port_bits_to_float(a.d[c]);
  x.s = port_bits_to_float(a.s[c]);
}

// What the eighths views share: eight lanes to a group of eight blocks, two steps held, a lane's
// activations its block's Q8_1 (Self::load_slot reads a group at an offset into LDS or memory).
template <typename Self>
struct Eighths {
  static constexpr int kLanes = 8, kHeld = 2;
  using X = BlockX;
  static __device__ __forceinline__ void xload(X& x, const Acts& a, int c) { block_x_of(x, a, c); }
  __device__ __forceinline__ void load(const uint8_t* blk, int c) { static_cast<Self*>(this)->load_slot(blk, 0, c); }
};

// Q4_0 in eighths: lane c of eight takes block c of a group of eight whole (d at byte 18 c, its 16
// qs bytes after: one 2-byte aligned piece); the term is the Q4_0 kernels' d4 (d8 sumi - 8 s8).
struct Q4Eighth : Eighths<Q4Eighth> {
  uint32_t q[4];
  float d;
  __device__ __forceinline__ void load_slot(const uint8_t* slot, int off, int c) {
    load16_in(slot, off + 18 * c + 2, q);
    d = half_at(slot + off + 18 * c);
  }
  __device__ __forceinline__ float term(int, const X& x) const {
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sumi = port_dp4a(static_cast<int>(q[i] & 0x0F0F0F0Fu), x.q[i], sumi);
      sumi = port_dp4a(static_cast<int>((q[i] >> 4) & 0x0F0F0F0Fu), x.q[i + 4], sumi);
    }
    return d * (x.d * static_cast<float>(sumi) - 8.0f * x.s);
  }
};

// Q8_0 in eighths: lane c of eight takes block c of a group of eight (d at byte 34 c, its 32 q
// bytes after: two 2-byte aligned pieces); the term is d (d8 sumi).
struct Q8Eighth : Eighths<Q8Eighth> {
  uint32_t q[8];
  float d;
  __device__ __forceinline__ void load_slot(const uint8_t* slot, int off, int c) {
    load16_in(slot, off + 34 * c + 2, q);
    load16_in(slot, off + 34 * c + 18, q + 4);
    d = half_at(slot + off + 34 * c);
  }
  __device__ __forceinline__ float term(int, const X& x) const {
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) sumi = port_dp4a(static_cast<int>(q[i]), x.q[i], sumi);
    return d * (x.d * static_cast<float>(sumi));
  }
};

template <typename Q>
struct MvOf {
  using type = VecMv<Q>;
};
template <>
struct MvOf<Q6_K> {
  using type = Q6Quad;
};
template <>
struct MvOf<Q4_0x8> {
  using type = Q4Eighth;
};
template <>
struct MvOf<Q8_0x8> {
  using type = Q8Eighth;
};

}  // namespace qmm
}  // namespace ftlab

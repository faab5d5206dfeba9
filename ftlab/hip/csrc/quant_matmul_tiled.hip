// quant_matmul_tiled.hip — device code of the tiled int8-dot matvec (up to 8 rows of Q8_1
// activations) of GGUF Q8_0, Q4_K, Q5_K and Q6_K weights: every weight byte read once for all
// M rows, with 16-byte coalesced loads transposed through LDS.
//
// Contract: docs/OPS.md section 11 (quant_matmul, int8 path); reference:
// ftlab/reference/quant_matmul.py. The unit terms are those of quant_matmul.hip (a "unit" is 32
// weights, the span of one Q8_1 block): the same integer dots and the same fp32 products.
//
// A "super" is the span one lane decodes: a Q4_K / Q5_K / Q6_K super-block (256 weights, 8
// units) or four Q8_0 blocks (128 weights). A group of 32 threads (a warp; half a wave on CDNA)
// owns a region of 32 supers: 32 / G weight rows times G consecutive supers of each. Per region:
// - load: each row's span (G supers, 2-byte aligned) is covered by P aligned 16-byte pieces;
//   lane l takes pieces 32t + l of the region, so a load instruction covers 512 contiguous bytes
//   of a row (G >= 4) or whole spans of 2..8 rows;
// - transpose: the pieces go to the group's LDS, rows 4P + 1 words apart (odd: lane l's reads of
//   its super land on distinct banks for G = 1, where the lanes are the rows);
// - compute: lane l reads super l (row l / G, super l % G) as 32-bit words into registers and
//   decodes its units with constant offsets; each unit's weight words serve all M activation
//   rows, whose Q8_1 blocks are read from memory (L1: with G = 1 every lane of the group reads
//   the same block, a broadcast).
// The next region's pieces are loaded into registers before the current one is computed; the
// grid is persistent and every group walks the same number of regions (uniform trip counts).
// Partial sums of a row meet across its G lanes by port_shfl_xor.
//
// Includes q4_0_common.h and port.h only: the gfx compile check compiles this file alone.
#include "q4_0_common.h"

namespace ftlab {
namespace qmt {

constexpr int kGroup = 32;   // threads per region
constexpr int kGroups = 4;   // groups per 128-thread block

// Byte i, the fp16 at byte i (even) and the 32-bit word at byte i (even) of a super held as
// little-endian words; i is a constant after unrolling, so these fold to shifts.
__device__ __forceinline__ uint32_t byte_at(const uint32_t* w, int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xFFu; }
__device__ __forceinline__ float half_at(const uint32_t* w, int i) {
  return port_half_to_float(static_cast<uint16_t>((w[i >> 2] >> (8 * (i & 3))) & 0xFFFFu));
}
__device__ __forceinline__ uint32_t word_at(const uint32_t* w, int i) {
  return (i & 3) ? (w[i >> 2] >> 16) | (w[(i >> 2) + 1] << 16) : w[i >> 2];
}

__device__ __forceinline__ int dot8(const uint32_t q[8], const int x[8]) {
  int sumi = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) sumi = port_dp4a(static_cast<int>(q[i]), x[i], sumi);
  return sumi;
}

// Four Q8_0 blocks (34 bytes each: d fp16, q[32] int8): unit u is block u.
struct SQ8_0 {
  static constexpr int kBytes = 136, kUnits = 4, kPieces = 10;
  uint32_t q[8];
  float d;
  __device__ __forceinline__ void decode(const uint32_t* w, int u) {
    d = half_at(w, 34 * u);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = word_at(w, 34 * u + 2 + 4 * i);
  }
  __device__ __forceinline__ float term(const int x[8], float d8, float) const {
    return d * (d8 * static_cast<float>(dot8(q, x)));
  }
};

// Q4_K (144 bytes) and Q5_K (176: qh[32] at 16, qs after it): unit j is sub-block j, the low
// (j even) or high (j odd) nibbles of qs bytes 32 (j / 2) ..; Q5_K's fifth bit is bit j of qh[l].
template <bool kFifth>
struct SQK4 {
  static constexpr int kBytes = kFifth ? 176 : 144, kUnits = 8, kPieces = kFifth ? 12 : 10;
  static constexpr int kQs = kFifth ? 48 : 16;
  uint32_t q[8];
  float d, dmin, sc, mn;
  __device__ __forceinline__ void decode(const uint32_t* w, int j) {
    d = half_at(w, 0);
    dmin = half_at(w, 2);
    if (j < 4) {  // llama.cpp's get_scale_min_k4 on the 12 scale bytes at 4
      sc = static_cast<float>(byte_at(w, 4 + j) & 63);
      mn = static_cast<float>(byte_at(w, 8 + j) & 63);
    } else {
      sc = static_cast<float>((byte_at(w, 8 + j) & 0x0F) | ((byte_at(w, j) >> 6) << 4));
      mn = static_cast<float>((byte_at(w, 8 + j) >> 4) | ((byte_at(w, 4 + j) >> 6) << 4));
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      q[i] = (word_at(w, kQs + 32 * (j >> 1) + 4 * i) >> (4 * (j & 1))) & 0x0F0F0F0Fu;
      if (kFifth) q[i] |= ((word_at(w, 16 + 4 * i) >> j) & 0x01010101u) << 4;
    }
  }
  __device__ __forceinline__ float term(const int x[8], float d8, float s8) const {
    return d * (d8 * (sc * static_cast<float>(dot8(q, x)))) - dmin * (mn * s8);
  }
};

// Q6_K (210 bytes): unit u is quarter t = u % 4 of half h = u / 4: weight l (0..31) is nibble
// t / 2 of ql byte 64h + 32 (t % 2) + l with bits 2t, 2t + 1 of qh byte 128 + 32h + l; weights
// 0..15 take int8 scale 8h + 2t (at byte 192), 16..31 scale 8h + 2t + 1; d at byte 208.
struct SQ6_K {
  static constexpr int kBytes = 210, kUnits = 8, kPieces = 14;
  uint32_t q[8];  // q + 32, 0..63
  float d, sc_a, sc_b;
  __device__ __forceinline__ void decode(const uint32_t* w, int u) {
    const int h = u >> 2, t = u & 3;
    d = half_at(w, 208);
    sc_a = static_cast<float>(static_cast<int8_t>(byte_at(w, 192 + 8 * h + 2 * t)));
    sc_b = static_cast<float>(static_cast<int8_t>(byte_at(w, 193 + 8 * h + 2 * t)));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      q[i] = ((word_at(w, 64 * h + 32 * (t & 1) + 4 * i) >> (4 * (t >> 1))) & 0x0F0F0F0Fu) |
             (((word_at(w, 128 + 32 * h + 4 * i) >> (2 * t)) & 0x03030303u) << 4);
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
};

// 16 bytes at p, of which only those in [lo, hi) are read (the rest are 0): the pieces at the
// two ends of w, which may hang over them.
__device__ __forceinline__ bytes16 load_piece(const uint8_t* p, const uint8_t* lo, const uint8_t* hi) {
  if (p >= lo && p + 16 <= hi) return *reinterpret_cast<const bytes16*>(p);
  uint32_t v[4] = {0u, 0u, 0u, 0u};
  for (int i = 0; i < 16; ++i) {
    if (p + i >= lo && p + i < hi) v[i >> 2] |= static_cast<uint32_t>(p[i]) << (8 * (i & 3));
  }
  bytes16 r;
#if defined(PORT_CUDA)
  r.x = v[0];
  r.y = v[1];
  r.z = v[2];
  r.w = v[3];
#else
  r[0] = v[0];
  r[1] = v[1];
  r[2] = v[2];
  r[3] = v[3];
#endif
  return r;
}

// y[m, n] (fp32) = sum over the row's units of the unit terms, for M = MV_M rows of Q8_1
// activations q8 [M, K] (int8, rows contiguous, 16-byte aligned), d8 / s8 [M, K/32]. g: supers
// per row in a region (1, 2, 4, 8, 16 or 32), with (32 / g) * pieces_per_row <= 32 * kPieces.
template <typename Q, int MV_M>
__global__ void __launch_bounds__(kGroup * kGroups)
    quant_mv_tiled_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, const int8_t* __restrict__ q8,
                          const float* __restrict__ d8, const float* __restrict__ s8, float* __restrict__ y,
                          int64_t n_rows, int64_t k, int g) {
  constexpr int kWords = (Q::kBytes + 3) / 4;
  constexpr int kStride = 4 * Q::kPieces + 1;  // LDS words per row at G = 1
  __shared__ uint32_t lds[kGroups][kGroup * kStride + 1];
  const int lane = threadIdx.x;
  const int group = threadIdx.y;
  uint32_t* region = lds[group];
  const int64_t units = k / 32;
  const int64_t supers = units / Q::kUnits;  // per row
  const int rows = kGroup / g;                // rows per region
  const int pieces = (14 + g * Q::kBytes + 15) / 16;  // per row span, whatever its alignment
  const int stride = 4 * pieces + 1;                  // LDS words per row
  const int64_t k_steps = (supers + g - 1) / g;
  const int64_t row_sets = (n_rows + rows - 1) / rows;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kGroups;
  const int64_t first_set = static_cast<int64_t>(blockIdx.x) * kGroups + group;
  const int64_t items = (row_sets + groups - 1) / groups * k_steps;  // the same in every group
  const uint8_t* w_end = w + n_rows * row_bytes;

  // region (set, ks): rows set * rows + r, supers ks * g ..; row r's span starts at byte
  // first(r) and its pieces at the 16-byte aligned address below it
  auto first_of = [&](int64_t set, int64_t ks, int r) { return w + (set * rows + r) * row_bytes + ks * g * Q::kBytes; };
  auto lo_of = [](const uint8_t* first) {
    return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(first) & ~static_cast<uintptr_t>(15));
  };
  bytes16 r[Q::kPieces];
  auto load_region = [&](int64_t set, int64_t ks) {
    const int64_t s_end = (ks + 1) * g < supers ? (ks + 1) * g : supers;
#pragma unroll
    for (int t = 0; t < Q::kPieces; ++t) {
      const int p = t * kGroup + lane;
      const int rr = p / pieces, j = p - rr * pieces;
      r[t] = bytes16{};
      if (rr < rows && set * rows + rr < n_rows) {
        const uint8_t* first = first_of(set, ks, rr);
        const uint8_t* end = first + (s_end - ks * g) * Q::kBytes;
        const uint8_t* piece = lo_of(first) + 16 * j;
        if (piece < end) r[t] = load_piece(piece, w, w_end);
      }
    }
  };
  int64_t set = first_set, ks = 0;  // the region of the current item
  if (items > 0) load_region(set, ks);

  float acc[MV_M];
#pragma unroll
  for (int m = 0; m < MV_M; ++m) acc[m] = 0.0f;
  const int my_row = lane / g, my_super = lane % g;
  for (int64_t item = 0; item < items; ++item) {
    const int64_t row = set * rows + my_row;
    const int64_t sb = ks * g + my_super;
#pragma unroll
    for (int t = 0; t < Q::kPieces; ++t) {
      const int p = t * kGroup + lane;
      const int rr = p / pieces, j = p - rr * pieces;
      if (rr < rows) {
        uint32_t v[4];
        words_of(r[t], v);
        uint32_t* dst = region + rr * stride + 4 * j;
        dst[0] = v[0];
        dst[1] = v[1];
        dst[2] = v[2];
        dst[3] = v[3];
      }
    }
    port_sync_group();
    uint32_t sw[kWords];
    {
      const uint8_t* first = first_of(set, ks, my_row);
      const int off = static_cast<int>(first - lo_of(first)) + my_super * Q::kBytes;  // even
      const uint32_t* src = region + my_row * stride + (off >> 2);
      const int sh = 8 * (off & 2);
      uint32_t prev = src[0];
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        const uint32_t next = src[i + 1];
        sw[i] = static_cast<uint32_t>(((static_cast<uint64_t>(next) << 32) | prev) >> sh);
        prev = next;
      }
    }
    port_sync_group();
    const bool last_step = ks == k_steps - 1;
    if (item + 1 < items) {
      if (last_step) {
        set += groups;
        ks = 0;
      } else {
        ++ks;
      }
      load_region(set, ks);
    }
    if (row < n_rows && sb < supers) {
#pragma unroll
      for (int u = 0; u < Q::kUnits; ++u) {
        Q unit;
        unit.decode(sw, u);
        const int64_t ub = sb * Q::kUnits + u;  // the Q8_1 block
#pragma unroll
        for (int m = 0; m < MV_M; ++m) {
          const bytes16* xv = reinterpret_cast<const bytes16*>(q8 + m * k + ub * 32);
          uint32_t xw[8];
          words_of(xv[0], &xw[0]);
          words_of(xv[1], &xw[4]);
          int x[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) x[i] = static_cast<int>(xw[i]);
          acc[m] += unit.term(x, d8[m * units + ub], s8[m * units + ub]);
        }
      }
    }
    if (last_step) {  // the row set is done: reduce over the g lanes of each row
#pragma unroll
      for (int m = 0; m < MV_M; ++m) {
        float v = acc[m];
        for (int off = g / 2; off > 0; off >>= 1) v += port_shfl_xor(v, off);
        if (my_super == 0 && row < n_rows) y[m * n_rows + row] = v;
        acc[m] = 0.0f;
      }
    }
  }
}

#define FTLAB_QMT_INSTANTIATE(Q, M)                                                                          \
  template __global__ void quant_mv_tiled_kernel<Q, M>(const uint8_t*, int64_t, const int8_t*, const float*, \
                                                       const float*, float*, int64_t, int64_t, int);
#define FTLAB_QMT_ROWS(Q)                                                                \
  FTLAB_QMT_INSTANTIATE(Q, 1) FTLAB_QMT_INSTANTIATE(Q, 2) FTLAB_QMT_INSTANTIATE(Q, 3)    \
  FTLAB_QMT_INSTANTIATE(Q, 4) FTLAB_QMT_INSTANTIATE(Q, 5) FTLAB_QMT_INSTANTIATE(Q, 6)    \
  FTLAB_QMT_INSTANTIATE(Q, 7) FTLAB_QMT_INSTANTIATE(Q, 8)
FTLAB_QMT_ROWS(SQ8_0)
FTLAB_QMT_ROWS(SQK4<false>)
FTLAB_QMT_ROWS(SQK4<true>)
FTLAB_QMT_ROWS(SQ6_K)
#undef FTLAB_QMT_ROWS
#undef FTLAB_QMT_INSTANTIATE

}  // namespace qmt
}  // namespace ftlab

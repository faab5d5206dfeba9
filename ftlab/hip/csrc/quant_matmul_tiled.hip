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
// - load: each row's span (G supers, 2-byte aligned) is covered by P aligned 16-byte pieces
//   (w starts and ends 16-byte aligned, so they never reach outside it);
//   lane l takes pieces 32t + l of the region, so a load instruction covers 512 contiguous bytes
//   of a row (G >= 4) or whole spans of 2..8 rows;
// - transpose: the pieces go to the group's LDS, rows 4P + 1 words apart (odd: lane l's reads of
//   its super land on distinct banks for G = 1, where the lanes are the rows);
// - compute: lane l decodes super l (row l / G, super l % G) sub-block by sub-block from LDS
//   (32-bit reads, shifted where the super is only 2-byte aligned); each unit's weight words
//   serve all M activation rows, whose Q8_1 blocks are read from memory (L1: with G = 1 every
//   lane of the group reads the same block, a broadcast).
// The next region's pieces are loaded into registers before the current one is computed; the
// grid is persistent and every group walks the same number of regions (uniform trip counts).
// Partial sums of a row meet across its G lanes by port_shfl_xor. K may be cut into splits (for
// few rows): each (row set, split) pair is a work item, its sums go to y[split], added later.
//
// Includes q4_0_common.h and port.h only: the gfx compile check compiles this file alone.
#include "q4_0_common.h"

namespace ftlab {
namespace qmt {

constexpr int kGroup = 32;   // threads per region
constexpr int kGroups = 4;   // groups per 128-thread block

// N little-endian 32-bit words at byte o (even) of LDS words s: two-byte aligned spans are
// read as the aligned words around them and shifted.
template <int N>
__device__ __forceinline__ void read_words(const uint32_t* s, int o, uint32_t out[N]) {
  const uint32_t* p = s + (o >> 2);
  const int sh = 8 * (o & 2);
  uint32_t prev = p[0];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const uint32_t next = p[i + 1];
    out[i] = static_cast<uint32_t>(((static_cast<uint64_t>(next) << 32) | prev) >> sh);
    prev = next;
  }
}

__device__ __forceinline__ float half_lo(uint32_t w) { return port_half_to_float(static_cast<uint16_t>(w & 0xFFFFu)); }

__device__ __forceinline__ int dot8(const uint32_t q[8], const int x[8]) {
  int sumi = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) sumi = port_dp4a(static_cast<int>(q[i]), x[i], sumi);
  return sumi;
}

// v, which the AMD compiler then treats as a fresh value: what is derived from it (the
// activation rows' offsets m * k, the pieces' rows and columns) is recomputed where used instead
// of hoisted and held in registers across the loops, which spilled at M > 4.
__device__ __forceinline__ int64_t opaque(int64_t v) {
#if defined(__AMDGCN__)
  asm volatile("" : "+s"(v));
#endif
  return v;
}
__device__ __forceinline__ int opaque(int v) {
#if defined(__AMDGCN__)
  asm volatile("" : "+s"(v));
#endif
  return v;
}

// acc[m] += the term of one decoded unit with Q8_1 block ub of every activation row m.
template <int MV_M, typename U>
__device__ __forceinline__ void add_unit(const U& unit, const int8_t* q8, const float* d8, const float* s8, int64_t ub,
                                         int64_t k_in, int64_t units_in, float acc[MV_M]) {
  const int64_t k = opaque(k_in), units = opaque(units_in);
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

// Four Q8_0 blocks (34 bytes each: d fp16, q[32] int8): unit u is block u.
struct SQ8_0 {
  static constexpr int kBytes = 136, kUnits = 4, kPieces = 10;
  uint32_t q[8];
  float d;
  __device__ __forceinline__ float term(const int x[8], float d8, float) const {
    return d * (d8 * static_cast<float>(dot8(q, x)));
  }
  // acc[m] += the terms of the super at byte o of s, whose first Q8_1 block is ub.
  template <int MV_M>
  static __device__ __forceinline__ void add(const uint32_t* s, int o, const int8_t* q8, const float* d8,
                                             const float* s8, int64_t ub, int64_t k, int64_t units, float acc[MV_M]) {
#pragma unroll 1
    for (int u = 0; u < kUnits; ++u) {
      uint32_t w[9];
      read_words<9>(s, o + 34 * u, w);
      SQ8_0 unit;
      unit.d = half_lo(w[0]);
#pragma unroll
      for (int i = 0; i < 8; ++i) unit.q[i] = (w[i] >> 16) | (w[i + 1] << 16);
      add_unit<MV_M>(unit, q8, d8, s8, ub + u, k, units, acc);
    }
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
  __device__ __forceinline__ float term(const int x[8], float d8, float s8) const {
    return d * (d8 * (sc * static_cast<float>(dot8(q, x)))) - dmin * (mn * s8);
  }
  template <int MV_M>
  static __device__ __forceinline__ void add(const uint32_t* s, int o, const int8_t* q8, const float* d8,
                                             const float* s8, int64_t ub, int64_t k, int64_t units, float acc[MV_M]) {
    uint32_t hdr[4];  // d, dmin; the 12 scale bytes in words 1..3
    read_words<4>(s, o, hdr);
    uint32_t qh[8];
    if (kFifth) read_words<8>(s, o + 16, qh);
    SQK4 unit;
    unit.d = half_lo(hdr[0]);
    unit.dmin = half_lo(hdr[0] >> 16);
#pragma unroll 1
    for (int pair = 0; pair < kUnits / 2; ++pair) {  // sub-blocks 2 pair, + 1 share qs bytes 32 pair ..
      uint32_t qs[8];
      read_words<8>(s, o + kQs + 32 * pair, qs);
#pragma unroll 1
      for (int j = 2 * pair; j < 2 * pair + 2; ++j) {
        // llama.cpp's get_scale_min_k4: scale bytes j, j + 4 (j < 4); else j + 4, j - 4, j
        const int b = 8 * (j & 3);
        const uint32_t s0 = (hdr[1] >> b) & 0xFFu, s4 = (hdr[2] >> b) & 0xFFu, s8b = (hdr[3] >> b) & 0xFFu;
        const uint32_t sc = j < 4 ? s0 & 63 : (s8b & 0x0F) | ((s0 >> 6) << 4);
        const uint32_t mn = j < 4 ? s4 & 63 : (s8b >> 4) | ((s4 >> 6) << 4);
        unit.sc = static_cast<float>(sc);
        unit.mn = static_cast<float>(mn);
        const int sh = 4 * (j & 1);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          unit.q[i] = (qs[i] >> sh) & 0x0F0F0F0Fu;
          if (kFifth) unit.q[i] |= ((qh[i] >> j) & 0x01010101u) << 4;
        }
        add_unit<MV_M>(unit, q8, d8, s8, ub + j, k, units, acc);
      }
    }
  }
};

// Q6_K (210 bytes): unit u is quarter t = u % 4 of half h = u / 4: weight l (0..31) is nibble
// t / 2 of ql byte 64h + 32 (t % 2) + l with bits 2t, 2t + 1 of qh byte 128 + 32h + l; weights
// 0..15 take int8 scale 8h + 2t (at byte 192), 16..31 scale 8h + 2t + 1; d at byte 208.
struct SQ6_K {
  static constexpr int kBytes = 210, kUnits = 8, kPieces = 14;
  uint32_t q[8];  // q + 32, 0..63
  float d, sc_a, sc_b;
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
  template <int MV_M>
  static __device__ __forceinline__ void add(const uint32_t* s, int o, const int8_t* q8, const float* d8,
                                             const float* s8, int64_t ub, int64_t k, int64_t units, float acc[MV_M]) {
    uint32_t dw[1];  // d (low half)
    read_words<1>(s, o + 208, dw);
    SQ6_K unit;
    unit.d = half_lo(dw[0]);
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
      uint32_t qh[8];
      read_words<8>(s, o + 128 + 32 * h, qh);
#pragma unroll 1
      for (int t = 0; t < 4; ++t) {
        const int u = 4 * h + t;
        uint32_t ql[8];
        read_words<8>(s, o + 64 * h + 32 * (t & 1), ql);
        uint32_t sw[1];  // scale bytes 8h + 2t, 8h + 2t + 1 (= 2u, 2u + 1) in the low half
        read_words<1>(s, o + 192 + 2 * u, sw);
        unit.sc_a = static_cast<float>(static_cast<int8_t>(sw[0] & 0xFFu));
        unit.sc_b = static_cast<float>(static_cast<int8_t>((sw[0] >> 8) & 0xFFu));
        const int shl = 4 * (t >> 1), shh = 2 * t;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          unit.q[i] = ((ql[i] >> shl) & 0x0F0F0F0Fu) | (((qh[i] >> shh) & 0x03030303u) << 4);
        }
        add_unit<MV_M>(unit, q8, d8, s8, ub + u, k, units, acc);
      }
    }
  }
};

// nvcc: at least 3 blocks per SM (up to 168 registers) for M <= 4, 2 above; left to itself it
// settles on 96 or 128 registers and spills a few bytes
#if defined(PORT_CUDA)
#define FTLAB_QMT_BOUNDS __launch_bounds__(kGroup * kGroups, MV_M <= 4 ? 3 : 2)
#else
#define FTLAB_QMT_BOUNDS __launch_bounds__(kGroup * kGroups)
#endif

// y[split, m, n] (fp32) = sum over the row's units in K split `split` of the unit terms, for
// M = MV_M rows of Q8_1 activations q8 [M, K] (int8, rows contiguous, 16-byte aligned), d8 / s8
// [M, K/32]; the caller sums the splits (in order) when splits > 1. g: supers per row in a region
// (1, 2, 4, 8, 16 or 32), with (32 / g) * pieces_per_row <= 32 * kPieces; each split takes
// ceil(ceil(supers / g) / splits) consecutive regions of a row set.
template <typename Q, int MV_M>
__global__ void FTLAB_QMT_BOUNDS
    quant_mv_tiled_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, const int8_t* __restrict__ q8,
                          const float* __restrict__ d8, const float* __restrict__ s8, float* __restrict__ y,
                          int64_t n_rows, int64_t k, int g, int splits) {
  constexpr int kStride = 4 * Q::kPieces + 1;  // LDS words per row at G = 1
  __shared__ uint32_t lds[kGroups][kGroup * kStride + 4];  // + 4: reads run up to 3 words past a super
  const int lane = threadIdx.x;
  const int group = threadIdx.y;
  uint32_t* region = lds[group];
  const int units = static_cast<int>(k / 32);
  const int supers = units / Q::kUnits;  // per row
  const int rows = kGroup / g;                // rows per region
  const int pieces = (14 + g * Q::kBytes + 15) / 16;  // per row span, whatever its alignment
  const int stride = 4 * pieces + 1;                  // LDS words per row
  // 32-bit bookkeeping (the launcher keeps N and K below 2^31): fewer scalar registers
  const int k_steps = (supers + g - 1) / g;
  const int split_steps = (k_steps + splits - 1) / splits;  // k-steps of one split
  const int row_sets = static_cast<int>((n_rows + rows - 1) / rows);
  const int works = row_sets * splits;  // (row set, split) pairs
  const int groups = static_cast<int>(gridDim.x) * kGroups;
  const int items = (works + groups - 1) / groups * split_steps;  // the same in every group

  // region (set, ks): rows set * rows + r, supers ks * g ..; row r's span starts at byte
  // first(r) and its pieces at the 16-byte aligned address below it
  auto first_of = [&](int set, int ks, int r) {
    return w + static_cast<int64_t>(set * rows + r) * row_bytes + ks * g * Q::kBytes;
  };
  auto lo_of = [](const uint8_t* first) {
    return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(first) & ~static_cast<uintptr_t>(15));
  };
  bytes16 r[Q::kPieces];
  auto load_region = [&](int set, int ks) {
    const int pcs = opaque(pieces);  // AMD: the pieces' rows and columns recomputed, not held
    const int s_end = (ks + 1) * g < supers ? (ks + 1) * g : supers;
#pragma unroll
    for (int t = 0; t < Q::kPieces; ++t) {
      const int p = t * kGroup + lane;
      const int rr = p / pcs, j = p - rr * pcs;
      r[t] = bytes16{};
      if (rr < rows && set * rows + rr < n_rows) {
        const uint8_t* first = first_of(set, ks, rr);
        const uint8_t* end = first + (s_end - ks * g) * Q::kBytes;
        const uint8_t* piece = lo_of(first) + 16 * j;
        if (piece < end) r[t] = *reinterpret_cast<const bytes16*>(piece);
      }
    }
  };
  // the current item: work wi (row set wi / splits, split wi % splits), its k-step kk
  int wi = static_cast<int>(blockIdx.x) * kGroups + group, kk = 0;
  // (opaque: the divisions by splits are redone per item rather than held in scalar registers)
  auto set_of = [&](int work) { return work / opaque(splits); };
  auto ks_of = [&](int work, int step) { return work % opaque(splits) * split_steps + step; };
  if (items > 0) load_region(set_of(wi), ks_of(wi, kk));

  float acc[MV_M];
#pragma unroll
  for (int m = 0; m < MV_M; ++m) acc[m] = 0.0f;
  const int my_row = lane / g, my_super = lane % g;
  for (int item = 0; item < items; ++item) {
    const int set = set_of(wi), ks = ks_of(wi, kk), split = ks / split_steps;
    const int row = set * rows + my_row;
    const int sb = ks * g + my_super;
    const int pcs = opaque(pieces);
#pragma unroll
    for (int t = 0; t < Q::kPieces; ++t) {
      const int p = t * kGroup + lane;
      const int rr = p / pcs, j = p - rr * pcs;
      if (rr < rows) {
        uint32_t v[4];
        words_of(r[t], v);
        uint32_t* dst = region + rr * stride + 4 * j;
        // word c of the piece goes out in store (c - lane / 8) % 4: the four stores of 32
        // consecutive pieces hit 32 distinct banks
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int word = (c + (lane >> 3)) & 3;
          dst[word] = word == 0 ? v[0] : word == 1 ? v[1] : word == 2 ? v[2] : v[3];
        }
      }
    }
    port_sync_group();
    const uint8_t* first = first_of(set, ks, my_row);
    const int off = static_cast<int>(first - lo_of(first)) + my_super * Q::kBytes;  // even
    const bool last_step = kk == split_steps - 1;
    if (item + 1 < items) {
      if (last_step) {
        wi += groups;
        kk = 0;
      } else {
        ++kk;
      }
      load_region(set_of(wi), ks_of(wi, kk));
    }
    if (row < n_rows && sb < supers) {
      Q::template add<MV_M>(region + my_row * stride, off, q8, d8, s8, sb * Q::kUnits, k, units, acc);
    }
    port_sync_group();  // the reads of this region are done before the next is stored
    if (last_step) {  // the split of the row set is done: reduce over the g lanes of each row
#pragma unroll
      for (int m = 0; m < MV_M; ++m) {
        float v = acc[m];
        for (int mask = g / 2; mask > 0; mask >>= 1) v += port_shfl_xor(v, mask);
        if (my_super == 0 && row < n_rows) y[(static_cast<int64_t>(split) * MV_M + m) * n_rows + row] = v;
        acc[m] = 0.0f;
      }
    }
  }
}

#define FTLAB_QMT_INSTANTIATE(Q, M)                                                                          \
  template __global__ void quant_mv_tiled_kernel<Q, M>(const uint8_t*, int64_t, const int8_t*, const float*, \
                                                       const float*, float*, int64_t, int64_t, int, int);
#define FTLAB_QMT_ROWS(Q)                                                                \
  FTLAB_QMT_INSTANTIATE(Q, 1) FTLAB_QMT_INSTANTIATE(Q, 2) FTLAB_QMT_INSTANTIATE(Q, 3)    \
  FTLAB_QMT_INSTANTIATE(Q, 4) FTLAB_QMT_INSTANTIATE(Q, 5) FTLAB_QMT_INSTANTIATE(Q, 6)    \
  FTLAB_QMT_INSTANTIATE(Q, 7) FTLAB_QMT_INSTANTIATE(Q, 8)
FTLAB_QMT_ROWS(SQ8_0)
FTLAB_QMT_ROWS(SQK4<false>)
FTLAB_QMT_ROWS(SQK4<true>)
FTLAB_QMT_ROWS(SQ6_K)
#undef FTLAB_QMT_ROWS
#undef FTLAB_QMT_BOUNDS
#undef FTLAB_QMT_INSTANTIATE

}  // namespace qmt
}  // namespace ftlab

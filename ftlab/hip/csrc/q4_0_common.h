// q4_0_common.h — device helpers shared by the GGUF Q4_0 kernels (q4_0.hip) and the routed
// MoE kernels (moe.hip): element loaders of the float dtypes, the Q4_0 block layout, the
// Q8_1 quantizer (the reference's arithmetic, bit for bit) and the int8 block dot.
//
// Block layout (18 bytes for 32 weights): fp16 d, then qs[16]; byte j holds element j in
// its low nibble and element j+16 in its high nibble; x = d * (q - 8).
#pragma once
#include "port.h"

namespace ftlab {

// Element loaders for the activation / weight dtypes (bits in, fp32 out).
struct f32_t {
  typedef float storage;
  static constexpr bool kIsBf16 = false;
  static __device__ __forceinline__ float load(const storage* p) { return *p; }
  static __device__ __forceinline__ storage from_float(float f) { return f; }
};
struct f16_t {
  typedef uint16_t storage;
  static constexpr bool kIsBf16 = false;
  static __device__ __forceinline__ float load(const storage* p) { return port_half_to_float(*p); }
  static __device__ __forceinline__ storage from_float(float f) { return port_float_to_half(f); }
};
struct bf16_t {
  typedef uint16_t storage;
  static constexpr bool kIsBf16 = true;
  static __device__ __forceinline__ float load(const storage* p) { return port_bf16_to_float(*p); }
  static __device__ __forceinline__ storage from_float(float f) { return port_float_to_bf16(f); }
};

constexpr int kQK = 32;
constexpr int kBlockBytes = 18;

// C's roundf: v - trunc(v) is exact, so there is no double rounding.
__device__ __forceinline__ float round_half_away(float v) {
  const float t = __builtin_truncf(v);
  return __builtin_fabsf(v - t) >= 0.5f ? t + __builtin_copysignf(1.0f, v) : t;
}

// Four Q8_1 values, q = round(v / d) (half away from zero; 0 for an all-zero block), packed
// into a word (v[c] in byte c); their sum is added to *sum.
__device__ __forceinline__ uint32_t q8_1_word(const float v[4], float amax, float d, int* sum) {
  uint32_t word = 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int qi = amax == 0.0f ? 0 : static_cast<int>(round_half_away(port_div_rn(v[c], d)));
    word |= static_cast<uint32_t>(qi & 0xff) << (8 * c);
    *sum += qi;
  }
  return word;
}

// Q8_1 of one 32-element block held by four lanes (lanes 4j..4j+3 of a warp, quarter = lane % 4,
// 8 elements each; every lane of the warp calls it, inactive ones with zeros): amax and the sum
// of q by shuffles, q8_1_block's arithmetic otherwise (bit for bit), a quarter of its divisions
// a thread. qw: this quarter's 8 values (element i in byte i % 4 of word i / 4); *d_out: the
// block's d; *sum_out: the block's sum of q.
__device__ __forceinline__ void q8_1_quarter(const float v[8], uint32_t qw[2], float* d_out, int* sum_out) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = __builtin_fmaxf(amax, __builtin_fabsf(v[i]));
  amax = __builtin_fmaxf(amax, port_shfl_xor(amax, 1));
  amax = __builtin_fmaxf(amax, port_shfl_xor(amax, 2));
  const float d = port_div_rn(amax, 127.0f);
  int sum = 0;
  qw[0] = q8_1_word(&v[0], amax, d, &sum);
  qw[1] = q8_1_word(&v[4], amax, d, &sum);
  sum += port_shfl_xor(sum, 1);
  sum += port_shfl_xor(sum, 2);
  *d_out = d;
  *sum_out = sum;
}

// Q8_1 of one 32-element block: d = amax / 127, q = round(x / d) (half away from zero),
// packed four to a word (element 4i + c in byte c of word i), and s = d * sum(q).
template <typename T>
__device__ __forceinline__ void q8_1_block(const typename T::storage* xb, uint32_t qw[8], float* d_out,
                                           float* s_out) {
  float v[kQK];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kQK; ++i) {
    v[i] = T::load(xb + i);
    amax = __builtin_fmaxf(amax, __builtin_fabsf(v[i]));
  }
  const float d = port_div_rn(amax, 127.0f);
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) qw[i] = q8_1_word(&v[4 * i], amax, d, &sum);
  *d_out = d;
  *s_out = d * static_cast<float>(sum);
}

// sum over one block of nibbles (4 qs words) times int8 activations (8 words).
__device__ __forceinline__ int block_dot(const uint32_t qs[4], const int q8[8]) {
  int sumi = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sumi = port_dp4a(static_cast<int>(qs[i] & 0x0F0F0F0Fu), q8[i], sumi);
    sumi = port_dp4a(static_cast<int>((qs[i] >> 4) & 0x0F0F0F0Fu), q8[i + 4], sumi);
  }
  return sumi;
}

// The four words of a 16-byte vector (uint4 on CUDA, an ext_vector on HIP).
__device__ __forceinline__ void words_of(const bytes16& v, uint32_t out[4]) {
#if defined(PORT_CUDA)
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
#else
  out[0] = v[0];
  out[1] = v[1];
  out[2] = v[2];
  out[3] = v[3];
#endif
}

// Four fp32 at p (16-byte aligned) in one 16-byte load / store.
__device__ __forceinline__ void load4f(const float* p, float out[4]) {
#if defined(PORT_CUDA)
  const float4 v = *reinterpret_cast<const float4*>(p);
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
#else
  typedef float f4 __attribute__((ext_vector_type(4)));
  const f4 v = *reinterpret_cast<const f4*>(p);
  out[0] = v[0];
  out[1] = v[1];
  out[2] = v[2];
  out[3] = v[3];
#endif
}
__device__ __forceinline__ void store4f(float* p, const float in[4]) {
#if defined(PORT_CUDA)
  *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
#else
  typedef float f4 __attribute__((ext_vector_type(4)));
  f4 v;
  v[0] = in[0];
  v[1] = in[1];
  v[2] = in[2];
  v[3] = in[3];
  *reinterpret_cast<f4*>(p) = v;
#endif
}

// Eight consecutive elements at p as fp32: 16-byte loads when `vec` (p 16-byte aligned).
template <typename T>
__device__ __forceinline__ void load8(const typename T::storage* p, bool vec, float v[8]) {
  if (vec) {
    constexpr int kPer = 16 / static_cast<int>(sizeof(typename T::storage));  // elements a load
    typename T::storage e[8];
#pragma unroll
    for (int c = 0; c < 8 / kPer; ++c) {
      const bytes16 raw = reinterpret_cast<const bytes16*>(p)[c];
      __builtin_memcpy(&e[c * kPer], &raw, 16);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = T::load(&e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = T::load(p + i);
  }
}

// ------------------------------------------------------------------ superblocks and records
// A superblock is 8 consecutive Q4_0 blocks, 144 bytes = 9 pieces of 16 bytes: rows whose
// block count is a multiple of 8 (16-byte aligned) keep every superblock 16-byte aligned. A
// superblock's 36 words hold four block pairs; pair p is words 9p..9p+8 (block A's scale in the
// low half of word 9p, its qs straddling words 9p..9p+4; block B's scale in the high half of
// word 9p + 4, its qs in words 9p + 5..9p + 8).
//
// An activation record is the Q8_1 of one row's superblock in LDS: 64 words of q8 (block j at
// words 8j..8j+7), 8 of d8, 8 of s8 and 4 of padding, so that 8 lanes reading 8 consecutive
// records with 16-byte loads land on distinct banks (84 = 20 mod 32).
constexpr int kSuperBlocks = 8;   // Q4_0 blocks per superblock
constexpr int kSuperPieces = 9;   // 16-byte pieces per superblock
constexpr int kSuperBytes = kSuperBlocks * kBlockBytes;  // 144 = kSuperPieces x 16
constexpr int kRecordWords = 84;  // activation words per (row, superblock)

// Block pair p of a superblock's words pw[36]: the two blocks' qs and scales.
struct Q4Pair {
  uint32_t qa[4], qb[4];
  float da, db;
};

__device__ __forceinline__ Q4Pair pair_of(const uint32_t* pw, int p) {
  Q4Pair r;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    r.qa[i] = (pw[9 * p + i] >> 16) | (pw[9 * p + i + 1] << 16);
    r.qb[i] = pw[9 * p + 5 + i];
  }
  r.da = port_half_to_float(static_cast<uint16_t>(pw[9 * p] & 0xffff));
  r.db = port_half_to_float(static_cast<uint16_t>(pw[9 * p + 4] >> 16));
  return r;
}

// acc += block A's term, then block B's: d4 * (d8 * sumi - 8 * s8), with the pair's Q8_1 q
// words at qv[0..3] (A's 8 words, then B's) and its d8 / s8 given.
__device__ __forceinline__ void pair_accumulate(float& acc, const Q4Pair& w, const bytes16* qv, float d8a, float d8b,
                                                float s8a, float s8b) {
  uint32_t ua[8], ub[8];
  words_of(qv[0], &ua[0]);
  words_of(qv[1], &ua[4]);
  words_of(qv[2], &ub[0]);
  words_of(qv[3], &ub[4]);
  int va[8], vb[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    va[i] = static_cast<int>(ua[i]);
    vb[i] = static_cast<int>(ub[i]);
  }
  acc += w.da * (d8a * static_cast<float>(block_dot(w.qa, va)) - 8.0f * s8a);
  acc += w.db * (d8b * static_cast<float>(block_dot(w.qb, vb)) - 8.0f * s8b);
}

// Pair p's terms against activation record rec.
__device__ __forceinline__ void pair_accumulate_record(float& acc, const Q4Pair& w, const uint32_t* rec, int p) {
  pair_accumulate(acc, w, reinterpret_cast<const bytes16*>(rec + 16 * p), port_bits_to_float(rec[64 + 2 * p]),
                  port_bits_to_float(rec[65 + 2 * p]), port_bits_to_float(rec[72 + 2 * p]),
                  port_bits_to_float(rec[73 + 2 * p]));
}

// Q8_1 of quarter `quarter` of block j of a superblock (8 elements v; every lane of the warp
// calls it: q8_1_quarter's shuffles) into the superblock's activation record rec (null: computed,
// not stored).
__device__ __forceinline__ void quarter_to_record(const float v[8], uint32_t* rec, int j, int quarter) {
  uint32_t qw[2];
  float d;
  int sum;
  q8_1_quarter(v, qw, &d, &sum);
  if (rec != nullptr) {
    rec[8 * j + 2 * quarter] = qw[0];
    rec[8 * j + 2 * quarter + 1] = qw[1];
    if (quarter == 0) {
      rec[64 + j] = port_float_to_bits(d);
      rec[72 + j] = port_float_to_bits(d * static_cast<float>(sum));
    }
  }
}

// The Q8_1 of MV_M rows of x (row m at x + m * x_stride, nb blocks each) into activation
// records (record m * (nb / 8) + superblock), by the NT threads of a block (tid): four threads a
// block, 8 elements each (one 16-byte load where aligned), q8_1_quarter -- the arithmetic of
// quantize_q8_1_kernel, bit for bit. Every thread runs the same trip count, so the quarter
// shuffles always see whole groups. The caller synchronises before reading the records.
template <typename T, int MV_M, int NT>
__device__ __forceinline__ void quantize_records(const typename T::storage* x, int64_t x_stride, int nb, int tid,
                                                 uint32_t* xrec) {
  const int supers = nb / kSuperBlocks;
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && (x_stride * sizeof(*x)) % 16 == 0;
  const int works = 4 * MV_M * nb;
  for (int t0 = 0; t0 < works; t0 += NT) {
    const int t = t0 + tid;
    const bool active = t < works;
    const int mb = active ? t >> 2 : 0;
    const int quarter = t & 3;
    const int m = MV_M == 1 ? 0 : mb / nb, b = mb - m * nb;
    float v[8];
    load8<T>(x + m * x_stride + b * kQK + 8 * quarter, vec, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = active ? v[i] : 0.0f;
    quarter_to_record(v, active ? xrec + (m * supers + b / kSuperBlocks) * kRecordWords : nullptr, b % kSuperBlocks,
                      quarter);
  }
}

}  // namespace ftlab

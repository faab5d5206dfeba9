// moe_cpu.cc — routed SwiGLU experts on the CPU, for the hybrid executor's CPU-routed slots.
//
// y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = ids[t, j] in [0, E);
// other ids (-1: a slot routed to the GPU) contribute nothing and read nothing.
// Contract: docs/OPS.md sections 3 and 4; reference: ftlab/reference/moe.py (moe_experts).
//
// Banks: quantized (uint8 [E, N, row bytes]; Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, gate_up and down of
// any two of them) on the int8 path -- x and h quantized to Q8_1 with the reference's arithmetic
// (d = amax / 127, q = round-half-away(v / d), s = d * sum q), the Q4_0 block dot
// d4 * (d8 * sumi - 8 * s8) with an exact integer sumi, the others' in moe_cpu_kquants.h -- or
// dense fp32 / bf16 / fp16 banks in fp32 arithmetic. x and y are fp32 (the Python side casts). OpenMP threads take
// (pair, 16-row chunk) items for gate/up and (token, 8-row chunk) items for down. The Q4_0 block
// dot is AVX2 (maddubs + madd, exact integer lane sums) where the build targets it (-march=native
// on an AVX2 host); with FMA and F16C as well, the lane sums are scaled and accumulated in 8 fp32
// lanes a row (one horizontal sum a row, not a block) and gate and up share the activation loads;
// with AVX-512 VNNI, two blocks a step by vpdpbusd in 16 lanes; scalar code elsewhere
// (FTLAB_CPU_ISA=avx2 builds x86-64-v3 -- the AVX2 paths, for tests on an AVX-512 host; it runs
// only on a host with x86-64-v3 -- and FTLAB_CPU_ISA=portable the scalar ones). The down
// pass reads each slot's expert's rows of a work item as one stretch. The dense loops are left to
// the vectorizer.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "cpu_job.h"
#include "moe_cpu_kquants.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ftlab {
namespace cpu {

using tvm::ffi::TensorView;

constexpr int kQK = 32;
constexpr int kBlockBytes = 18;
constexpr int kRowChunk = 16;  // gate/up rows a work item
constexpr int kDownChunk = 8;  // output rows a down work item (256 items at H = 2048: threads stay busy)

inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// Q8_1 of a row of nb blocks: q int8 [nb * 32], d and s fp32 [nb].
void q8_1_row(const float* x, int nb, int8_t* q, float* d, float* s) {
  for (int b = 0; b < nb; ++b) {
    const float* v = x + b * kQK;
    float amax = 0.0f;
    for (int i = 0; i < kQK; ++i) amax = std::fmax(amax, std::fabs(v[i]));
    const float dd = amax / 127.0f;
    int sum = 0;
    for (int i = 0; i < kQK; ++i) {
      const int qi = amax == 0.0f ? 0 : static_cast<int>(std::round(v[i] / dd));
      q[b * kQK + i] = static_cast<int8_t>(qi);
      sum += qi;
    }
    d[b] = dd;
    s[b] = dd * static_cast<float>(sum);
  }
}

#if defined(__AVX2__)
// Low nibbles in the low 128 bits (elements 0..15), high nibbles in the high 128 (16..31).
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
}

// The 8 lane sums of one block's exact integer dot: maddubs (unsigned nibble x signed int8,
// pairs summed in int16: |sum| <= 2 * 15 * 128, exact), then pairs of those in int32.
inline __m256i block_lanes(const __m256i nib, const __m256i q8) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(nib, q8), _mm256_set1_epi16(1));
}
#endif

// sumi of one block: the exact integer dot of its 32 nibbles (0..15) with 32 int8 activations.
// Byte j of qs holds element j (low nibble) and element j + 16 (high nibble).
inline int block_sumi(const uint8_t* qs, const int8_t* qb) {
#if defined(__AVX2__)
  const __m256i s32 = block_lanes(nibbles(qs), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb)));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
#else
  int sumi = 0;
  for (int j = 0; j < 16; ++j) sumi += static_cast<int>(qs[j] & 15) * qb[j] + static_cast<int>(qs[j] >> 4) * qb[j + 16];
  return sumi;
#endif
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define FTLAB_CPU_VECTOR_DOT 1
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float block_scale(const uint8_t* blk) {
  uint16_t bits;
  std::memcpy(&bits, blk, 2);
  return _cvtsh_ss(bits);
}
#endif

#if defined(FTLAB_CPU_VECTOR_DOT) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define FTLAB_CPU_VNNI_DOT 1
// AVX-512 VNNI: two blocks a step, 64 nibble x int8 products summed four at a time into 16
// int32 lanes by one vpdpbusd (exact: no saturation, |lane| <= 4 * 15 * 128). The 128-bit lanes
// hold [block b low nibbles, block b + 1 low, block b high, block b + 1 high].
inline __m512i nibbles2(const uint8_t* blk) {  // blocks b (at blk) and b + 1
  const __m256i raw = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kBlockBytes + 2)),
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
  return _mm512_and_si512(both, _mm512_set1_epi8(15));
}

// Blocks b and b + 1 of the Q8_1 activations (64 contiguous int8: b's 0..15, 16..31, then b + 1's)
// in nibbles2's lane order.
inline __m512i q8_pair(const int8_t* q) {
  const __m512i v = _mm512_loadu_si512(q);
  return _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0));
}

// The scale of each int32 lane: block b's in 128-bit lanes 0 and 2, block b + 1's in 1 and 3.
inline __m512 pair_scale(float s0, float s1) {
  return _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(s0), _mm512_set1_ps(s1));
}
#endif

// The int8 dot of one Q4_0 row with a Q8_1 row: sum_b d4 * (d8 * sumi - 8 * s8), as
// sum_b (d4 * d8) * sumi - 8 * sum_b d4 * s8. With AVX2 + FMA + F16C the block sums stay in 8
// int32 lanes (exact), scaled and accumulated in 8 fp32 lanes, added up once a row.
inline float q4_row_dot(const uint8_t* row, int nb, const int8_t* q, const float* d, const float* s) {
#if defined(FTLAB_CPU_VECTOR_DOT)
  __m256 acc = _mm256_setzero_ps();
  float corr = 0.0f;
  int b = 0;
#if defined(FTLAB_CPU_VNNI_DOT)
  __m512 acc2 = _mm512_setzero_ps();
  float corr_odd = 0.0f;  // the odd blocks' corrections: two dependency chains, not one
  for (; b + 1 < nb; b += 2) {
    const uint8_t* blk = row + b * kBlockBytes;
    const float d0 = block_scale(blk), d1 = block_scale(blk + kBlockBytes);
    const __m512i lanes = _mm512_dpbusd_epi32(_mm512_setzero_si512(), nibbles2(blk), q8_pair(q + b * kQK));
    acc2 = _mm512_fmadd_ps(pair_scale(d0 * d[b], d1 * d[b + 1]), _mm512_cvtepi32_ps(lanes), acc2);
    corr += d0 * s[b];
    corr_odd += d1 * s[b + 1];
  }
  corr += corr_odd;
  acc = _mm256_add_ps(_mm512_castps512_ps256(acc2), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc2), 1)));
#endif
  for (; b < nb; ++b) {
    const uint8_t* blk = row + b * kBlockBytes;
    const float d4 = block_scale(blk);
    const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b * kQK));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d4 * d[b]), _mm256_cvtepi32_ps(block_lanes(nibbles(blk + 2), q8)), acc);
    corr += d4 * s[b];
  }
  return hsum(acc) - 8.0f * corr;
#else
  float acc = 0.0f;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * kBlockBytes;
    uint16_t dbits;
    std::memcpy(&dbits, blk, 2);
    const int sumi = block_sumi(blk + 2, q + b * kQK);
    acc += half_to_float(dbits) * (d[b] * static_cast<float>(sumi) - 8.0f * s[b]);
  }
  return acc;
#endif
}

// Two rows against one Q8_1 row (gate and up): the activations loaded once a block.
inline void q4_rows_dot2(const uint8_t* r0, const uint8_t* r1, int nb, const int8_t* q, const float* d, const float* s,
                         float* out0, float* out1) {
#if defined(FTLAB_CPU_VECTOR_DOT)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float corr0 = 0.0f, corr1 = 0.0f;
  int b = 0;
#if defined(FTLAB_CPU_VNNI_DOT)
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  float odd0 = 0.0f, odd1 = 0.0f;  // the odd blocks' corrections: four dependency chains, not two
  for (; b + 1 < nb; b += 2) {
    const uint8_t* k0 = r0 + b * kBlockBytes;
    const uint8_t* k1 = r1 + b * kBlockBytes;
    const float d00 = block_scale(k0), d01 = block_scale(k0 + kBlockBytes);
    const float d10 = block_scale(k1), d11 = block_scale(k1 + kBlockBytes);
    const __m512i q8 = q8_pair(q + b * kQK);
    const __m512i l0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), nibbles2(k0), q8);
    const __m512i l1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), nibbles2(k1), q8);
    a0 = _mm512_fmadd_ps(pair_scale(d00 * d[b], d01 * d[b + 1]), _mm512_cvtepi32_ps(l0), a0);
    a1 = _mm512_fmadd_ps(pair_scale(d10 * d[b], d11 * d[b + 1]), _mm512_cvtepi32_ps(l1), a1);
    corr0 += d00 * s[b];
    odd0 += d01 * s[b + 1];
    corr1 += d10 * s[b];
    odd1 += d11 * s[b + 1];
  }
  corr0 += odd0;
  corr1 += odd1;
  acc0 = _mm256_add_ps(_mm512_castps512_ps256(a0), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a0), 1)));
  acc1 = _mm256_add_ps(_mm512_castps512_ps256(a1), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a1), 1)));
#endif
  for (; b < nb; ++b) {
    const uint8_t* b0 = r0 + b * kBlockBytes;
    const uint8_t* b1 = r1 + b * kBlockBytes;
    const float d0 = block_scale(b0), d1 = block_scale(b1);
    const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b * kQK));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * d[b]), _mm256_cvtepi32_ps(block_lanes(nibbles(b0 + 2), q8)), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1 * d[b]), _mm256_cvtepi32_ps(block_lanes(nibbles(b1 + 2), q8)), acc1);
    corr0 += d0 * s[b];
    corr1 += d1 * s[b];
  }
  *out0 = hsum(acc0) - 8.0f * corr0;
  *out1 = hsum(acc1) - 8.0f * corr1;
#else
  *out0 = q4_row_dot(r0, nb, q, d, s);
  *out1 = q4_row_dot(r1, nb, q, d, s);
#endif
}

// q4 stands for every quantized kind (the run's gate_up and down kinds pick the row dots).
enum class Kind { q4 = FTLAB_BANK_Q4_0, f32 = FTLAB_BANK_F32, bf16 = FTLAB_BANK_BF16, f16 = FTLAB_BANK_F16 };

template <Kind K>
inline float dense_row_dot(const void* row, int k, const float* x) {
  float acc = 0.0f;
  if constexpr (K == Kind::f32) {
    const float* r = static_cast<const float*>(row);
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < k; ++i) acc += r[i] * x[i];
  } else if constexpr (K == Kind::bf16) {
    const uint16_t* r = static_cast<const uint16_t*>(row);
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < k; ++i) acc += bf16_to_float(r[i]) * x[i];
  } else {
    const uint16_t* r = static_cast<const uint16_t*>(row);
    for (int i = 0; i < k; ++i) acc += half_to_float(r[i]) * x[i];
  }
  return acc;
}

// The FtlabCpuBankKind of a bank: its dtype's, or `quant` (a quantized kind) for uint8 banks.
int kind_of(const TensorView& w, const char* name, int64_t quant) {
  const DLDataType dt = w.dtype();
  if (dt.code == kDLUInt && dt.bits == 8 && (quant == FTLAB_BANK_Q4_0 || kq::is_kquant(static_cast<int>(quant))))
    return static_cast<int>(quant);
  if (dt.code == kDLFloat && dt.bits == 32) return FTLAB_BANK_F32;
  if (dt.code == kDLBfloat && dt.bits == 16) return FTLAB_BANK_BF16;
  if (dt.code == kDLFloat && dt.bits == 16) return FTLAB_BANK_F16;
  TVM_FFI_THROW(TypeError) << name << " must be a quantized (uint8, with its kind) or float32 / bfloat16 / float16 bank";
  return FTLAB_BANK_F32;
}

bool quantized(int kind) { return kind == FTLAB_BANK_Q4_0 || kq::is_kquant(kind); }

// The job's kinds are valid: both dense and equal, or both quantized.
bool kinds_ok(int32_t kind) {
  const int g = kind & 0xff, d = kind >> 8;
  if (kind < 0 || d > 0xff) return false;
  return quantized(g) ? quantized(d) : (g >= FTLAB_BANK_F32 && g <= FTLAB_BANK_F16 && d == g);
}

const char* base(const TensorView& t) { return static_cast<const char*>(t.data_ptr()) + t.byte_offset(); }

template <Kind K>
void run(const FtlabCpuMoeJob& job) {
  const int gk = job.kind & 0xff, dk = job.kind >> 8;
  const int64_t t = job.tokens, hidden = job.hidden, top_k = job.top_k, experts = job.experts, inter = job.inter;
  const int64_t pairs = t * top_k;
  const float* xp = job.x;
  const int32_t* ip = job.ids;
  const float* wp = job.w;
  float* yp = job.y;
  const char* gup = static_cast<const char*>(job.gate_up);
  const char* dnp = static_cast<const char*>(job.down);
  const int64_t elem = K == Kind::q4 ? 1 : (K == Kind::f32 ? 4 : 2);
  const int64_t gu_row = (K == Kind::q4 ? kq::row_bytes(gk, hidden) : hidden) * elem;
  const int64_t dn_row = (K == Kind::q4 ? kq::row_bytes(dk, inter) : inter) * elem;
  const int64_t gu_e = 2 * inter * gu_row, dn_e = hidden * dn_row;
  const int nbh = static_cast<int>(hidden / kQK), nbi = static_cast<int>(inter / kQK);

  std::vector<int8_t> xq, hq;
  std::vector<float> xd, xs, hd, hs;
  if constexpr (K == Kind::q4) {
    xq.resize(t * hidden);
    xd.resize(t * nbh);
    xs.resize(t * nbh);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < t; ++r) q8_1_row(xp + r * hidden, nbh, &xq[r * hidden], &xd[r * nbh], &xs[r * nbh]);
  }
  std::vector<float> h(pairs * inter, 0.0f);
  const int64_t chunks = (inter + kRowChunk - 1) / kRowChunk;
#pragma omp parallel for schedule(dynamic, 2)
  for (int64_t item = 0; item < pairs * chunks; ++item) {
    const int64_t p = item / chunks, n0 = (item % chunks) * kRowChunk;
    const int e = ip[p];
    if (e < 0 || e >= experts) continue;  // reads nothing
    const int64_t tok = p / top_k;
    const char* we = gup + e * gu_e;
    for (int64_t n = n0; n < n0 + kRowChunk && n < inter; ++n) {
      float g, u;
      if constexpr (K == Kind::q4) {
        const int8_t* q = &xq[tok * hidden];
        const auto* rg = reinterpret_cast<const uint8_t*>(we + n * gu_row);
        const auto* ru = reinterpret_cast<const uint8_t*>(we + (inter + n) * gu_row);
        if (gk == FTLAB_BANK_Q4_0) {
          q4_rows_dot2(rg, ru, nbh, q, &xd[tok * nbh], &xs[tok * nbh], &g, &u);
        } else {
          g = kq::row_dot(gk, rg, nbh, q, &xd[tok * nbh], &xs[tok * nbh]);
          u = kq::row_dot(gk, ru, nbh, q, &xd[tok * nbh], &xs[tok * nbh]);
        }
      } else {
        g = dense_row_dot<K>(we + n * gu_row, static_cast<int>(hidden), xp + tok * hidden);
        u = dense_row_dot<K>(we + (inter + n) * gu_row, static_cast<int>(hidden), xp + tok * hidden);
      }
      h[p * inter + n] = g / (1.0f + std::exp(-g)) * u;
    }
  }
  if constexpr (K == Kind::q4) {
    hq.resize(pairs * inter);
    hd.resize(pairs * nbi);
    hs.resize(pairs * nbi);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pairs; ++p) q8_1_row(&h[p * inter], nbi, &hq[p * inter], &hd[p * nbi], &hs[p * nbi]);
  }
  const int64_t ychunks = (hidden + kDownChunk - 1) / kDownChunk;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t item = 0; item < t * ychunks; ++item) {
    const int64_t tok = item / ychunks, n0 = (item % ychunks) * kDownChunk;
    const int64_t rows = std::min<int64_t>(kDownChunk, hidden - n0);
    float acc[kDownChunk] = {};
    // slot by slot (the order the reference sums them in, for every row), each slot's expert's
    // rows n0.. read as one contiguous stretch of its bank
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t p = tok * top_k + j;
      const int e = ip[p];
      if (e < 0 || e >= experts) continue;
      for (int64_t i = 0; i < rows; ++i) {
        const char* row = dnp + e * dn_e + (n0 + i) * dn_row;
        float part;
        if constexpr (K == Kind::q4) {
          const auto* r = reinterpret_cast<const uint8_t*>(row);
          part = dk == FTLAB_BANK_Q4_0 ? q4_row_dot(r, nbi, &hq[p * inter], &hd[p * nbi], &hs[p * nbi])
                                       : kq::row_dot(dk, r, nbi, &hq[p * inter], &hd[p * nbi], &hs[p * nbi]);
        } else {
          part = dense_row_dot<K>(row, static_cast<int>(inter), &h[p * inter]);
        }
        acc[i] += wp[p] * part;
      }
    }
    for (int64_t i = 0; i < rows; ++i) yp[tok * hidden + n0 + i] = acc[i];
  }
}

void dispatch(const FtlabCpuMoeJob& job) {
  switch (quantized(job.kind & 0xff) ? Kind::q4 : static_cast<Kind>(job.kind & 0xff)) {
    case Kind::q4: run<Kind::q4>(job); break;
    case Kind::f32: run<Kind::f32>(job); break;
    case Kind::bf16: run<Kind::bf16>(job); break;
    case Kind::f16: run<Kind::f16>(job); break;
  }
}

void check_f32(const TensorView& t, const char* name) {
  TVM_FFI_CHECK(t.IsContiguous() && t.dtype().code == kDLFloat && t.dtype().bits == 32, TypeError)
      << name << " must be contiguous float32";
}

}  // namespace cpu

using tvm::ffi::TensorView;

// x fp32 [T, H], w_gate_up [E, 2I, *] and w_down [E, H, *] (both quantized -- uint8 rows of the
// FtlabCpuBankKind gate_kind / down_kind -- or both dense of one dtype), ids int32 [T, k],
// wts fp32 [T, k] -> y fp32 [T, H].
void moe_experts_cpu(TensorView x, TensorView w_gate_up, TensorView w_down, TensorView ids, TensorView wts,
                     TensorView y, int64_t gate_kind, int64_t down_kind) {
  using namespace cpu;
  check_f32(x, "x");
  check_f32(wts, "wts");
  check_f32(y, "y");
  TVM_FFI_CHECK(ids.IsContiguous() && ids.dtype().code == kDLInt && ids.dtype().bits == 32, TypeError)
      << "ids must be contiguous int32";
  TVM_FFI_CHECK(x.ndim() == 2 && ids.ndim() == 2 && ids.size(0) == x.size(0) && wts.numel() == ids.numel() &&
                    y.ndim() == 2 && y.size(0) == x.size(0) && y.size(1) == x.size(1),
                ValueError)
      << "x and y must be [T, H], ids and wts [T, k]";
  TVM_FFI_CHECK(w_gate_up.IsContiguous() && w_down.IsContiguous() && w_gate_up.ndim() == 3 && w_down.ndim() == 3,
                ValueError)
      << "banks must be contiguous [E, N, *]";
  const int gk = kind_of(w_gate_up, "w_gate_up", gate_kind), dk = kind_of(w_down, "w_down", down_kind);
  const int32_t kind = FTLAB_CPU_JOB_KIND(gk, dk);
  TVM_FFI_CHECK(kinds_ok(kind), TypeError) << "w_gate_up and w_down must be both quantized or dense of one dtype";
  const int64_t hidden = x.size(1), inter = w_gate_up.size(1) / 2;
  const bool q = quantized(gk);
  // weights a block: 256 for the K-quants, 32 for Q4_0 / Q8_0 (and the Q8_1 activations)
  auto block = [q](int kind) { return !q ? 1 : (kind >= FTLAB_BANK_Q4_K ? 256 : kQK); };
  const int64_t gb = q ? kq::row_bytes(gk, hidden) : hidden, db = q ? kq::row_bytes(dk, inter) : inter;
  TVM_FFI_CHECK(w_gate_up.size(0) == w_down.size(0) && w_gate_up.size(2) == gb && w_down.size(1) == hidden &&
                    w_down.size(2) == db && hidden % block(gk) == 0 && inter % block(dk) == 0,
                ValueError)
      << "banks must be w_gate_up [E, 2I, H] and w_down [E, H, I] (K a multiple of the type's block)";
  FtlabCpuMoeJob job{FTLAB_CPU_JOB_VERSION, kind, 0, 0, x.size(0), hidden, ids.size(1),
                     w_gate_up.size(0), inter, reinterpret_cast<const float*>(base(x)),
                     reinterpret_cast<const int32_t*>(base(ids)), reinterpret_cast<const float*>(base(wts)),
                     reinterpret_cast<float*>(const_cast<char*>(base(y))), base(w_gate_up), base(w_down)};
  dispatch(job);
}

}  // namespace ftlab

// The C entry of the hybrid handshakes' worker threads (cpu_job.h): no tvm-ffi objects, no
// exceptions across the boundary; 1 for a job of another version or kind, 0 when done.
extern "C" int ftlab_cpu_moe_job(const FtlabCpuMoeJob* job) noexcept {
  if (job == nullptr || job->version != FTLAB_CPU_JOB_VERSION || !ftlab::cpu::kinds_ok(job->kind)) return 1;
  // the worker thread's own ICV: the handshake leaves cores to the threads that feed the GPU
  if (job->threads > 0) omp_set_num_threads(job->threads);
  try {
    ftlab::cpu::dispatch(*job);
  } catch (...) {
    return 2;
  }
  return 0;
}

namespace ftlab {
// The address of ftlab_cpu_moe_job, for a handshake module of this process.
int64_t moe_job_entry() { return reinterpret_cast<int64_t>(&ftlab_cpu_moe_job); }
}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_experts_cpu, ftlab::moe_experts_cpu);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_job_entry, ftlab::moe_job_entry);

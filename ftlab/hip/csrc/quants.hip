// quants.hip — device code for dequantizing GGUF Q8_0 and the K-quants (Q4_K, Q5_K, Q6_K), and
// for quantizing to Q8_0.
//
// Contract: docs/OPS.md section 7; reference (the specification): ftlab/reference/quants.py.
// fp32 values are bit-identical to the reference and to llama.cpp's dequantize_row_*: every
// product and difference is rounded on its own, in the reference's order, through port.h's
// *_rn helpers, so no compiler contracts `scale * q - shift` into an FMA. fp16 / bf16 outputs
// are those fp32 values rounded once, to nearest even, by the T::from_float of the loaders.
//
// One thread per chunk of 8 consecutive outputs (so 4 threads per Q8_0 block, 32 per K-quant
// super-block): the 8 values share one scale (a Q8_0 block of 32, a Q4_K / Q5_K sub-block of
// 32, a Q6_K sub-block of 16), and their stores are 16-byte vectors. Nothing depends on the
// wave size: the threads of a block never talk to each other.
//
// Blocks are 34, 144, 176 and 210 bytes, so a block is only 2-byte aligned (given an even base,
// which the launcher checks): bytes are read as 16-bit words.
//
// Includes q4_0_common.h and port.h only: the gfx compile check compiles this file alone.
#include "q4_0_common.h"

namespace ftlab {
namespace quants {

constexpr int kThreads = 256;
constexpr int kChunk = 8;  // outputs per thread

// The 16-bit little-endian word at a 2-byte aligned address.
__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// 8 bytes at a 2-byte aligned address, as two little-endian words (byte i in bits 8*(i%4)
// of word i/4).
__device__ __forceinline__ void load8(const uint8_t* p, uint32_t out[2]) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  out[0] = static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
  out[1] = static_cast<uint32_t>(h[2]) | (static_cast<uint32_t>(h[3]) << 16);
}

__device__ __forceinline__ uint32_t byte_of(const uint32_t w[2], int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xFFu; }

// a - b, rounded once: IEEE defines subtraction as a + (-b), bit for bit (signed zeros and
// NaNs included), and port.h has no separate *_sub_rn.
__device__ __forceinline__ float sub_rn(float a, float b) { return port_add_rn(a, -b); }

// ------------------------------------------------------------------ block types
// Each type: kBlock weights in kBytes bytes, and chunk(), the fp32 values of outputs
// 8*part .. 8*part+7 of the block at blk (part in [0, kBlock / 8)).

// Q8_0 (34 bytes / 32): d fp16, q[32] int8; x = q * d (the reference's order; a product
// commutes bit for bit anyway).
struct Q8_0 {
  static constexpr int kBlock = 32, kBytes = 34;
  static __device__ __forceinline__ void chunk(const uint8_t* blk, int part, float v[kChunk]) {
    const float d = port_half_to_float(static_cast<uint16_t>(load_u16(blk)));
    uint32_t q[2];
    load8(blk + 2 + kChunk * part, q);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      v[i] = port_mul_rn(static_cast<float>(static_cast<int8_t>(byte_of(q, i))), d);
    }
  }
};

// Q4_K (144 bytes / 256) and Q5_K (176 bytes: qh[32] between the scales and qs): d, dmin
// fp16; 12 bytes of eight 6-bit scales and mins; qs[128], pair p of sub-blocks (64 weights)
// in bytes 32p..32p+31, low nibbles sub-block 2p, high nibbles 2p+1; Q5_K's fifth bit of
// weight l of sub-block j is bit j of qh[l]. x = (d * sc[j]) * q - (dmin * m[j]).
template <bool kFifth>
struct QK4 {
  static constexpr int kBlock = 256, kBytes = kFifth ? 176 : 144;
  static constexpr int kQs = kFifth ? 48 : 16;  // offset of qs
  static __device__ __forceinline__ void chunk(const uint8_t* blk, int part, float v[kChunk]) {
    const int j = part >> 2;              // sub-block of 32: four chunks each
    const int l0 = (part & 3) * kChunk;   // first weight of the chunk within the sub-block
    const float d = port_half_to_float(static_cast<uint16_t>(load_u16(blk)));
    const float dmin = port_half_to_float(static_cast<uint16_t>(load_u16(blk + 2)));
    // llama.cpp's get_scale_min_k4 (reference: scale_min_k4): j < 4 from the low six bits of
    // bytes j and j + 4; j >= 4 from the nibbles of byte j + 4 and the top two bits of bytes
    // j - 4 (scale) and j (min). Every thread of a block reads the same 12 bytes: broadcasts.
    const uint8_t* s = blk + 4;
    uint32_t sc, mn;
    if (j < 4) {
      sc = s[j] & 0x3Fu;
      mn = s[j + 4] & 0x3Fu;
    } else {
      sc = (s[j + 4] & 0x0Fu) | ((s[j - 4] >> 6) << 4);
      mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    const float scale = port_mul_rn(d, static_cast<float>(sc));  // rounded, as gguf-py does
    const float shift = port_mul_rn(dmin, static_cast<float>(mn));
    uint32_t qs[2];
    load8(blk + kQs + 32 * (j >> 1) + l0, qs);
    const int nib = 4 * (j & 1);  // odd sub-blocks take the high nibbles
    uint32_t qh[2] = {0u, 0u};
    if (kFifth) load8(blk + 16 + l0, qh);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      uint32_t q = (byte_of(qs, i) >> nib) & 0x0Fu;
      if (kFifth) q |= ((byte_of(qh, i) >> j) & 1u) << 4;
      v[i] = sub_rn(port_mul_rn(scale, static_cast<float>(q)), shift);
    }
  }
};

// Q6_K (210 bytes / 256): ql[128], qh[64], scales[16] int8, d fp16. Weight 128h + 32r + l
// (half h, quarter r, l < 32) takes the low (r < 2) or high (r >= 2) nibble of ql byte
// 64h + 32(r & 1) + l and bits 2r, 2r+1 of qh byte 32h + l; q = (nibble | two << 4) - 32;
// x = (d * scales[j]) * q for its sub-block j = (128h + 32r + l) / 16 of 16.
struct Q6_K {
  static constexpr int kBlock = 256, kBytes = 210;
  static __device__ __forceinline__ void chunk(const uint8_t* blk, int part, float v[kChunk]) {
    const int h = part >> 4;              // 16 chunks per half
    const int r = (part >> 2) & 3;        // 4 chunks per quarter
    const int l0 = (part & 3) * kChunk;
    const int j = (kChunk * part) >> 4;   // the chunk lies in one sub-block of 16
    const float d = port_half_to_float(static_cast<uint16_t>(load_u16(blk + 208)));
    const float scale = port_mul_rn(d, static_cast<float>(static_cast<int8_t>(blk[192 + j])));
    uint32_t ql[2], qh[2];
    load8(blk + 64 * h + 32 * (r & 1) + l0, ql);
    load8(blk + 128 + 32 * h + l0, qh);
    const int nib = 4 * (r >> 1);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const uint32_t low = (byte_of(ql, i) >> nib) & 0x0Fu;
      const uint32_t two = (byte_of(qh, i) >> (2 * r)) & 0x03u;
      const int q = static_cast<int>(low | (two << 4)) - 32;
      v[i] = port_mul_rn(scale, static_cast<float>(q));
    }
  }
};

// The fp32 value as an opaque register. LLVM 19 (clang-19, and ROCm compilers of its age)
// lowers fptrunc(fmul a, b) on gfx11 / gfx12 to v_fma_mixlo_f16(a, b, +0.0), which turns a -0.0
// product into +0.0 (fixed upstream in llvm-project#214544); zero scales are valid input, so
// the fp16 output would lose the sign the reference keeps. The empty asm hides the product
// from that pattern; the multiply stays a v_mul_f32 and the convert a v_cvt_f16_f32.
__device__ __forceinline__ float opaque(float x) {
#if !defined(PORT_CUDA)
  asm("" : "+v"(x));
#endif
  return x;
}

// ------------------------------------------------------------------ stores
// Eight outputs at an address aligned to 16 bytes (the launcher checks the base; chunks
// start at multiples of 8 elements): two 16-byte stores of fp32, one of 16-bit values.
__device__ __forceinline__ bytes16 vec4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  bytes16 v;
  v.x = a;
  v.y = b;
  v.z = c;
  v.w = d;
  return v;
}

__device__ __forceinline__ void store8(float* out, const float s[kChunk]) {
  bytes16* o = reinterpret_cast<bytes16*>(out);
  o[0] = vec4(port_float_to_bits(s[0]), port_float_to_bits(s[1]), port_float_to_bits(s[2]),
              port_float_to_bits(s[3]));
  o[1] = vec4(port_float_to_bits(s[4]), port_float_to_bits(s[5]), port_float_to_bits(s[6]),
              port_float_to_bits(s[7]));
}

__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

__device__ __forceinline__ void store8(uint16_t* out, const uint16_t s[kChunk]) {
  *reinterpret_cast<bytes16*>(out) = vec4(pack2(s[0], s[1]), pack2(s[2], s[3]), pack2(s[4], s[5]), pack2(s[6], s[7]));
}

// ------------------------------------------------------------------ the kernel

// Thread c writes outputs 8c .. 8c+7: chunk c % (Q::kBlock / 8) of block c / (Q::kBlock / 8)
// (blocks are consecutive in memory and in the output alike, whatever the shape).
template <typename T, typename Q>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t* __restrict__ w, typename T::storage* __restrict__ out, int64_t num_chunks) {
  constexpr int kParts = Q::kBlock / kChunk;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= num_chunks) return;
  float v[kChunk];
  Q::chunk(w + (c / kParts) * Q::kBytes, static_cast<int>(c % kParts), v);
  typename T::storage s[kChunk];
#pragma unroll
  for (int i = 0; i < kChunk; ++i) s[i] = T::from_float(opaque(v[i]));
  store8(out + c * kChunk, s);
}

// ------------------------------------------------------------------ quantize to Q8_0

// One thread per 32-block: d = amax / 127, q = round_half_away(x * (1 / d)) (0 when d == 0),
// each quotient and product rounded on its own -- llama.cpp's quantize_row_q8_0_ref and
// gguf-py, byte for byte. The 34-byte block is written as 17 16-bit words (out 2-byte aligned).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_q8_0_kernel(const typename T::storage* __restrict__ x, uint8_t* __restrict__ out, int64_t num_blocks) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= num_blocks) return;
  const typename T::storage* xb = x + b * 32;
  float v[32];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    v[i] = T::load(xb + i);
    amax = __builtin_fmaxf(amax, __builtin_fabsf(v[i]));
  }
  const float d = port_div_rn(amax, 127.0f);
  const float inv = d == 0.0f ? 0.0f : port_div_rn(1.0f, d);
  uint16_t* ob = reinterpret_cast<uint16_t*>(out + b * Q8_0::kBytes);
  ob[0] = port_float_to_half(d);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int lo = static_cast<int>(round_half_away(port_mul_rn(v[2 * i], inv)));
    const int hi = static_cast<int>(round_half_away(port_mul_rn(v[2 * i + 1], inv)));
    ob[1 + i] = static_cast<uint16_t>((lo & 0xFF) | ((hi & 0xFF) << 8));
  }
}

// Every configuration the launcher uses: 4 block types x 3 output dtypes, and the quantizer
// of 3 input dtypes.
#define FTLAB_QUANTS_INSTANTIATE(T)                                                                                \
  template __global__ void dequantize_kernel<T, Q8_0>(const uint8_t* __restrict__, T::storage* __restrict__,       \
                                                  int64_t);                                                        \
  template __global__ void dequantize_kernel<T, QK4<false>>(const uint8_t* __restrict__, T::storage* __restrict__, \
                                                  int64_t);                                                        \
  template __global__ void dequantize_kernel<T, QK4<true>>(const uint8_t* __restrict__, T::storage* __restrict__,  \
                                                  int64_t);                                                        \
  template __global__ void dequantize_kernel<T, Q6_K>(const uint8_t* __restrict__, T::storage* __restrict__,       \
                                                  int64_t);
FTLAB_QUANTS_INSTANTIATE(f32_t)
FTLAB_QUANTS_INSTANTIATE(f16_t)
FTLAB_QUANTS_INSTANTIATE(bf16_t)
#undef FTLAB_QUANTS_INSTANTIATE
template __global__ void quantize_q8_0_kernel<f32_t>(const f32_t::storage* __restrict__, uint8_t* __restrict__, int64_t);
template __global__ void quantize_q8_0_kernel<f16_t>(const f16_t::storage* __restrict__, uint8_t* __restrict__, int64_t);
template __global__ void quantize_q8_0_kernel<bf16_t>(const bf16_t::storage* __restrict__, uint8_t* __restrict__,
                                                      int64_t);

}  // namespace quants
}  // namespace ftlab

// q4_0.hip — device code for GGUF Q4_0: quantize, dequantize and the Q8_1 activations. The
// int8-dot matvecs (decode) are in q4_0_matvec.hip, the dp4a-tiled GEMM (prefill) in
// q4_0_gemm.hip.
//
// Contract: docs/OPS.md section 2; reference: ftlab/reference/q4_0.py.
//
// Block layout (18 bytes for 32 weights): fp16 d, then qs[16]; byte j holds element j in
// its low nibble and element j+16 in its high nibble; x = d * (q - 8).
//
// Includes q4_0_common.h and port.h only: the gfx compile check compiles this file alone.
#include "q4_0_common.h"

namespace ftlab {

constexpr int kThreads = 256;

// ------------------------------------------------------------------ quantize / dequantize

// One thread per block. amax is the first element of largest magnitude, with its sign.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_q4_0_kernel(const typename T::storage* __restrict__ x, uint8_t* __restrict__ out,
                         int64_t num_blocks) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= num_blocks) return;
  const typename T::storage* xb = x + b * kQK;
  float v[kQK];
  float amax = 0.0f, best = -1.0f;
#pragma unroll
  for (int i = 0; i < kQK; ++i) {
    v[i] = T::load(xb + i);
    const float a = __builtin_fabsf(v[i]);
    if (a > best) {  // strict: the first of equal magnitudes wins
      best = a;
      amax = v[i];
    }
  }
  const float d = amax / -8.0f;  // exact
  const float inv = d == 0.0f ? 0.0f : port_div_rn(1.0f, d);
  // 18 bytes as nine 16-bit stores (blocks start at even offsets): d, then qs pairs
  uint16_t* ob = reinterpret_cast<uint16_t*>(out + b * kBlockBytes);
  ob[0] = port_float_to_half(d);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint32_t two = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = 2 * i + h;
      // trunc(x * id + 8.5) with the product rounded first, then clamped to 15
      int lo = static_cast<int>(port_add_rn(port_mul_rn(v[j], inv), 8.5f));
      int hi = static_cast<int>(port_add_rn(port_mul_rn(v[j + 16], inv), 8.5f));
      lo = lo > 15 ? 15 : lo;
      hi = hi > 15 ? 15 : hi;
      two |= static_cast<uint32_t>(lo | (hi << 4)) << (8 * h);
    }
    ob[1 + i] = static_cast<uint16_t>(two);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    dequantize_q4_0_kernel(const uint8_t* __restrict__ w, typename T::storage* __restrict__ out,
                           int64_t num_blocks) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= num_blocks) return;
  const uint16_t* wb = reinterpret_cast<const uint16_t*>(w + b * kBlockBytes);
  const float d = port_half_to_float(wb[0]);
  typename T::storage* ob = out + b * kQK;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t two = wb[1 + i];  // bytes 2i, 2i+1 of qs
    ob[2 * i] = T::from_float(d * static_cast<float>(static_cast<int>(two & 15) - 8));
    ob[2 * i + 1] = T::from_float(d * static_cast<float>(static_cast<int>((two >> 8) & 15) - 8));
    ob[2 * i + 16] = T::from_float(d * static_cast<float>(static_cast<int>((two >> 4) & 15) - 8));
    ob[2 * i + 17] = T::from_float(d * static_cast<float>(static_cast<int>(two >> 12) - 8));
  }
}

// Four threads per (row, 32-block) of activations, 8 elements each: amax and the sum of the
// quantized values over the four by shuffles, then q8_1_block's arithmetic (q8_1_word), so the
// result is bit for bit that of one thread per block (a quarter of its 32 serial divisions a
// thread, which made a decode step's 2048-element x a visible launch on 64 threads). Quads are whole (4 * rows *
// nb threads), and every thread of a warp reaches the shuffles (inactive ones with zeros).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_q8_1_kernel(const typename T::storage* __restrict__ x, int64_t x_stride,
                         int8_t* __restrict__ q, float* __restrict__ d_out,
                         float* __restrict__ s_out, int64_t rows, int64_t k) {
  port_pdl_wait();     // launched dependent on the kernel before (launch_pdl): x may be its output
  port_pdl_trigger();  // the matvec after may launch now; it waits for this grid's writes
  const int64_t nb = k / kQK;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = t < 4 * rows * nb;
  const int64_t mb = active ? t / 4 : 0;
  const int quarter = static_cast<int>(t % 4);
  const int64_t m = mb / nb, b = mb % nb;
  const typename T::storage* xb = x + m * x_stride + b * kQK + 8 * quarter;
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = active ? T::load(xb + i) : 0.0f;
  uint32_t qw[2];
  float d;
  int sum;
  q8_1_quarter(v, qw, &d, &sum);
  if (!active) return;
  uint32_t* qb = reinterpret_cast<uint32_t*>(q + m * k + b * kQK + 8 * quarter);  // k % 32 == 0: aligned
  qb[0] = qw[0];
  qb[1] = qw[1];
  if (quarter == 0) {
    d_out[m * nb + b] = d;
    s_out[m * nb + b] = d * static_cast<float>(sum);
  }
}

// Every configuration the launcher uses.
#define FTLAB_Q4_0_INSTANTIATE(T)                                                             \
  template __global__ void quantize_q4_0_kernel<T>(const T::storage*, uint8_t*, int64_t);    \
  template __global__ void dequantize_q4_0_kernel<T>(const uint8_t*, T::storage*, int64_t);  \
  template __global__ void quantize_q8_1_kernel<T>(const T::storage*, int64_t, int8_t*,      \
                                                   float*, float*, int64_t, int64_t);
FTLAB_Q4_0_INSTANTIATE(f32_t)
FTLAB_Q4_0_INSTANTIATE(f16_t)
FTLAB_Q4_0_INSTANTIATE(bf16_t)

}  // namespace ftlab

// norm.hip — add_rmsnorm: the residual add of a transformer layer fused with the next RMSNorm.
// Contract: ftlab/ops/norm.py; reference: ftlab/reference/norm.py.
//
// One block of kNormThreads per row. Thread t takes the V-element pieces t, t + kNormThreads,
// ... of the row: V = 16 bytes of x's dtype where the launcher found H a multiple of V and every
// row and the weight 16-byte aligned, else 1. Pass 1: s = x + residual in fp32, rounded once to
// x's dtype and stored, the rounded value's square added to the thread's sum; the sums meet by
// shuffles within each wave, then through LDS across the waves in a fixed order (the same
// result every run). Pass 2: y = s * r * weight in fp32, rounded once. A thread's first
// kNormCache pieces (x and the residual all loaded before any is used) stay in registers
// between the passes, the rounded s as raw vectors of x's dtype; further pieces (rows longer
// than kNormThreads * kNormCache * V) are read back from the thread's own stores of s (x
// without a residual). A row whose squares overflow fp32 sums them again, scaled (norm_common.h).
// No allocation, no host work: graph-capturable. Wave-size generic (PORT_WARP_SIZE; the LDS
// partials are sized for the smaller wave).
#pragma once
#include "norm_common.h"

namespace ftlab {

// x, residual [N, H] with unit element strides (row strides x_row, r_row; residual null: none),
// weight [H] contiguous of W, s and y [N, H] contiguous in x's dtype (s unused without a
// residual). H a multiple of V; with V > 1 every row and the weight 16-byte aligned.
template <typename T, typename W, int V>
__global__ void __launch_bounds__(kNormThreads)
    add_rmsnorm_kernel(const typename T::storage* __restrict__ x, int64_t x_row,
                       const typename T::storage* __restrict__ res, int64_t r_row,
                       const typename W::storage* __restrict__ weight, typename T::storage* __restrict__ s,
                       typename T::storage* __restrict__ y, float eps, int h) {
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl): nothing read or written before this
  port_pdl_trigger();
  const int64_t n = blockIdx.x;
  const bool residual = res != nullptr;
  const typename T::storage* xr = x + n * x_row;
  const typename T::storage* rr = residual ? res + n * r_row : xr;  // unread without a residual
  typename T::storage* sr = s + n * h;
  typename T::storage* yr = y + n * h;
  const int pieces = h / V;
  const int t = static_cast<int>(threadIdx.x);
  // The cached pieces, kept raw (the rounded s in x's dtype): every load of x and the residual
  // issued before any is used.
  norm_pieces<T, V> xs[kNormCache], rs[kNormCache];
#pragma unroll
  for (int c = 0; c < kNormCache; ++c) {
    const int64_t at = static_cast<int64_t>(t + c * kNormThreads) * V;
    if (at < h) {
      norm_fetch<T, V>(xr + at, xs[c]);
      if (residual) norm_fetch<T, V>(rr + at, rs[c]);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < kNormCache; ++c) {
    const int64_t at = static_cast<int64_t>(t + c * kNormThreads) * V;
    if (at < h) ss += norm_sum<T, V>(xs[c], rs[c], sr + at, residual);
  }
  for (int j = t + kNormCache * kNormThreads; j < pieces; j += kNormThreads) {  // the rest
    const int64_t at = static_cast<int64_t>(j) * V;
    norm_pieces<T, V> xu, ru;
    norm_fetch<T, V>(xr + at, xu);
    if (residual) norm_fetch<T, V>(rr + at, ru);
    ss += norm_sum<T, V>(xu, ru, sr + at, residual);
  }
#pragma unroll
  for (int m = PORT_WARP_SIZE / 2; m > 0; m >>= 1) ss += port_shfl_xor(ss, m);
  __shared__ float partial[kNormPartials];
  if (t % PORT_WARP_SIZE == 0) partial[t / PORT_WARP_SIZE] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormThreads / PORT_WARP_SIZE; ++k) total += partial[k];
  float r = 1.0f / port_sqrtf(total / static_cast<float>(h) + eps);
  if (total == __builtin_inff()) {  // the squares overflowed (norm_common.h): summed again, scaled
    float scaled = norm_cached_scaled_squares<T, V>(xs, t, h);
    for (int j = t + kNormCache * kNormThreads; j < pieces; j += kNormThreads) {
      norm_pieces<T, V> su;
      norm_fetch<T, V>((residual ? sr : xr) + static_cast<int64_t>(j) * V, su);  // s: stored above
      scaled += norm_scaled_squares<T, V>(su);
    }
    r = norm_scaled_factor(norm_block_sum(scaled, partial, t), h, eps);
  }
#pragma unroll
  for (int c = 0; c < kNormCache; ++c) {
    const int64_t at = static_cast<int64_t>(t + c * kNormThreads) * V;
    if (at < h) {
      norm_pieces<W, V> wraw;
      norm_fetch<W, V>(weight + at, wraw);
      float w[V];
      norm_floats<W, V>(wraw, w);
      norm_out<T, V>(yr + at, xs[c], w, r);
    }
  }
  for (int j = t + kNormCache * kNormThreads; j < pieces; j += kNormThreads) {
    const int64_t at = static_cast<int64_t>(j) * V;
    norm_pieces<T, V> su;
    norm_pieces<W, V> wraw;
    norm_fetch<T, V>((residual ? sr : xr) + at, su);  // s: this thread stored it above
    norm_fetch<W, V>(weight + at, wraw);
    float w[V];
    norm_floats<W, V>(wraw, w);
    norm_out<T, V>(yr + at, su, w, r);
  }
}

#define FTLAB_NORM_INSTANTIATE(T, W, V)                                                                      \
  template __global__ void add_rmsnorm_kernel<T, W, V>(const T::storage*, int64_t, const T::storage*, int64_t, \
                                                       const W::storage*, T::storage*, T::storage*, float, int);
#define FTLAB_NORM_WEIGHTS(T, V) \
  FTLAB_NORM_INSTANTIATE(T, f32_t, V) FTLAB_NORM_INSTANTIATE(T, f16_t, V) FTLAB_NORM_INSTANTIATE(T, bf16_t, V)
FTLAB_NORM_WEIGHTS(f32_t, 4)
FTLAB_NORM_WEIGHTS(f32_t, 1)
FTLAB_NORM_WEIGHTS(f16_t, 8)
FTLAB_NORM_WEIGHTS(f16_t, 1)
FTLAB_NORM_WEIGHTS(bf16_t, 8)
FTLAB_NORM_WEIGHTS(bf16_t, 1)

}  // namespace ftlab

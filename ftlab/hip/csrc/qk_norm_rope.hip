// qk_norm_rope.hip — qk_norm_rope: per-head RMSNorm of q and k, then RoPE (rotate-half form).
// Contract: ftlab/ops/qk_norm_rope.py; reference: ftlab/reference/qk_norm_rope.py.
//
// One wave per (token, head) row, rows of q then rows of k: lane l takes the element pairs
// (p, p + R/2) for p = l, l + W, ... < R/2 (R = rot, the rotated dims; R = D for full RoPE) --
// a pair holds each other's rotation partner, so nothing crosses lanes but the sum of squares
// (a shuffle reduction; a row whose squares overflow fp32: norm_common.h) -- and the elements R,
// ..., D-1 past them, which pass through normed.
// fp32 throughout, one rounding to the output dtype. Wave-size generic (PORT_WARP_SIZE).
//
// With a KV cache (kc non-null): token n's slot = slots[n] (int32 or int64); a k row is also
// written at kc[slot] (head h at columns h * D), and one more row a token copies v[n] (vw
// elements) to vc[slot]: what store(kc, vc, slots, k_out, v) writes with check=False (slot -1
// or outside [0, num_slots): that token's cache rows are not written).
#pragma once
#include "norm_common.h"

namespace ftlab {

constexpr int kNormRopeWaves = 4;  // rows a block

template <typename T, typename W>
__global__ void __launch_bounds__(kNormRopeWaves * PORT_WARP_SIZE)
    qk_norm_rope_kernel(const typename T::storage* __restrict__ q, int64_t q_row,
                        const typename T::storage* __restrict__ k, int64_t k_row,
                        const typename W::storage* __restrict__ qw, const typename W::storage* __restrict__ kw,
                        const typename T::storage* __restrict__ cos, const typename T::storage* __restrict__ sin,
                        typename T::storage* __restrict__ qo, typename T::storage* __restrict__ ko, float eps,
                        int tokens, int hq, int hk, int d, int rot, typename T::storage* __restrict__ kc,
                        int64_t kc_row, typename T::storage* __restrict__ vc, int64_t vc_row,
                        const void* __restrict__ slots, bool slots64, int64_t num_slots,
                        const typename T::storage* __restrict__ v, int64_t v_row, int vw) {
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl)
  port_pdl_trigger();
  const int lane = threadIdx.x % PORT_WARP_SIZE;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kNormRopeWaves + threadIdx.x / PORT_WARP_SIZE;
  const int heads = hq + hk + (kc != nullptr ? 1 : 0);  // the cache's v row last
  if (row >= static_cast<int64_t>(tokens) * heads) return;  // whole waves leave together
  const int n = static_cast<int>(row / heads), h = static_cast<int>(row % heads);
  int64_t slot = -1;
  if (kc != nullptr) {
    slot = slots64 ? static_cast<const int64_t*>(slots)[n] : static_cast<const int32_t*>(slots)[n];
    if (slot >= num_slots) slot = -1;
  }
  if (h == hq + hk) {  // the v row: a copy into the cache
    if (slot >= 0)
      for (int i = lane; i < vw; i += PORT_WARP_SIZE) vc[slot * vc_row + i] = v[n * v_row + i];
    return;
  }
  const bool is_q = h < hq;
  typename T::storage* cache_row = (!is_q && slot >= 0) ? kc + slot * kc_row + static_cast<int64_t>(h - hq) * d : nullptr;
  const typename T::storage* src = is_q ? q + n * q_row + static_cast<int64_t>(h) * d
                                        : k + n * k_row + static_cast<int64_t>(h - hq) * d;
  const typename W::storage* w = is_q ? qw : kw;
  typename T::storage* dst = is_q ? qo + (static_cast<int64_t>(n) * hq + h) * d
                                  : ko + (static_cast<int64_t>(n) * hk + h - hq) * d;
  const int half = rot / 2;
  float ss = 0.0f;
  for (int p = lane; p < half; p += PORT_WARP_SIZE) {
    const float a = T::load(src + p), b = T::load(src + p + half);
    ss += a * a + b * b;
  }
  for (int i = rot + lane; i < d; i += PORT_WARP_SIZE) {
    const float a = T::load(src + i);
    ss += a * a;
  }
#pragma unroll
  for (int m = PORT_WARP_SIZE / 2; m > 0; m >>= 1) ss += port_shfl_xor(ss, m);
  float r = 1.0f / port_sqrtf(ss / static_cast<float>(d) + eps);
  if (ss == __builtin_inff()) {  // the squares overflowed (norm_common.h): summed again, scaled
    float scaled = 0.0f;
    for (int i = lane; i < d; i += PORT_WARP_SIZE) {
      const float v = T::load(src + i) * kNormScale;
      scaled += v * v;
    }
    r = norm_scaled_factor(norm_wave_sum(scaled), d, eps);
  }
  const typename T::storage* c = cos + static_cast<int64_t>(n) * rot;
  const typename T::storage* s = sin + static_cast<int64_t>(n) * rot;
  for (int p = lane; p < half; p += PORT_WARP_SIZE) {
    const float ya = T::load(src + p) * r * W::load(w + p);
    const float yb = T::load(src + p + half) * r * W::load(w + p + half);
    const float lo = ya * T::load(c + p) + yb * T::load(s + p);
    const float hi = yb * T::load(c + p + half) + ya * T::load(s + p + half);
    dst[p] = T::from_float(lo);
    dst[p + half] = T::from_float(hi);
    if (cache_row != nullptr) {  // the same roundings
      cache_row[p] = T::from_float(lo);
      cache_row[p + half] = T::from_float(hi);
    }
  }
  for (int i = rot + lane; i < d; i += PORT_WARP_SIZE) {
    const float y = T::load(src + i) * r * W::load(w + i);
    dst[i] = T::from_float(y);
    if (cache_row != nullptr) cache_row[i] = T::from_float(y);
  }
}

#define FTLAB_NORM_ROPE_INSTANTIATE(T, W)                                                                  \
  template __global__ void qk_norm_rope_kernel<T, W>(                                                     \
      const T::storage*, int64_t, const T::storage*, int64_t, const W::storage*, const W::storage*,       \
      const T::storage*, const T::storage*, T::storage*, T::storage*, float, int, int, int, int, int,       \
      T::storage*, int64_t, T::storage*, int64_t, const void*, bool, int64_t, const T::storage*, int64_t, int);
FTLAB_NORM_ROPE_INSTANTIATE(f32_t, f32_t)
FTLAB_NORM_ROPE_INSTANTIATE(f16_t, f16_t)
FTLAB_NORM_ROPE_INSTANTIATE(bf16_t, bf16_t)

}  // namespace ftlab

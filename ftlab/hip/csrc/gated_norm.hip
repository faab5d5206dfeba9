// gated_norm.hip — gated RMSNorm (gated deltanet output) and the attention output gate.
// Contract: ftlab/ops/gated_norm.py; reference: ftlab/reference/gated_norm.py.
//
// gated_rmsnorm_kernel: one wave per (token, head) row; lanes stride over the D elements, the
// sum of squares reduced by shuffles, then each element normalized, scaled by the weight and
// by SiLU of its gate, rounded once (a row whose squares overflow fp32: norm_common.h).
// output_gate_kernel: one thread per element, a row's blocks side by side on a 1-D grid (no 65535
// limit on the rows). fp32 throughout. Wave-size generic (PORT_WARP_SIZE).
#pragma once
#include "norm_common.h"

namespace ftlab {

constexpr int kGatedNormWaves = 4;  // rows a block
constexpr int kGateThreads = 256;

// x, z [N, H, D] with contiguous heads and elements (token strides x_row, z_row), weight [D]
// fp32; y [N, H, D] contiguous in x's dtype.
template <typename T, typename Z>
__global__ void __launch_bounds__(kGatedNormWaves * PORT_WARP_SIZE)
    gated_rmsnorm_kernel(const typename T::storage* __restrict__ x, int64_t x_row,
                         const typename Z::storage* __restrict__ z, int64_t z_row, const float* __restrict__ weight,
                         typename T::storage* __restrict__ y, float eps, int tokens, int heads, int d) {
  const int lane = threadIdx.x % PORT_WARP_SIZE;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGatedNormWaves + threadIdx.x / PORT_WARP_SIZE;
  if (row >= static_cast<int64_t>(tokens) * heads) return;  // whole waves leave together
  const int64_t n = row / heads;
  const int h = static_cast<int>(row % heads);
  const typename T::storage* xr = x + n * x_row + static_cast<int64_t>(h) * d;
  const typename Z::storage* zr = z + n * z_row + static_cast<int64_t>(h) * d;
  float ss = 0.0f;
  for (int i = lane; i < d; i += PORT_WARP_SIZE) {
    const float v = T::load(xr + i);
    ss += v * v;
  }
#pragma unroll
  for (int m = PORT_WARP_SIZE / 2; m > 0; m >>= 1) ss += port_shfl_xor(ss, m);
  float r = 1.0f / port_sqrtf(ss / static_cast<float>(d) + eps);
  if (ss == __builtin_inff()) {  // the squares overflowed (norm_common.h): summed again, scaled
    float scaled = 0.0f;
    for (int i = lane; i < d; i += PORT_WARP_SIZE) {
      const float v = T::load(xr + i) * kNormScale;
      scaled += v * v;
    }
    r = norm_scaled_factor(norm_wave_sum(scaled), d, eps);
  }
  typename T::storage* yr = y + row * d;
  for (int i = lane; i < d; i += PORT_WARP_SIZE) {
    const float g = Z::load(zr + i);
    yr[i] = T::from_float(T::load(xr + i) * r * weight[i] * (g / (1.0f + port_expf(-g))));
  }
}

// attn, gate [N, F] with unit feature strides (row strides a_row, g_row); y [N, F] contiguous.
template <typename T>
__global__ void __launch_bounds__(kGateThreads)
    output_gate_kernel(const typename T::storage* __restrict__ attn, int64_t a_row,
                       const typename T::storage* __restrict__ gate, int64_t g_row, typename T::storage* __restrict__ y,
                       int features, int blocks_per_row) {
  const int64_t n = blockIdx.x / blocks_per_row;
  const int f = (blockIdx.x % blocks_per_row) * kGateThreads + threadIdx.x;
  if (f >= features) return;
  const float g = T::load(gate + n * g_row + f);
  y[n * features + f] = T::from_float(T::load(attn + n * a_row + f) / (1.0f + port_expf(-g)));
}

#define FTLAB_GATED_NORM_INSTANTIATE(T, Z)                                                                   \
  template __global__ void gated_rmsnorm_kernel<T, Z>(const T::storage*, int64_t, const Z::storage*, int64_t, \
                                                      const float*, T::storage*, float, int, int, int);
#define FTLAB_GATED_NORM_GATES(T)                                                                   \
  FTLAB_GATED_NORM_INSTANTIATE(T, f32_t) FTLAB_GATED_NORM_INSTANTIATE(T, f16_t)                     \
  FTLAB_GATED_NORM_INSTANTIATE(T, bf16_t)                                                           \
  template __global__ void output_gate_kernel<T>(const T::storage*, int64_t, const T::storage*, int64_t, \
                                                 T::storage*, int, int);
FTLAB_GATED_NORM_GATES(f32_t)
FTLAB_GATED_NORM_GATES(f16_t)
FTLAB_GATED_NORM_GATES(bf16_t)

}  // namespace ftlab

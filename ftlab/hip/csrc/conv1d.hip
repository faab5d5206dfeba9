// conv1d.hip — causal depthwise conv1d with a carried state (gated deltanet), and its decode step.
// Contract: ftlab/ops/conv1d.py; reference: ftlab/reference/conv1d.py.
//
// causal_conv1d_kernel: one thread per (sequence, channel, run of kConvRun tokens); the W-1
// inputs before the run (x's, or the state's before token 0, or zeros) sit in registers and
// slide along, so each input is read once. Taps are summed into the bias in order in fp32,
// SiLU applied, one rounding. The threads of the first run first write the new state (the W-1
// inputs ending at the sequence's length). causal_conv1d_update_kernel: one thread per
// (sequence, channel) computes the token's output and shifts that channel's state in place
// (zeros in place of the old state for a sequence flagged in reset).
// No cross-lane work: wave-size agnostic.
#pragma once
#include "q4_0_common.h"

namespace ftlab {

constexpr int kConvThreads = 128;  // channels a block
constexpr int kConvRun = 32;       // tokens a thread

__device__ __forceinline__ float conv_act(float acc, bool silu) {
  return silu ? acc / (1.0f + port_expf(-acc)) : acc;
}

// x [B, T, C] (channel stride 1, strides x_sb / x_st), weight [C, W] fp32, bias [C] fp32 or null,
// state [B, C, W-1] contiguous or null (zeros), lengths [B] int32 or null (all T); y [B, T, C]
// and new_state [B, C, W-1] contiguous.
template <typename T, int W>
__global__ void __launch_bounds__(kConvThreads)
    causal_conv1d_kernel(const typename T::storage* __restrict__ x, int64_t x_sb, int64_t x_st,
                         const float* __restrict__ weight, const float* __restrict__ bias,
                         const typename T::storage* __restrict__ state, const int32_t* __restrict__ lengths,
                         typename T::storage* __restrict__ y, typename T::storage* __restrict__ new_state, int tokens,
                         int channels, bool silu) {
  const int c = blockIdx.x * kConvThreads + threadIdx.x;
  const int b = blockIdx.z;
  if (c >= channels) return;
  int end = tokens;
  if (lengths != nullptr) {
    const int len = lengths[b];
    end = len < 0 ? 0 : (len < tokens ? len : tokens);
  }
  const typename T::storage* xb = x + b * x_sb + c;
  const typename T::storage* sb = state == nullptr ? nullptr : state + (static_cast<int64_t>(b) * channels + c) * (W - 1);
  if (blockIdx.y == 0) {
    typename T::storage* nb = new_state + (static_cast<int64_t>(b) * channels + c) * (W - 1);
#pragma unroll
    for (int i = 0; i < W - 1; ++i) {
      const int src = end + i;  // index into (state, x)
      typename T::storage v;
      if (src >= W - 1)
        v = xb[(src - (W - 1)) * x_st];
      else
        v = sb != nullptr ? sb[src] : T::from_float(0.0f);
      nb[i] = v;
    }
  }
  float w[W];
#pragma unroll
  for (int j = 0; j < W; ++j) w[j] = weight[static_cast<int64_t>(c) * W + j];
  const float b0 = bias == nullptr ? 0.0f : bias[c];
  const int t0 = blockIdx.y * kConvRun;
  float win[W];  // win[j]: the input at token t - (W-1) + j for the token t in hand
#pragma unroll
  for (int j = 0; j < W - 1; ++j) {
    const int s = t0 - (W - 1) + j;
    win[j] = s >= 0 ? T::load(xb + s * x_st) : (sb != nullptr ? T::load(sb + s + W - 1) : 0.0f);
  }
  const int stop = t0 + kConvRun < tokens ? t0 + kConvRun : tokens;
  const typename T::storage* xp = xb + t0 * x_st;
  typename T::storage* yp = y + (static_cast<int64_t>(b) * tokens + t0) * channels + c;
  for (int t = t0; t < stop; ++t, xp += x_st, yp += channels) {
    win[W - 1] = T::load(xp);
    float acc = b0;
#pragma unroll
    for (int j = 0; j < W; ++j) acc += w[j] * win[j];
    *yp = T::from_float(t < end ? conv_act(acc, silu) : 0.0f);
#pragma unroll
    for (int j = 0; j < W - 1; ++j) win[j] = win[j + 1];
  }
}

// x [B, C] (stride x_sb), state [B, C, W-1] (strides s_sb, s_sc, 1) updated in place, reset [B]
// bytes (stride r_sb; nonzero: the row starts afresh, its old state is not read but taken as
// zeros) or null (no row does), y [B, C].
template <typename T, int W>
__global__ void __launch_bounds__(kConvThreads)
    causal_conv1d_update_kernel(const typename T::storage* __restrict__ x, int64_t x_sb,
                                const float* __restrict__ weight, const float* __restrict__ bias,
                                typename T::storage* __restrict__ state, int64_t s_sb, int64_t s_sc,
                                const uint8_t* __restrict__ reset, int64_t r_sb, typename T::storage* __restrict__ y,
                                int channels, bool silu) {
  const int c = blockIdx.x * kConvThreads + threadIdx.x;
  const int b = blockIdx.y;
  if (c >= channels) return;
  typename T::storage* sb = state + b * s_sb + c * s_sc;
  const typename T::storage xv = x[b * x_sb + c];
  const bool fresh = reset != nullptr && reset[b * r_sb] != 0;
  typename T::storage in[W];
  if (fresh) {  // a select, not a product: NaN / inf in the old state stay out
#pragma unroll
    for (int j = 0; j < W - 1; ++j) in[j] = T::from_float(0.0f);
  } else {
#pragma unroll
    for (int j = 0; j < W - 1; ++j) in[j] = sb[j];
  }
  in[W - 1] = xv;
  float acc = bias == nullptr ? 0.0f : bias[c];
#pragma unroll
  for (int j = 0; j < W; ++j) acc += weight[static_cast<int64_t>(c) * W + j] * T::load(in + j);
#pragma unroll
  for (int j = 0; j < W - 1; ++j) sb[j] = in[j + 1];
  y[static_cast<int64_t>(b) * channels + c] = T::from_float(conv_act(acc, silu));
}

#define FTLAB_CONV1D_INSTANTIATE(T, W)                                                                       \
  template __global__ void causal_conv1d_kernel<T, W>(const T::storage*, int64_t, int64_t, const float*,     \
                                                      const float*, const T::storage*, const int32_t*,       \
                                                      T::storage*, T::storage*, int, int, bool);             \
  template __global__ void causal_conv1d_update_kernel<T, W>(const T::storage*, int64_t, const float*,       \
                                                             const float*, T::storage*, int64_t, int64_t,    \
                                                             const uint8_t*, int64_t, T::storage*, int, bool);
#define FTLAB_CONV1D_WIDTHS(T) \
  FTLAB_CONV1D_INSTANTIATE(T, 2) FTLAB_CONV1D_INSTANTIATE(T, 3) FTLAB_CONV1D_INSTANTIATE(T, 4)
FTLAB_CONV1D_WIDTHS(f32_t)
FTLAB_CONV1D_WIDTHS(f16_t)
FTLAB_CONV1D_WIDTHS(bf16_t)

}  // namespace ftlab

// norm_common.h — the pieces of add_rmsnorm's arithmetic (norm.hip) that other kernels repeat bit
// for bit: V-element raw register vectors, their loads, stores and fp32 views, the rounded residual
// add with its sum of squares, and the normed output. A kernel that computes a row's norm the way
// add_rmsnorm_kernel does (kNormThreads threads, the same pieces a thread, the same reduction
// order) gets add_rmsnorm's bits. And what every RMSNorm (these, gated_norm.hip, qk_norm_rope.hip)
// does with a row whose squares overflow fp32 (ftlab/reference/norm.py): a finite |x| >= ~2^64 /
// sqrt(n) makes the sum inf and the factor 0; such a row (the sum inf: the same in every thread
// that reduced it) sums the squares of x * kNormScale again and scales the factor back.
#pragma once
#include "q4_0_common.h"

namespace ftlab {

constexpr int kNormThreads = 256;
constexpr int kNormCache = 4;                   // pieces a thread keeps in registers between passes
constexpr int kNormPartials = kNormThreads / 32;  // one per wave of the smaller wave size
// 2^-80: |x| < 2^128 gives scaled squares below 2^96, any number of them below 2^128 (ftlab.reference.norm)
constexpr float kNormScale = 0x1p-80f;

// 1 / sqrt(mean(x^2) + eps) of a row of n elements whose squares overflowed, from `scaled`: the sum
// of the squares of x * kNormScale (exact: a power of two).
__device__ __forceinline__ float norm_scaled_factor(float scaled, int n, float eps) {
  return (1.0f / port_sqrtf(scaled / static_cast<float>(n) + eps * kNormScale * kNormScale)) * kNormScale;
}

// A wave's sum of v, in every lane (the shuffles of add_rmsnorm_kernel's reduction).
__device__ __forceinline__ float norm_wave_sum(float v) {
#pragma unroll
  for (int m = PORT_WARP_SIZE / 2; m > 0; m >>= 1) v += port_shfl_xor(v, m);
  return v;
}

// The waves' sums in partial[0 .. kNormThreads / PORT_WARP_SIZE), added in order.
__device__ __forceinline__ float norm_partials_sum(const float* partial) {
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormThreads / PORT_WARP_SIZE; ++k) total += partial[k];
  return total;
}

// The sum over the kNormThreads threads of a block (t: the thread's index) of v, add_rmsnorm_kernel's
// reduction through `partial`, after a barrier: every thread has read the partials of a sum before.
__device__ __forceinline__ float norm_block_sum(float v, float* partial, int t) {
  __syncthreads();
  v = norm_wave_sum(v);
  if (t % PORT_WARP_SIZE == 0) partial[t / PORT_WARP_SIZE] = v;
  __syncthreads();
  return norm_partials_sum(partial);
}

// A raw register vector of B bytes (B = 2, 4, 8, 16).
template <int B>
struct norm_raw;
template <>
struct norm_raw<16> {
  typedef bytes16 type;
};
template <>
struct norm_raw<8> {
  typedef bytes8 type;
};
template <>
struct norm_raw<4> {
  typedef bytes4 type;
};
template <>
struct norm_raw<2> {
  typedef bytes2 type;
};

// V consecutive elements of T as raw register vectors: kCount pieces P of at most 16 bytes.
template <typename T, int V>
struct norm_vec {
  typedef typename T::storage S;
  static constexpr int kBytes = V * static_cast<int>(sizeof(S));
  static constexpr int kPiece = kBytes < 16 ? kBytes : 16;
  static constexpr int kCount = kBytes / kPiece;
  static constexpr int kPer = kPiece / static_cast<int>(sizeof(S));  // elements a piece
  typedef typename norm_raw<kPiece>::type P;
};
template <typename T, int V>
using norm_pieces = typename norm_vec<T, V>::P[norm_vec<T, V>::kCount];

// Loads V elements at p (aligned to its piece size).
template <typename T, int V>
__device__ __forceinline__ void norm_fetch(const typename T::storage* p, norm_pieces<T, V>& raw) {
  typedef norm_vec<T, V> N;
#pragma unroll
  for (int c = 0; c < N::kCount; ++c) raw[c] = reinterpret_cast<const typename N::P*>(p)[c];
}

// Stores V elements at p.
template <typename T, int V>
__device__ __forceinline__ void norm_put(typename T::storage* p, const norm_pieces<T, V>& raw) {
  typedef norm_vec<T, V> N;
#pragma unroll
  for (int c = 0; c < N::kCount; ++c) reinterpret_cast<typename N::P*>(p)[c] = raw[c];
}

// The V elements as fp32.
template <typename T, int V>
__device__ __forceinline__ void norm_floats(const norm_pieces<T, V>& raw, float (&v)[V]) {
  typedef norm_vec<T, V> N;
#pragma unroll
  for (int c = 0; c < N::kCount; ++c) {
    typename T::storage e[N::kPer];
    __builtin_memcpy(e, &raw[c], N::kPiece);
#pragma unroll
    for (int i = 0; i < N::kPer; ++i) v[c * N::kPer + i] = T::load(e + i);
  }
}

// v rounded to T, as raw vectors.
template <typename T, int V>
__device__ __forceinline__ void norm_pack(const float (&v)[V], norm_pieces<T, V>& raw) {
  typedef norm_vec<T, V> N;
#pragma unroll
  for (int c = 0; c < N::kCount; ++c) {
    typename T::storage e[N::kPer];
#pragma unroll
    for (int i = 0; i < N::kPer; ++i) e[i] = T::from_float(v[c * N::kPer + i]);
    __builtin_memcpy(&raw[c], e, N::kPiece);
  }
}

// With a residual, x's piece xs becomes s = x + residual rounded to T, stored at s when `store`
// (without a residual, s is x). Returns the sum of the squares of s's elements.
template <typename T, int V>
__device__ __forceinline__ float norm_sum(norm_pieces<T, V>& xs, const norm_pieces<T, V>& rs, typename T::storage* s,
                                          bool residual, bool store = true) {
  float v[V];
  norm_floats<T, V>(xs, v);
  if (residual) {
    float r[V];
    norm_floats<T, V>(rs, r);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] += r[i];
    norm_pack<T, V>(v, xs);
    if (store) norm_put<T, V>(s, xs);
    norm_floats<T, V>(xs, v);
  }
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) ss += v[i] * v[i];
  return ss;
}

// The sum of the squares of s's piece times kNormScale (a row whose squares overflowed).
template <typename T, int V>
__device__ __forceinline__ float norm_scaled_squares(const norm_pieces<T, V>& ss) {
  float v[V];
  norm_floats<T, V>(ss, v);
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float u = v[i] * kNormScale;
    acc += u * u;
  }
  return acc;
}

// The same over a thread's cached pieces t + c * kNormThreads (c < kNormCache) of a row of h.
template <typename T, int V>
__device__ __forceinline__ float norm_cached_scaled_squares(const norm_pieces<T, V> (&xs)[kNormCache], int t, int h) {
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < kNormCache; ++c)
    if (static_cast<int64_t>(t + c * kNormThreads) * V < h) acc += norm_scaled_squares<T, V>(xs[c]);
  return acc;
}

// y's piece: the rounded s times r times the weight, rounded to T.
template <typename T, int V>
__device__ __forceinline__ void norm_make(const norm_pieces<T, V>& ss, const float (&w)[V], float r,
                                          norm_pieces<T, V>& out) {
  float v[V];
  norm_floats<T, V>(ss, v);
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] = v[i] * r * w[i];
  norm_pack<T, V>(v, out);
}

// The same, stored at y.
template <typename T, int V>
__device__ __forceinline__ void norm_out(typename T::storage* y, const norm_pieces<T, V>& ss, const float (&w)[V],
                                         float r) {
  norm_pieces<T, V> out;
  norm_make<T, V>(ss, w, r, out);
  norm_put<T, V>(y, out);
}

}  // namespace ftlab

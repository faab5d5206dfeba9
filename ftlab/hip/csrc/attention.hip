// attention.hip — decode attention: one query token a sequence over its cached positions.
// Contract: ftlab/ops/attention.py; reference: ftlab/reference/attention.py.
//
// Split-K over the positions (flash-decoding). decode_attention_partial_kernel: one block per
// (split, key head, sequence) holds the G = H / KVH query heads that read the key head (scaled
// q in LDS as fp32) and walks its split's live positions a tile of kAttnTile at a time:
//   scores: the tile's key rows staged in LDS by every thread at once (16-byte loads when
//     aligned, all issued before the first store), then threads 2p and 2p + 1 take position p,
//     each every other 8-element piece of the row, for every query head, and add their halves
//     by a shuffle;
//   softmax: one warp per query head (strided), max and sum by shuffles; the running max, sum
//     and rescale factor of each query head kept in LDS;
//   values: the tile's value rows staged the same way, then thread t accumulates columns t,
//     t + kAttnThreads of every query head in registers.
// A tile's global loads are thus two rounds (keys, values), not one per position. It writes the
// running max m, the sum l of exp(s - m) and the unnormalized sums; with one split the output
// itself. decode_attention_combine_kernel: one block per (sequence, query head) merges the splits.
// A split past the sequence's length writes m = -inf, l = 0 and zeros and does nothing else, so
// the grid depends on the cache's size only (graph-capturable). fp32 throughout; the output
// rounded once. Wave-size generic (PORT_WARP_SIZE).
#pragma once
#include "q4_0_common.h"

namespace ftlab {

constexpr int kAttnThreads = 128;
constexpr int kAttnTile = 64;      // positions a tile
constexpr int kAttnMaxG = 8;       // query heads a key head (Qwen3, Qwen3.6, Qwen3-Next: 8)
constexpr int kAttnMaxD = 256;     // head dim
// What a thread holds in registers for its value columns: kAttnMaxG heads (every loop over the
// heads runs all of them, rows past G being zeros: no per-head condition stays live) x D256 (a
// head dim past kAttnThreads) 2 columns, else 1.
template <bool D256>
struct AttnShape {
  static constexpr int kG = kAttnMaxG;
  static constexpr int kDPer = D256 ? kAttnMaxD / kAttnThreads : 1;
};

// The tile's rows of one key / value head staged in LDS: rows of D elements at a stride of the
// row's bytes rounded up to 16, plus 16 (16-byte reads of 8 consecutive rows then fall on distinct
// banks), as many rows as fit (bf16 / fp16 rows of 128: the whole tile of 64).
constexpr int kStageBytes = kAttnTile * (2 * 128 + 16);
constexpr int kStagePieces = (kStageBytes / 16 + kAttnThreads - 1) / kAttnThreads;  // 16-byte pieces a thread

__host__ __device__ constexpr int stage_row_bytes(int d, int elem) { return (d * elem + 15) / 16 * 16 + 16; }

// Rows p0 .. p0 + rows - 1 of a tile (positions t0 + p0 + r; zeros at and past `live`) of the head
// at `base` (position stride `sp`) into `stage`. VEC: 16-byte pieces, every load of a thread issued
// before the first store; else element by element.
template <typename T, bool VEC>
__device__ __forceinline__ void stage_rows(unsigned char* stage, const typename T::storage* base, int64_t sp,
                                           int64_t t0, int p0, int rows, int live, int d, int row_bytes, int tid) {
  using S = typename T::storage;
  if constexpr (VEC) {
    const int per_row = d * static_cast<int>(sizeof(S)) / 16;
    const int total = rows * per_row;
    bytes16 r[kStagePieces];
#pragma unroll
    for (int i = 0; i < kStagePieces; ++i) {
      const int idx = tid + i * kAttnThreads;
      const int row = idx / (per_row > 0 ? per_row : 1), piece = idx - row * per_row;
      r[i] = bytes16{};
      if (idx < total && p0 + row < live) r[i] = reinterpret_cast<const bytes16*>(base + (t0 + p0 + row) * sp)[piece];
    }
#pragma unroll
    for (int i = 0; i < kStagePieces; ++i) {
      const int idx = tid + i * kAttnThreads;
      const int row = idx / (per_row > 0 ? per_row : 1), piece = idx - row * per_row;
      if (idx < total) *reinterpret_cast<bytes16*>(stage + row * row_bytes + 16 * piece) = r[i];
    }
  } else {
    for (int idx = tid; idx < rows * d; idx += kAttnThreads) {
      const int row = idx / d, c = idx - row * d;
      reinterpret_cast<S*>(stage + row * row_bytes)[c] = p0 + row < live ? base[(t0 + p0 + row) * sp + c] : S{};
    }
  }
}

// q [B, H, D] contiguous; k, v [B, S, KVH, D] (sequence strides k_sb / v_sb, position strides
// k_sp / v_sp, heads contiguous); lengths [B] int32, clamped to [0, S].
// ml [B, KVH, splits, G, 2] and acc [B, KVH, splits, G, D] fp32 (splits > 1), else out [B, H, D].
// VEC: k and v 16-byte aligned (base, strides and rows; the launcher checks); G <= kAttnMaxG and
// D <= kAttnThreads * AttnShape<D256>::kDPer.
template <typename T, bool VEC, bool D256>
__global__ void __launch_bounds__(kAttnThreads)
    decode_attention_partial_kernel(const typename T::storage* __restrict__ q, const typename T::storage* __restrict__ k,
                                    const typename T::storage* __restrict__ v, const int32_t* __restrict__ lengths,
                                    float* __restrict__ ml, float* __restrict__ acc_out,
                                    typename T::storage* __restrict__ out, int64_t k_sb, int64_t k_sp, int64_t v_sb,
                                    int64_t v_sp, int s_len, int chunk, float scale, int heads, int kv_heads, int d) {
  using S = typename T::storage;
  constexpr int kG = AttnShape<D256>::kG, kDPer = AttnShape<D256>::kDPer;
  constexpr int kWarps = kAttnThreads / PORT_WARP_SIZE;
  static_assert(kAttnThreads == 2 * kAttnTile, "a thread pair scores each position of a tile");
  __shared__ float qs[kG * kAttnMaxD];
  __shared__ float sc[kG][kAttnTile];
  __shared__ float m_sh[kG], l_sh[kG], rescale[kG];  // running max, sum, this tile's rescale
  __shared__ __attribute__((aligned(16))) unsigned char stage[kStageBytes];
  const int tid = threadIdx.x;
  const int lane = tid % PORT_WARP_SIZE, warp = tid / PORT_WARP_SIZE;
  const int split = blockIdx.x, kh = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int splits = gridDim.x;
  const int g_n = heads / kv_heads;
  const int row_bytes = stage_row_bytes(d, static_cast<int>(sizeof(S)));
  const int stage_rows_n = kStageBytes / row_bytes < kAttnTile ? kStageBytes / row_bytes : kAttnTile;
  int64_t n = lengths[b];
  n = n < 0 ? 0 : (n > s_len ? s_len : n);
  const int64_t start = static_cast<int64_t>(split) * chunk;
  const int64_t stop = start + chunk < n ? start + chunk : n;

  for (int i = tid; i < kG * d; i += kAttnThreads)  // rows past G: zeros
    qs[i] = i < g_n * d ? T::load(q + (b * heads + static_cast<int64_t>(kh) * g_n) * d + i) * scale : 0.0f;
  for (int g = tid; g < kG; g += kAttnThreads) {
    m_sh[g] = -__builtin_inff();
    l_sh[g] = 0.0f;
    rescale[g] = 1.0f;  // rows past G keep it
  }
  float acc[kG][kDPer];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int j = 0; j < kDPer; ++j) acc[g][j] = 0.0f;
  }
  __syncthreads();

  const S* kb = k + b * k_sb + static_cast<int64_t>(kh) * d;
  const S* vb = v + b * v_sb + static_cast<int64_t>(kh) * d;
  for (int64_t t0 = start; t0 < stop; t0 += kAttnTile) {
    const int tile = static_cast<int>(stop - t0 < kAttnTile ? stop - t0 : kAttnTile);
    // scores: the key rows staged in LDS (all loads at once), then thread pair (2p, 2p + 1) takes
    // position p, each every other 8-element piece of the row, for every query head
    const int p = tid / 2, part = tid % 2;
    float dot[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) dot[g] = 0.0f;
    for (int p0 = 0; p0 < tile; p0 += stage_rows_n) {
      const int rows = tile - p0 < stage_rows_n ? tile - p0 : stage_rows_n;
      stage_rows<T, VEC>(stage, kb, k_sp, t0, p0, rows, tile, d, row_bytes, tid);
      __syncthreads();
      if (p >= p0 && p < p0 + rows) {
        const S* kr = reinterpret_cast<const S*>(stage + (p - p0) * row_bytes);
        for (int c = 8 * part; c < d; c += 16) {
          float kv[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) kv[e] = c + e < d ? T::load(kr + c + e) : 0.0f;
#pragma unroll
          for (int g = 0; g < kG; ++g) {
#pragma unroll
            for (int e = 0; e < 8; ++e) dot[g] += c + e < d ? qs[g * d + c + e] * kv[e] : 0.0f;
          }
        }
      }
      __syncthreads();  // the stage is rewritten next
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      dot[g] += port_shfl_xor(dot[g], 1);
      if (g % 2 == part) sc[g][p] = p < tile ? dot[g] : -__builtin_inff();
    }
    __syncthreads();
    for (int g = warp; g < g_n; g += kWarps) {  // softmax of head g on one warp
      float mx = -__builtin_inff();
      for (int pp = lane; pp < kAttnTile; pp += PORT_WARP_SIZE) mx = __builtin_fmaxf(mx, sc[g][pp]);
#pragma unroll
      for (int off = PORT_WARP_SIZE / 2; off > 0; off >>= 1) mx = __builtin_fmaxf(mx, port_shfl_xor(mx, off));
      const float m_old = m_sh[g];
      const float m_new = __builtin_fmaxf(m_old, mx);  // finite: the tile holds a live position
      float sum = 0.0f;
      for (int pp = lane; pp < kAttnTile; pp += PORT_WARP_SIZE) {
        const float e = port_expf(sc[g][pp] - m_new);  // exp(-inf) = 0 past the tile
        sc[g][pp] = e;
        sum += e;
      }
#pragma unroll
      for (int off = PORT_WARP_SIZE / 2; off > 0; off >>= 1) sum += port_shfl_xor(sum, off);
      port_sync_group();  // every lane has read m_sh[g] before lane 0 rewrites it
      if (lane == 0) {
        const float alpha = port_expf(m_old - m_new);  // the first tile: exp(-inf) = 0
        rescale[g] = alpha;
        l_sh[g] = l_sh[g] * alpha + sum;
        m_sh[g] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      const float alpha = rescale[g];
#pragma unroll
      for (int j = 0; j < kDPer; ++j) acc[g][j] *= alpha;
    }
    // values: the value rows staged in LDS, then thread t accumulates columns t, t + kAttnThreads
    for (int p0 = 0; p0 < tile; p0 += stage_rows_n) {
      const int rows = tile - p0 < stage_rows_n ? tile - p0 : stage_rows_n;
      stage_rows<T, VEC>(stage, vb, v_sp, t0, p0, rows, tile, d, row_bytes, tid);
      __syncthreads();
#pragma unroll 2
      for (int r = 0; r < rows; ++r) {
        const S* vr = reinterpret_cast<const S*>(stage + r * row_bytes);
#pragma unroll
        for (int j = 0; j < kDPer; ++j) {
          const int col = tid + j * kAttnThreads;
          const float val = col < d ? T::load(vr + col) : 0.0f;
#pragma unroll
          for (int g = 0; g < kG; ++g) acc[g][j] += sc[g][p0 + r] * val;  // rows past G: 0 * val
        }
      }
      __syncthreads();  // the stage (and, after the last, sc and rescale) are rewritten next
    }
  }

  if (splits == 1) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g >= g_n) continue;
      const float l = l_sh[g];
      const float inv = l != 0.0f ? 1.0f / l : 0.0f;  // l = 0: no position (NaN stays NaN)
      S* o = out + (b * heads + static_cast<int64_t>(kh) * g_n + g) * d;
#pragma unroll
      for (int j = 0; j < kDPer; ++j) {
        const int col = tid + j * kAttnThreads;
        if (col < d) o[col] = T::from_float(acc[g][j] * inv);
      }
    }
    return;
  }
  const int64_t row0 = ((b * kv_heads + kh) * splits + split) * g_n;
  for (int g = tid; g < g_n; g += kAttnThreads) {
    ml[2 * (row0 + g)] = m_sh[g];
    ml[2 * (row0 + g) + 1] = l_sh[g];
  }
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (g >= g_n) continue;
#pragma unroll
    for (int j = 0; j < kDPer; ++j) {
      const int col = tid + j * kAttnThreads;
      if (col < d) acc_out[(row0 + g) * d + col] = acc[g][j];
    }
  }
}

// out[b, h] = sum_s w_s acc_s / sum_s w_s l_s, w_s = exp(m_s - max m) (0 for a split without
// positions; all of them: zeros). One block per (sequence, query head), threads over D.
template <typename T>
__global__ void __launch_bounds__(kAttnThreads)
    decode_attention_combine_kernel(const float* __restrict__ ml, const float* __restrict__ acc,
                                    typename T::storage* __restrict__ out, int heads, int kv_heads, int d,
                                    int splits) {
  constexpr int kDPer = kAttnMaxD / kAttnThreads;
  const int64_t b = blockIdx.x;
  const int h = blockIdx.y;
  const int g_n = heads / kv_heads, kh = h / g_n, g = h % g_n;
  const int64_t row0 = (b * kv_heads + kh) * splits * g_n + g;  // split s: row0 + s * g_n
  // every split's row is written (zeros where it had no position): loads without branches, so
  // the unrolled loops keep several in flight
  float mx = -__builtin_inff();
#pragma unroll 8
  for (int s = 0; s < splits; ++s) {
    const int64_t row = row0 + static_cast<int64_t>(s) * g_n;
    const float m = ml[2 * row], l = ml[2 * row + 1];
    mx = l != 0.0f ? __builtin_fmaxf(mx, m) : mx;
  }
  float total = 0.0f;
  float o[kDPer];
#pragma unroll
  for (int j = 0; j < kDPer; ++j) o[j] = 0.0f;
#pragma unroll 8
  for (int s = 0; s < splits; ++s) {
    const int64_t row = row0 + static_cast<int64_t>(s) * g_n;
    const float l = ml[2 * row + 1];
    const float w = l != 0.0f ? port_expf(ml[2 * row] - mx) : 0.0f;  // l = 0: no position
    total += w * l;
#pragma unroll
    for (int j = 0; j < kDPer; ++j) {
      const int col = threadIdx.x + j * kAttnThreads;
      o[j] += col < d ? w * acc[row * d + col] : 0.0f;
    }
  }
  const float inv = total != 0.0f ? 1.0f / total : 0.0f;
#pragma unroll
  for (int j = 0; j < kDPer; ++j) {
    const int col = threadIdx.x + j * kAttnThreads;
    if (col < d) out[(b * heads + h) * d + col] = T::from_float(o[j] * inv);
  }
}

#define FTLAB_ATTENTION_PARTIAL(T, VEC, D256)                                                                       \
  template __global__ void decode_attention_partial_kernel<T, VEC, D256>(                                         \
      const T::storage*, const T::storage*, const T::storage*, const int32_t*, float*, float*, T::storage*, int64_t, \
      int64_t, int64_t, int64_t, int, int, float, int, int, int);
#define FTLAB_ATTENTION_INSTANTIATE(T)                                                                        \
  FTLAB_ATTENTION_PARTIAL(T, true, false) FTLAB_ATTENTION_PARTIAL(T, true, true)                               \
  FTLAB_ATTENTION_PARTIAL(T, false, false) FTLAB_ATTENTION_PARTIAL(T, false, true)                             \
  template __global__ void decode_attention_combine_kernel<T>(const float*, const float*, T::storage*, int, int, \
                                                              int, int);
FTLAB_ATTENTION_INSTANTIATE(f32_t)
FTLAB_ATTENTION_INSTANTIATE(f16_t)
FTLAB_ATTENTION_INSTANTIATE(bf16_t)

}  // namespace ftlab

// attention_tiles.hip — decode attention for 16-bit caches of head dim 128 or 256 in one
// launch, the key and value rows held in registers. Contract: ftlab/ops/attention.py;
// reference: ftlab/reference/attention.py. The general kernels (fp32, any head dim, unaligned
// rows) are in attention.hip.
//
// One block of kTileThreads per (split, key head, sequence); a split is `chunk` positions, walked
// a tile of kTileRows(D) positions at a time -- or, where a sequence's live positions would make
// more than `want` splits of `chunk`, as many whole tiles a split as keep them to `want` (the grid
// is the cache's: splits past a sequence's live ones return at once; `want` from the launcher,
// so that the blocks of all sequences about fill the GPU once). A row of D elements is read by
// LP = D / 8 lanes, 16 bytes each, so the block's 128 threads are RG = 128 / LP row groups and a
// thread holds R (4 or 2) rows of a tile: its key and value pieces are all loaded at once (2R
// loads in flight a thread), before any arithmetic.
//   scores: the thread's 8 scaled query elements of each of the G <= 8 query heads sit in registers;
//     a row's 8 partial dots are summed over its LP lanes by halving exchanges (4, 2, 1 values,
//     then whole sums): 8 shuffles a row for D = 128, after which a lane holds one head's score;
//   softmax: one warp a query head over the tile (running max, sum and rescale in LDS);
//   values: acc[g][e] += p[g][row] * v[row][e] on the rows the thread holds; the row groups' sums
//     meet in LDS once, after the last tile.
// With one live split the block writes the output. Otherwise it writes its running max m, sum l and
// unnormalised sums to the workspaces, counts itself done on the (sequence, key head) counter, and
// the last block to count merges the splits (w_s = exp(m_s - max m) over the splits with l_s > 0)
// and resets the counter to 0. Splits past the sequence's length return at once: the grid depends
// on the cache's size only (graph-capturable); a sequence of length 0 gets zeros from split 0.
// Launched programmatically dependent (launch::launch_pdl): before port_pdl_wait() the block only
// asks the L2 for its first tile's key and value lines. fp32 throughout, the output rounded once;
// on request the block writing an output also writes its Q8_1 (what the o_proj matvec after takes).
#pragma once
#include "q4_0_common.h"

namespace ftlab {

constexpr int kTileThreads = 128;
constexpr int kTileMaxSplits = 64;
constexpr int kTileMaxG = 8;

// Positions a tile: 128 threads, d / 8 lanes a row, r rows a thread.
__host__ __device__ constexpr int tile_rows(int d, int r) { return kTileThreads / (d / 8) * r; }

template <typename T>
__device__ __forceinline__ void unpack8(const bytes16& raw, float out[8]) {
  typename T::storage e[8];
  __builtin_memcpy(e, &raw, 16);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = T::load(&e[i]);
}

// Writes element idx of out (value y, rounded once) and, when oq is given, its Q8_1 (out viewed
// [B, H * D], blocks of 32): the 32 consecutive elements of a block are 32 consecutive lanes, which
// all call this (the condition is uniform over them). hip's quantize_q8_1 arithmetic on the rounded
// value (d = amax / 127, q = round(x / d) half away from zero, s = d * sum(q)), bit for bit.
template <typename T>
__device__ __forceinline__ void write_out(typename T::storage* out, int64_t idx, float y, int8_t* oq, float* od,
                                          float* os) {
  const typename T::storage r = T::from_float(y);
  out[idx] = r;
  if (oq == nullptr) return;
  const float x = T::load(&r);
  float amax = __builtin_fmaxf(0.0f, __builtin_fabsf(x));  // from 0, as q8_1_quarter: a NaN block gives d = 0
#pragma unroll
  for (int off = kQK / 2; off > 0; off >>= 1) amax = __builtin_fmaxf(amax, port_shfl_xor(amax, off));
  const float dd = port_div_rn(amax, 127.0f);
  int qi = amax == 0.0f ? 0 : static_cast<int>(round_half_away(port_div_rn(x, dd)));
  oq[idx] = static_cast<int8_t>(qi);
#pragma unroll
  for (int off = kQK / 2; off > 0; off >>= 1) qi += port_shfl_xor(qi, off);
  if (idx % kQK == 0) {
    od[idx / kQK] = dd;
    os[idx / kQK] = dd * static_cast<float>(qi);
  }
}

// q [B, H, D] contiguous; k, v [B, S, KVH, D] 16-byte aligned rows (sequence strides k_sb / v_sb,
// position strides k_sp / v_sp); lengths [B] int32, clamped to [0, S]. ml [B, KVH, splits, G, 2],
// acc [B, KVH, splits, G, D] fp32 workspaces, counters [B * KVH] zeros (left zeros); out [B, H, D];
// oq [B, H * D] int8, od, os [B, H * D / 32] fp32: out's Q8_1, or nullptr.
template <typename T, int D, int R>
__global__ void __launch_bounds__(kTileThreads)
    decode_attention_tiles_kernel(const typename T::storage* __restrict__ q, const typename T::storage* __restrict__ k,
                                  const typename T::storage* __restrict__ v, const int32_t* __restrict__ lengths,
                                  float* ml, float* acc_ws, uint32_t* __restrict__ counters,
                                  typename T::storage* __restrict__ out, int64_t k_sb, int64_t k_sp, int64_t v_sb,
                                  int64_t v_sp, int s_len, int chunk, int want, float scale, int heads, int kv_heads,
                                  int8_t* __restrict__ oq, float* __restrict__ od, float* __restrict__ os) {
  using S = typename T::storage;
  constexpr int LP = D / 8, RG = kTileThreads / LP, TP = RG * R, G = kTileMaxG;
  constexpr int kWarps = kTileThreads / PORT_WARP_SIZE;
  static_assert(LP >= 16 && LP <= PORT_WARP_SIZE && (LP & (LP - 1)) == 0, "a row's lanes: 16 .. a warp (head dim 64 spilled on the AMD targets)");
  __shared__ float sc[G][TP];
  __shared__ float m_sh[G], l_sh[G], alpha_sh[G];
  __shared__ __attribute__((aligned(16))) float red[RG][G * D];
  __shared__ float wsh[kTileMaxSplits][G];
  __shared__ int last;
  const int tid = threadIdx.x, lane = tid % PORT_WARP_SIZE, warp = tid / PORT_WARP_SIZE;
  const int piece = tid % LP, rg = tid / LP;
  const int split = blockIdx.x, kh = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int splits = gridDim.x;
  const int g_n = heads / kv_heads;
  const S* kb = k + b * k_sb + static_cast<int64_t>(kh) * D + 8 * piece;
  const S* vb = v + b * v_sb + static_cast<int64_t>(kh) * D + 8 * piece;
  const int64_t start0 = static_cast<int64_t>(split) * chunk;  // the split's start under `chunk`
  // the first tile's lines, while the kernel before finishes (where the split cannot move: split 0,
  // or no sequence's split can grow)
  if (PORT_HAS_L2_PREFETCH && (split == 0 || want >= splits) && piece % 8 == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t p = start0 + rg + r * RG;
      if (p < s_len) {
        port_prefetch_l2(kb + p * k_sp);
        port_prefetch_l2(vb + p * v_sp);
      }
    }
  }
  port_pdl_wait();
  port_pdl_trigger();
  // every load of the first tile at once: q, the length, the key and value rows from the split's
  // start under `chunk` (up to the cache's end: rows past the split's live positions are masked
  // below); loaded again from the later start where the sequence's splits grow
  bytes16 qr[G], kr[R], vr[R];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    qr[g] = bytes16{};
    if (g < g_n)
      qr[g] = *reinterpret_cast<const bytes16*>(q + (b * heads + static_cast<int64_t>(kh) * g_n + g) * D + 8 * piece);
  }
  auto load_rows = [&](int64_t from) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t p = from + rg + r * RG;
      kr[r] = bytes16{};
      vr[r] = bytes16{};
      if (p < s_len) {
        kr[r] = *reinterpret_cast<const bytes16*>(kb + p * k_sp);
        vr[r] = *reinterpret_cast<const bytes16*>(vb + p * v_sp);
      }
    }
  };
  load_rows(start0);
  int64_t n = lengths[b];
  n = n < 0 ? 0 : (n > s_len ? s_len : n);
  // the sequence's split: `chunk`, or as many whole tiles as keep its live splits to `want`
  const int64_t per = ((n + TP - 1) / TP + want - 1) / want;  // 64 bits: n may be near 2^31
  const int64_t span = per * TP > chunk ? per * TP : chunk;
  const int live = n == 0 ? 1 : static_cast<int>((n + span - 1) / span);  // <= splits: span >= chunk
  if (split >= live) return;
  const int64_t start = static_cast<int64_t>(split) * span;
  if (start != start0) load_rows(start);
  const int64_t stop = start + span < n ? start + span : n;

  float qf[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    unpack8<T>(qr[g], qf[g]);  // heads past G: zeros
#pragma unroll
    for (int e = 0; e < 8; ++e) qf[g][e] *= scale;
  }
  if (tid < G) {
    m_sh[tid] = -__builtin_inff();
    l_sh[tid] = 0.0f;
    alpha_sh[tid] = 1.0f;
  }
  float acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }
  // the lane's head after the halving exchanges, and whether it writes that head's score
  const bool h4 = piece & (LP / 2), h2 = piece & (LP / 4), h1 = piece & (LP / 8);
  const int head = (h4 ? 4 : 0) + (h2 ? 2 : 0) + (h1 ? 1 : 0);
  const bool writer = piece % (LP / 8) == 0;
  __syncthreads();

  for (int64_t t0 = start; t0 < stop; t0 += TP) {
    const int64_t t1 = t0 + TP;  // the next tile: its rows are loaded while this one is used
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float kf[8], dot[G];
      unpack8<T>(kr[r], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        dot[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot[g] += qf[g][e] * kf[e];
      }
      float d4[4], d2[2];
#pragma unroll
      for (int i = 0; i < 4; ++i) d4[i] = (h4 ? dot[i + 4] : dot[i]) + port_shfl_xor(h4 ? dot[i] : dot[i + 4], LP / 2);
#pragma unroll
      for (int i = 0; i < 2; ++i) d2[i] = (h2 ? d4[i + 2] : d4[i]) + port_shfl_xor(h2 ? d4[i] : d4[i + 2], LP / 4);
      float s = (h1 ? d2[1] : d2[0]) + port_shfl_xor(h1 ? d2[0] : d2[1], LP / 8);
#pragma unroll
      for (int m = LP / 16; m >= 1; m >>= 1) s += port_shfl_xor(s, m);
      const int row = rg + r * RG;
      if (writer) sc[head][row] = t0 + row < stop ? s : -__builtin_inff();
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {  // the next tile's key rows, in flight meanwhile
      const int64_t p = t1 + rg + r * RG;
      kr[r] = bytes16{};
      if (p < stop) kr[r] = *reinterpret_cast<const bytes16*>(kb + p * k_sp);
    }
    __syncthreads();
    for (int g = warp; g < g_n; g += kWarps) {  // softmax of head g on one warp
      float mx = -__builtin_inff();
      for (int p = lane; p < TP; p += PORT_WARP_SIZE) mx = __builtin_fmaxf(mx, sc[g][p]);
#pragma unroll
      for (int off = PORT_WARP_SIZE / 2; off > 0; off >>= 1) mx = __builtin_fmaxf(mx, port_shfl_xor(mx, off));
      const float m_old = m_sh[g];
      const float m_new = __builtin_fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int p = lane; p < TP; p += PORT_WARP_SIZE) {
        const float e = port_expf(sc[g][p] - m_new);  // exp(-inf) = 0 past the tile
        sc[g][p] = e;
        sum += e;
      }
#pragma unroll
      for (int off = PORT_WARP_SIZE / 2; off > 0; off >>= 1) sum += port_shfl_xor(sum, off);
      port_sync_group();  // every lane has read m_sh[g] before lane 0 rewrites it
      if (lane == 0) {
        const float alpha = port_expf(m_old - m_new);  // the first tile: exp(-inf) = 0
        alpha_sh[g] = alpha;
        l_sh[g] = l_sh[g] * alpha + sum;
        m_sh[g] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g >= g_n) continue;
      const float alpha = alpha_sh[g];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= alpha;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float vf[8];
      const int row = rg + r * RG;
      unpack8<T>(t0 + row < stop ? vr[r] : bytes16{}, vf);  // a row past the live ones may hold NaN
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (g >= g_n) continue;
        const float p = sc[g][row];  // 0 past the tile (its value row is zeros)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += p * vf[e];
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {  // the next tile's value rows
      const int64_t p = t1 + rg + r * RG;
      vr[r] = bytes16{};
      if (p < stop) vr[r] = *reinterpret_cast<const bytes16*>(vb + p * v_sp);
    }
    __syncthreads();  // sc and alpha_sh are rewritten by the next tile
  }

  // the row groups' sums meet in LDS
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g >= g_n) continue;
#pragma unroll
    for (int e = 0; e < 8; ++e) red[rg][g * D + 8 * piece + e] = acc[g][e];
  }
  __syncthreads();
  constexpr int kOutPer = G * D / kTileThreads;
  float total[kOutPer];
#pragma unroll
  for (int i = 0; i < kOutPer; ++i) {
    const int o = tid + i * kTileThreads;
    total[i] = 0.0f;
    if (o < g_n * D) {
#pragma unroll
      for (int r = 0; r < RG; ++r) total[i] += red[r][o];
    }
  }
  const int64_t out_row0 = b * heads + static_cast<int64_t>(kh) * g_n;  // out row of query head g: + g
  if (live == 1) {
#pragma unroll
    for (int i = 0; i < kOutPer; ++i) {
      const int o = tid + i * kTileThreads;
      if (o >= g_n * D) continue;
      const float l = l_sh[o / D];
      write_out<T>(out, out_row0 * D + o, total[i] * (l != 0.0f ? 1.0f / l : 0.0f), oq, od, os);  // l = 0: no position
    }
    return;
  }
  const int64_t ws_row0 = ((b * kv_heads + kh) * splits + split) * g_n;  // workspace row of head g: + g
  if (tid < g_n) {
    ml[2 * (ws_row0 + tid)] = m_sh[tid];
    ml[2 * (ws_row0 + tid) + 1] = l_sh[tid];
  }
#pragma unroll
  for (int i = 0; i < kOutPer; ++i) {
    const int o = tid + i * kTileThreads;
    if (o < g_n * D) acc_ws[ws_row0 * D + o] = total[i];
  }
  port_fence_device();  // this block's partial results are visible before it counts
  __syncthreads();
  uint32_t* counter = counters + b * kv_heads + kh;
  if (tid == 0) {
    last = port_atomic_add(counter, 1u) == static_cast<uint32_t>(live - 1);
    if (last) port_fence_device();
  }
  __syncthreads();
  if (!last) return;
  port_fence_device();
  // the merge: every live split's m and l, then the weighted sums (written by other blocks: from the L2)
  const int64_t head0 = (b * kv_heads + kh) * splits * g_n;  // split s, head g: head0 + s * g_n + g
  for (int g = warp; g < g_n; g += kWarps) {
    float m_s[kTileMaxSplits / PORT_WARP_SIZE], l_s[kTileMaxSplits / PORT_WARP_SIZE];
    float mx = -__builtin_inff();
#pragma unroll
    for (int i = 0; i < kTileMaxSplits / PORT_WARP_SIZE; ++i) {
      const int s = lane + i * PORT_WARP_SIZE;
      const int64_t row = head0 + static_cast<int64_t>(s) * g_n + g;
      m_s[i] = s < live ? port_load_l2(ml + 2 * row) : 0.0f;
      l_s[i] = s < live ? port_load_l2(ml + 2 * row + 1) : 0.0f;
      if (l_s[i] != 0.0f) mx = __builtin_fmaxf(mx, m_s[i]);
    }
#pragma unroll
    for (int off = PORT_WARP_SIZE / 2; off > 0; off >>= 1) mx = __builtin_fmaxf(mx, port_shfl_xor(mx, off));
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < kTileMaxSplits / PORT_WARP_SIZE; ++i) {
      const int s = lane + i * PORT_WARP_SIZE;
      const float w = l_s[i] != 0.0f ? port_expf(m_s[i] - mx) : 0.0f;  // l = 0: no position
      wsh[s][g] = w;
      tot += w * l_s[i];
    }
#pragma unroll
    for (int off = PORT_WARP_SIZE / 2; off > 0; off >>= 1) tot += port_shfl_xor(tot, off);
    if (lane == 0) l_sh[g] = tot;
  }
  __syncthreads();
  float sum[kOutPer];
#pragma unroll
  for (int i = 0; i < kOutPer; ++i) sum[i] = 0.0f;
#pragma unroll 4
  for (int s = 0; s < live; ++s) {  // four splits' loads in flight at once
    const float* row = acc_ws + (head0 + static_cast<int64_t>(s) * g_n) * D;
#pragma unroll
    for (int i = 0; i < kOutPer; ++i) {
      const int o = tid + i * kTileThreads;
      if (o < g_n * D) sum[i] += wsh[s][o / D] * port_load_l2(row + o);
    }
  }
#pragma unroll
  for (int i = 0; i < kOutPer; ++i) {
    const int o = tid + i * kTileThreads;
    if (o >= g_n * D) continue;
    const float l = l_sh[o / D];
    write_out<T>(out, out_row0 * D + o, sum[i] * (l != 0.0f ? 1.0f / l : 0.0f), oq, od, os);
  }
  if (tid == 0) port_atomic_add(counter, 0u - static_cast<uint32_t>(live));  // back to 0: every block has counted
}

#define FTLAB_ATTENTION_TILES_DR(T, D, R)                                                                          \
  template __global__ void decode_attention_tiles_kernel<T, D, R>(                                              \
      const T::storage*, const T::storage*, const T::storage*, const int32_t*, float*, float*, uint32_t*,        \
      T::storage*, int64_t, int64_t, int64_t, int64_t, int, int, int, float, int, int, int8_t*, float*, float*);
#define FTLAB_ATTENTION_TILES(T)                                                                                  \
  FTLAB_ATTENTION_TILES_DR(T, 128, 4) FTLAB_ATTENTION_TILES_DR(T, 256, 4) FTLAB_ATTENTION_TILES_DR(T, 128, 2)   \
  FTLAB_ATTENTION_TILES_DR(T, 256, 2)
FTLAB_ATTENTION_TILES(f16_t)
FTLAB_ATTENTION_TILES(bf16_t)

}  // namespace ftlab

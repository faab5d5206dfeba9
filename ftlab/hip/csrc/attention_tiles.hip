// attention_tiles.hip — decode attention for 16-bit caches of head dim 128 or 256 in one
// launch, the key and value rows held in registers. Contract: ftlab/ops/attention.py;
// reference: ftlab/reference/attention.py. The general kernels (fp32, any head dim, unaligned
// rows) are in attention.hip.
//
// One block of kTileThreads per (key head, sequence, split); a split is `chunk` positions, walked
// a tile of TP positions at a time -- or, where a sequence's live positions would make more than
// `want` splits of `chunk`, as many whole tiles a split as keep them to `want` (the grid is the
// cache's: splits past a sequence's live ones return at once; `want` from the launcher, so that the
// blocks of all sequences about fill the GPU once). A row of D elements is read by LP = 32 lanes,
// EL = D / 32 elements (8 or 16 bytes) each, so the block's 128 threads are RG = 4 row groups, and
// row group rg takes rows rg, rg + 4, ... of a tile: R = TP / 4 rows a thread (on 64-wide waves
// the loop walks half tiles, TW = TP / 2, where that would be 8 rows), its key and value
// pieces all loaded at once (2R loads in flight a thread), before any arithmetic. A row group runs
// on its own through the split (no block barrier in the loop):
//   scores: the thread's EL scaled query elements of each of the G <= 8 query heads sit in
//     registers; a row's 8 partial dots are summed over the 32 lanes by halving exchanges (4, 2, 1
//     values, then whole sums): 9 shuffles a row, after which every lane holds one head's score;
//   softmax: a lane keeps its head's running max m and sum l over its group's rows (registers);
//     the tile's weights p and the rescale alpha of every head go through LDS to the group's lanes;
//   values: acc[g][e] = alpha[g] * acc[g][e] + sum over the group's rows of p[g][row] * v[row][e].
// After the split, the 4 groups meet in LDS: per head w_rg = exp(m_rg - max m) over the groups with
// l_rg > 0, l = sum w_rg l_rg, sums = sum w_rg acc_rg, in a fixed order.
// With one live split the block writes the output. Otherwise it writes its max m, sum l and
// unnormalised sums to the workspaces, counts itself done on the (sequence, key head) counter, and
// the last block to count merges the splits (w_s = exp(m_s - max m) over the splits with l_s != 0:
// a NaN sum is kept, so a NaN reaches the output) and resets the counter to 0. Splits past the
// sequence's length return at once: the grid depends on the cache's size only (graph-capturable); a
// sequence of length 0 gets zeros from split 0. Launched programmatically dependent
// (launch::launch_pdl): before port_pdl_wait() the block only asks the L2 for its first tile's key
// and value lines. fp32 throughout, the output rounded once; on request the block writing an output
// also writes its Q8_1 (what the o_proj matvec after takes).
#pragma once
#include "norm_common.h"  // norm_raw: raw register vectors

namespace ftlab {

constexpr int kTileThreads = 128;
constexpr int kTileMaxSplits = 64;
constexpr int kTileMaxG = 8;
constexpr int kTileLanes = 32;  // lanes a row

// Positions a tile for `r`, the launcher's rows a thread (2 or 4): the positions 128 threads hold
// at 8 elements a thread a row, r rows each (head dim 128: 32 or 16; 256: 16 or 8).
__host__ __device__ constexpr int tile_rows(int d, int r) { return kTileThreads / (d / 8) * r; }

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

// A lane's EL elements of a row (one raw register vector of 2 EL bytes, norm_common.h) as fp32.
template <typename T, int EL>
__device__ __forceinline__ void unpack(const typename norm_raw<2 * EL>::type& raw, float out[EL]) {
  typename T::storage e[EL];
  __builtin_memcpy(e, &raw, 2 * EL);
#pragma unroll
  for (int i = 0; i < EL; ++i) out[i] = T::load(&e[i]);
}

// b where the mask m is all ones, else a (m all ones or zeros): a bitwise select, which the compilers
// keep as one instruction (v_bfi / lop3) where a ?: on the lane's bits becomes an indexed pick over
// the row's 8 dots on the AMD targets (and their masks spill scalar registers)
__device__ __forceinline__ float pick(uint32_t m, float a, float b) {
  return port_bits_to_float((port_float_to_bits(a) & ~m) | (port_float_to_bits(b) & m));
}

// 1 / l for the softmax's sum l over a sequence of n live positions: l = 0 is no position (zeros)
// where n = 0, and every live score -inf (NaN, as the reference's softmax) where n > 0 -- a finite
// score makes l >= 1
__device__ __forceinline__ float inv_sum(float l, int64_t n) {
  return l != 0.0f ? 1.0f / l : (n > 0 ? port_bits_to_float(0x7fc00000u) : 0.0f);
}

// 8 floats from 16-byte aligned LDS, two 16-byte reads (the same address on every lane: a broadcast).
__device__ __forceinline__ void lds_load8(const float* src, float out[8]) {
  uint32_t u[8];
  words_of(reinterpret_cast<const bytes16*>(src)[0], u);
  words_of(reinterpret_cast<const bytes16*>(src)[1], u + 4);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = port_bits_to_float(u[i]);
}

// q [B, H, D] contiguous; k, v [B, S, KVH, D] 16-byte aligned rows (sequence strides
// k_sb / v_sb, position strides k_sp / v_sp); lengths [B] int32, clamped to [0, S]. ml [B, KVH,
// splits, G, 2], acc [B, KVH, splits, G, D] fp32 workspaces, counters [B * KVH] zeros (left zeros);
// out [B, H, D]; oq [B, H * D] int8, od, os [B, H * D / 32] fp32: out's Q8_1, or nullptr. TP: the
// positions of a tile (a multiple of the block's row groups).
// nvcc: at least 3 blocks a multiprocessor at head dim 128 (168 registers, no spills; left to
// itself it takes ~180 and fits 2); head dim 256 keeps its 255 (2 blocks; asked for 3, it spills)
#if defined(PORT_CUDA)
#define FTLAB_TILES_BOUNDS __launch_bounds__(kTileThreads, D == 128 ? 3 : 1)
#else
#define FTLAB_TILES_BOUNDS __launch_bounds__(kTileThreads)
#endif

template <typename T, int D, int TP>
__global__ void FTLAB_TILES_BOUNDS
    decode_attention_tiles_kernel(const typename T::storage* __restrict__ q, const typename T::storage* __restrict__ k,
                                  const typename T::storage* __restrict__ v, const int32_t* __restrict__ lengths,
                                  float* ml, float* acc_ws, uint32_t* __restrict__ counters,
                                  typename T::storage* __restrict__ out, int64_t k_sb, int64_t k_sp, int64_t v_sb,
                                  int64_t v_sp, int s_len, int chunk, int want, float scale, int heads, int kv_heads,
                                  int8_t* __restrict__ oq, float* __restrict__ od, float* __restrict__ os) {
  using S = typename T::storage;
  using Raw = typename norm_raw<2 * (D / kTileLanes)>::type;
  // the loop walks steps of TW positions: the tile, or half of it on the 64-wide waves where 8 rows
  // a thread spill (a split of whole tiles is whole half tiles; the split plan counts in tiles)
  constexpr int TW = PORT_WARP_SIZE == 64 && TP / (kTileThreads / kTileLanes) > 4 ? TP / 2 : TP;
  constexpr int LP = kTileLanes, EL = D / LP, RG = kTileThreads / LP, R = TW / RG, G = kTileMaxG;
  constexpr int kLineLanes = 128 / (2 * EL);  // lanes of a row a 128-byte line
  static_assert(EL == 4 || EL == 8, "head dim 128 or 256");
  static_assert(TP % TW == 0 && TW % RG == 0 && R >= 1, "a step: whole rows for every row group");
  static_assert(LP <= PORT_WARP_SIZE, "a row group within a warp");
  __shared__ __attribute__((aligned(16))) float pb[RG][R + 1][G];  // a row group's p of each row, then alpha
  __shared__ __attribute__((aligned(16))) float red[RG][G * D];
  __shared__ float m_rg[RG][G], l_rg[RG][G], w_rg[RG][G], l_sh[G];
  __shared__ float wsh[kTileMaxSplits][G];
  __shared__ int last;
  const int tid = threadIdx.x, lane = tid % PORT_WARP_SIZE, warp = tid / PORT_WARP_SIZE;
  constexpr int kWarps = kTileThreads / PORT_WARP_SIZE;
  const int piece = tid % LP, rg = tid / LP;
  // grid (key heads, sequences, splits): blocks start x fastest, so every sequence's live splits
  // (the low ones) start before any sequence's dead ones
  const int kh = blockIdx.x, split = blockIdx.z;
  const int64_t b = blockIdx.y;
  const int splits = gridDim.z;
  const int g_n = heads / kv_heads;
  const S* kb = k + b * k_sb + static_cast<int64_t>(kh) * D + EL * piece;
  const S* vb = v + b * v_sb + static_cast<int64_t>(kh) * D + EL * piece;
  const int64_t start0 = static_cast<int64_t>(split) * chunk;  // the split's start under `chunk`
  // the first tile's lines, while the kernel before finishes (where the split cannot move: split 0,
  // or no sequence's split can grow)
  if (PORT_HAS_L2_PREFETCH && (split == 0 || want >= splits) && piece % kLineLanes == 0) {
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
  Raw qr[G], kr[R], vr[R];
#pragma unroll
  for (int g = 0; g < G; ++g) {  // heads past g_n read the last head's row (zeroed below): no branch
    const int gq = g < g_n ? g : g_n - 1;
    qr[g] = *reinterpret_cast<const Raw*>(q + (b * heads + static_cast<int64_t>(kh) * g_n + gq) * D + EL * piece);
  }
  // the R rows of a row group from ptr on, a row group's stride apart, the rows r with r * RG < left
  // (zeros past them): one pointer that steps, not an address a row
  const int64_t k_step = RG * k_sp, v_step = RG * v_sp;
  auto load = [&](Raw* regs, const S* ptr, int64_t step, int64_t left) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      regs[r] = Raw{};
      if (r * RG < left) regs[r] = *reinterpret_cast<const Raw*>(ptr);
      ptr += step;
    }
  };
  auto load_rows = [&](int64_t from) {  // up to the cache's end
    load(kr, kb + (from + rg) * k_sp, k_step, s_len - (from + rg));
    load(vr, vb + (from + rg) * v_sp, v_step, s_len - (from + rg));
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
  // the split's positions (< S: 32 bits) and the row group's rows of the current tile
  const int len = static_cast<int>((start + span < n ? start + span : n) - start);
  const S* kt = kb + (start + rg) * k_sp;
  const S* vt = vb + (start + rg) * v_sp;
  const int64_t k_tile = TW * k_sp, v_tile = TW * v_sp;
#pragma unroll
  for (int r = 0; r < R; ++r)  // value rows of the first tile past the split's: zeros (a slot may hold NaN)
    if (r * RG >= len - rg) vr[r] = Raw{};

  float qf[G][EL];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    unpack<T, EL>(qr[g], qf[g]);
    const float sg = g < g_n ? scale : 0.0f;  // heads past g_n: zeros
#pragma unroll
    for (int e = 0; e < EL; ++e) qf[g][e] *= sg;
  }
  float acc[G][EL];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int e = 0; e < EL; ++e) acc[g][e] = 0.0f;
  }
  // the lane's head after the halving exchanges (every lane of a head's LP / 8 holds its score),
  // and its running max and sum over the row group's rows
  const bool h4 = piece & (LP / 2), h2 = piece & (LP / 4), h1 = piece & (LP / 8);
  const int head = (h4 ? 4 : 0) + (h2 ? 2 : 0) + (h1 ? 1 : 0);
  const bool writer = piece % (LP / 8) == 0;
  const uint32_t m4 = h4 ? ~0u : 0u, m2 = h2 ? ~0u : 0u, m1 = h1 ? ~0u : 0u;  // pick()'s masks
  float m_run = -__builtin_inff(), l_run = 0.0f;

  const int steps = len / TW + (len % TW != 0);  // no off + TW past the int range
  for (int step = 0; step < steps; ++step) {
    const int left = len - step * TW - rg;  // the group's rows r of the tile with r * RG < left are live
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float kf[EL], dot[G];
      unpack<T, EL>(kr[r], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        dot[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < EL; ++e) dot[g] += qf[g][e] * kf[e];
      }
      float d4[4], d2[2];
#pragma unroll
      for (int i = 0; i < 4; ++i) d4[i] = pick(m4, dot[i], dot[i + 4]) + port_shfl_xor(pick(m4, dot[i + 4], dot[i]), LP / 2);
#pragma unroll
      for (int i = 0; i < 2; ++i) d2[i] = pick(m2, d4[i], d4[i + 2]) + port_shfl_xor(pick(m2, d4[i + 2], d4[i]), LP / 4);
      float sr = pick(m1, d2[0], d2[1]) + port_shfl_xor(pick(m1, d2[1], d2[0]), LP / 8);
#pragma unroll
      for (int m = LP / 16; m >= 1; m >>= 1) sr += port_shfl_xor(sr, m);
      s[r] = r * RG < left ? sr : -__builtin_inff();
    }
    load(kr, kt + k_tile, k_step, left - TW);  // the next tile's key rows, in flight meanwhile
    // the online softmax of the lane's head over the row group's rows of the tile
    float mx = s[0];
#pragma unroll
    for (int r = 1; r < R; ++r) mx = __builtin_fmaxf(mx, s[r]);
    const float m_new = __builtin_fmaxf(m_run, mx);  // fmax skips a NaN score: the p below keeps it
    const float alpha = m_run == -__builtin_inff() ? 0.0f : port_expf(m_run - m_new);  // sums so far: 0 (or NaN)
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // a masked row, or a live score of -inf: 0 (the output is NaN where every live score is -inf,
      // as the reference's softmax gives: below); a NaN score: NaN
      s[r] = s[r] == -__builtin_inff() ? 0.0f : port_expf(s[r] - m_new);
      sum += s[r];
    }
    l_run = l_run * alpha + sum;
    m_run = m_new;
    if (writer) {
#pragma unroll
      for (int r = 0; r < R; ++r) pb[rg][r][head] = s[r];
      pb[rg][R][head] = alpha;
    }
    port_sync_group();
    float w[G];
    lds_load8(pb[rg][R], w);
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int e = 0; e < EL; ++e) acc[g][e] *= w[g];
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float vf[EL];
      unpack<T, EL>(vr[r], vf);  // zeros past the live rows
      lds_load8(pb[rg][r], w);
#pragma unroll
      for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int e = 0; e < EL; ++e) acc[g][e] += w[g] * vf[e];  // heads past g_n: p never written, acc unused
      }
    }
    load(vr, vt + v_tile, v_step, left - TW);  // the next tile's value rows
    kt += k_tile;
    vt += v_tile;
    port_sync_group();  // pb is rewritten by the next tile
  }

  // the row groups meet in LDS: per head, weights w = exp(m - max m) over the groups with l != 0
  // (a NaN sum kept)
  if (writer && head < g_n) {
    m_rg[rg][head] = m_run;
    l_rg[rg][head] = l_run;
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {  // heads past g_n too (not read): no branch
#pragma unroll
    for (int e = 0; e < EL; ++e) red[rg][g * D + EL * piece + e] = acc[g][e];
  }
  __syncthreads();
  if (tid < g_n) {
    float mx = -__builtin_inff();
#pragma unroll
    for (int r = 0; r < RG; ++r)
      if (l_rg[r][tid] != 0.0f) mx = __builtin_fmaxf(mx, m_rg[r][tid]);
    float l = 0.0f;
#pragma unroll
    for (int r = 0; r < RG; ++r) {
      const float wr = l_rg[r][tid] != 0.0f ? port_expf(m_rg[r][tid] - mx) : 0.0f;  // l = 0: no position
      w_rg[r][tid] = wr;
      l += wr * l_rg[r][tid];
    }
    m_rg[0][tid] = mx;  // read below by this thread only
    l_sh[tid] = l;
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
      for (int r = 0; r < RG; ++r) total[i] += w_rg[r][o / D] * red[r][o];
    }
  }
  const int64_t out_row0 = b * heads + static_cast<int64_t>(kh) * g_n;  // out row of query head g: + g
  if (live == 1) {
#pragma unroll
    for (int i = 0; i < kOutPer; ++i) {
      const int o = tid + i * kTileThreads;
      if (o >= g_n * D) continue;
      write_out<T>(out, out_row0 * D + o, total[i] * inv_sum(l_sh[o / D], n), oq, od, os);
    }
    return;
  }
  const int64_t ws_row0 = ((b * kv_heads + kh) * splits + split) * g_n;  // workspace row of head g: + g
  if (tid < g_n) {
    ml[2 * (ws_row0 + tid)] = m_rg[0][tid];
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
  // splits' loads in flight at once: 8 at head dim 128, 4 at 256, where 8 was slower
  // (benchmarks/NOTES.md, "Decode attention by row groups")
  constexpr int kMergeUnroll = D == 128 ? 8 : 4;
#pragma unroll kMergeUnroll
  for (int s = 0; s < live; ++s) {
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
    write_out<T>(out, out_row0 * D + o, sum[i] * inv_sum(l_sh[o / D], n), oq, od, os);
  }
  if (tid == 0) port_atomic_add(counter, 0u - static_cast<uint32_t>(live));  // back to 0: every block has counted
}

#define FTLAB_ATTENTION_TILES_DP(T, D, TP)                                                                         \
  template __global__ void decode_attention_tiles_kernel<T, D, TP>(                                             \
      const T::storage*, const T::storage*, const T::storage*, const int32_t*, float*, float*, uint32_t*,        \
      T::storage*, int64_t, int64_t, int64_t, int64_t, int, int, int, float, int, int, int8_t*, float*, float*);
#define FTLAB_ATTENTION_TILES(T)                                                                                  \
  FTLAB_ATTENTION_TILES_DP(T, 128, 32) FTLAB_ATTENTION_TILES_DP(T, 256, 16) FTLAB_ATTENTION_TILES_DP(T, 128, 16) \
  FTLAB_ATTENTION_TILES_DP(T, 256, 8)
FTLAB_ATTENTION_TILES(f16_t)
FTLAB_ATTENTION_TILES(bf16_t)

}  // namespace ftlab

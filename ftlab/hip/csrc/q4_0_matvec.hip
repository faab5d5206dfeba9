// q4_0_matvec.hip — device code of the GGUF Q4_0 int8-dot matvecs (decode: up to 8 rows of
// activations): the LDS-staged matvec over Q8_1 activations, and the fused one-launch matvec
// that quantizes the activations itself and writes the output dtype.
//
// Contract: docs/OPS.md section 2 (q4_0_matmul, int8 path); reference: ftlab/reference/q4_0.py.
//
// The int8 dot of a Q4_0 block with a Q8_1 block (d8, q8[32], s8 = d8 * sum(q8)):
//   sumi = sum_j lo_j * q8[j] + hi_j * q8[j + 16]      (dp4a / sudot4 / sdot4, exact)
//   y   += d4 * (d8 * sumi - 8 * s8)
// With 32-bit words of qs: (w & 0x0F0F0F0F) are four low nibbles = elements 4i..4i+3, and
// ((w >> 4) & 0x0F0F0F0F) the matching high nibbles = elements 4i+16..4i+19.
//
// Includes q4_0_common.h and port.h only: the gfx compile check compiles this file alone.
#include "norm_common.h"  // includes q4_0_common.h

namespace ftlab {

constexpr int kGroup = 32;         // threads that share one weight row
constexpr int kRowsPerBlock = 4;   // row groups per 128-thread block
constexpr int kChunkBlocks = 64;   // Q4_0 blocks a row group stages per step (32 pairs)
constexpr int kChunkWords = kChunkBlocks * kBlockBytes / 4;  // 288
constexpr int kPairWords = 17;     // 16 words of activations per block pair, +1 of padding
static_assert(4 * kGroup * kRowsPerBlock == kChunkBlocks * 8, "a thread stages 4 words of each row of a chunk");

// Prefetched weight words of one chunk: lane l holds words 32t + l.
struct ChunkRegs {
  uint32_t w[kChunkWords / kGroup];
};

__device__ __forceinline__ void load_chunk(ChunkRegs& r, const uint32_t* src, int words, bool ok, int lane) {
#pragma unroll
  for (int t = 0; t < kChunkWords / kGroup; ++t) {
    const int word = t * kGroup + lane;
    r.w[t] = ok && word < words ? src[word] : 0u;
  }
}

// y[m, n] = sum_b d4 * (d8 * sumi - 8 * s8), for M = MV_M rows of activations.
//
// Every load from memory is coalesced, and every LDS read is free of bank conflicts:
// - weights: a row group loads a 64-block chunk of its row (1152 bytes, 288 words), each
//   load instruction covering 128 contiguous bytes (lane l takes word 32t + l), stages it
//   in LDS, and lane p then reads the 9 words of block pair p (banks 9p mod 32: distinct).
//   Loading the 18-byte blocks lane by lane instead makes every instruction span the chunk.
// - activations: the block stages the chunk's int8 activations once for its 4 rows, pair p
//   at word 17p (banks 17p mod 32: distinct), instead of every lane reading its own 64
//   bytes from memory, which made each load instruction span 2 KiB.
// The grid is persistent (as many blocks as fit on the device at once): block b's groups take
// rows 4b..4b+3, then 4(b + gridDim) on, chunk by chunk, so no partial last wave of blocks
// leaves SMs idle; each group loads the next chunk's weights into registers before it
// computes on the current one, so memory stays busy during the math.
// Needs an even number of blocks per row (4-byte aligned pairs) and a 4-byte aligned base;
// the launcher checks both.
// y is written in T (fp32, or x's fp16 / bf16: no cast launch after). Launched dependent on the
// kernel before (launch_pdl: the Q8_1 quantization of x): the first chunk's weight lines are asked
// of the L2 before the wait, nothing is read before it.
template <typename T, int MV_M>
__global__ void __launch_bounds__(kGroup * kRowsPerBlock)
    q4_0_mv_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, const int8_t* __restrict__ q8,
                   const float* __restrict__ d8, const float* __restrict__ s8,
                   typename T::storage* __restrict__ y, int64_t n_rows, int64_t k) {
  // double-buffered: item i writes buffer i % 2, so one barrier per item suffices
  __shared__ uint32_t stage[2][kRowsPerBlock][kChunkWords];
  __shared__ int xstage[2][MV_M][kChunkBlocks / 2 * kPairWords];
  const int lane = threadIdx.x;
  const int group = threadIdx.y;
  const int tid = group * kGroup + lane;
  const int64_t nb = k / kQK;
  const int64_t chunks = (nb + kChunkBlocks - 1) / kChunkBlocks;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  const int64_t rows_per_group = (n_rows + row_step - 1) / row_step;
  const int64_t items = chunks * rows_per_group;  // the same for every group: syncs are uniform
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + group;

  auto row_of = [&](int64_t item) { return first_row + (item / chunks) * row_step; };
  auto chunk_src = [&](int64_t item, int* words, bool* ok) {
    const int64_t n = row_of(item), b0 = (item % chunks) * kChunkBlocks;
    const int64_t blocks = nb - b0 < kChunkBlocks ? nb - b0 : kChunkBlocks;
    *words = static_cast<int>(blocks * kBlockBytes / 4);
    *ok = n < n_rows;
    return reinterpret_cast<const uint32_t*>(w + (*ok ? n : 0) * row_bytes) + b0 * kBlockBytes / 4;
  };

  float acc[MV_M];
#pragma unroll
  for (int m = 0; m < MV_M; ++m) acc[m] = 0.0f;
  ChunkRegs r;
  {
    int words;
    bool ok;
    const uint32_t* src = chunk_src(0, &words, &ok);
    if (PORT_HAS_L2_PREFETCH && ok && items > 0) {
      for (int t = lane * 32; t < words; t += kGroup * 32) port_prefetch_l2(src + t);  // 128-byte lines
    }
    port_pdl_wait();
    port_pdl_trigger();
    load_chunk(r, src, words, ok, lane);
  }
  for (int64_t item = 0; item < items; ++item) {
    const int64_t n = row_of(item);
    const int64_t c = item % chunks;
    const int64_t b0 = c * kChunkBlocks;
    const int64_t blocks = nb - b0 < kChunkBlocks ? nb - b0 : kChunkBlocks;
    const int buf = static_cast<int>(item & 1);
#pragma unroll
    for (int t = 0; t < kChunkWords / kGroup; ++t) stage[buf][group][t * kGroup + lane] = r.w[t];
    // the chunk's activations (L2-resident: every block reads them): thread tid takes words
    // 4 tid .. 4 tid + 3 of each row (one 16-byte load; pair p at word 17p in LDS), staged again
    // only when the chunk changes. On CUDA every row's load is issued before any is stored (one
    // L2 round trip, not M, which the serial form paid at M = 8); not unrolled over m
    // on AMD, where that runs out of SGPRs at M = 8.
    if (item < 2 || chunks > 1) {
      const int word = 4 * tid;  // of the chunk's 512 (16 per pair)
      const bool in = word < blocks * 8;
#if defined(PORT_CUDA)
      bytes16 xv[MV_M];
#pragma unroll
      for (int m = 0; m < MV_M; ++m) {
        xv[m] = in ? reinterpret_cast<const bytes16*>(q8 + m * k + b0 * kQK)[tid] : bytes16{};
      }
#pragma unroll
      for (int m = 0; m < MV_M; ++m) {
        uint32_t v[4];
        words_of(xv[m], v);
#pragma unroll
        for (int c = 0; c < 4; ++c) xstage[buf][m][((word + c) >> 4) * kPairWords + ((word + c) & 15)] = v[c];
      }
#else
#pragma unroll 1
      for (int m = 0; m < MV_M; ++m) {
        uint32_t v[4];
        words_of(in ? reinterpret_cast<const bytes16*>(q8 + m * k + b0 * kQK)[tid] : bytes16{}, v);
#pragma unroll
        for (int c = 0; c < 4; ++c) xstage[buf][m][((word + c) >> 4) * kPairWords + ((word + c) & 15)] = v[c];
      }
#endif
    }
    __syncthreads();
    if (item + 1 < items) {  // next chunk's weights: in flight while this one is computed
      int words;
      bool ok;
      const uint32_t* src = chunk_src(item + 1, &words, &ok);
      load_chunk(r, src, words, ok, lane);
    }
    if (2 * lane < blocks) {
      const uint32_t* p = &stage[buf][group][9 * lane];
      uint32_t pw[9];
#pragma unroll
      for (int i = 0; i < 9; ++i) pw[i] = p[i];
      // block A: d in the low half of word 0, qs in bytes 2..17; block B: d in the high
      // half of word 4, qs in words 5..8.
      uint32_t qa[4], qb[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        qa[i] = (pw[i] >> 16) | (pw[i + 1] << 16);
        qb[i] = pw[5 + i];
      }
      const float da = port_half_to_float(static_cast<uint16_t>(pw[0] & 0xffff));
      const float db = port_half_to_float(static_cast<uint16_t>(pw[4] >> 16));
      const int64_t ba = b0 + 2 * lane;
#pragma unroll
      for (int m = 0; m < MV_M; ++m) {
        const int* xa = &xstage[buf][m][lane * kPairWords];
        int va[8], vb[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          va[i] = xa[i];
          vb[i] = xa[8 + i];
        }
        const int64_t at = m * nb + ba;
        acc[m] += da * (d8[at] * static_cast<float>(block_dot(qa, va)) - 8.0f * s8[at]);
        acc[m] += db * (d8[at + 1] * static_cast<float>(block_dot(qb, vb)) - 8.0f * s8[at + 1]);
      }
    }
    if (c == chunks - 1) {  // the row is done: reduce over the group, write, start the next
#pragma unroll
      for (int m = 0; m < MV_M; ++m) {
        float v = acc[m];
#pragma unroll
        for (int off = kGroup / 2; off > 0; off >>= 1) v += port_shfl_xor(v, off);
        if (lane == 0 && n < n_rows) y[m * n_rows + n] = T::from_float(v);
        acc[m] = 0.0f;
      }
    }
  }
}

// ------------------------------------------------------------------ fused matvec

// y[m, n] = sum_b d4 * (d8 * sumi - 8 * s8) for M = MV_M <= 4 rows of activations x (more
// spill on RDNA: q4_0_mv_kernel takes them), in one launch:
// the Q8_1 quantization of x and the cast of y to x's dtype happen inside the kernel.
//
// The weights are read in superblocks of 8 Q4_0 blocks (144 bytes = 9 x 16 bytes, so a row
// whose block count is a multiple of 8 keeps every superblock 16-byte aligned). A group of
// 32 threads (a warp; half a wave on CDNA) owns a region of 32 superblocks: 32/G rows times
// G consecutive superblocks of each. It loads the region with 16-byte loads, lane l taking
// piece 32t + l (t = 0..8), so every load instruction covers 512 contiguous bytes; stores it
// to its own 4608 bytes of LDS; and lane l then reads back superblock l, 144 bytes at a
// 144-byte stride (36 words: 8 lanes of a 16-byte LDS phase hit banks 4l mod 32, all
// distinct). The region after is loaded into registers before this one is computed.
//
// Every block quantizes all of x (M x K, at most kFusedXBytes of LDS) once, in the same
// arithmetic as quantize_q8_1_kernel (bit for bit), into one 84-word record per (row, superblock): 64 words
// of q8, 8 of d8, 8 of s8, 4 of padding so that 8 lanes reading 8 consecutive superblocks
// land on distinct banks (84 = 20 mod 32). The grid is persistent; groups walk regions
// rowset by rowset, K-step by K-step, then reduce over the G lanes of a row.
constexpr int kFusedGroups = 4;                   // 32-thread groups per block
constexpr int kFusedXWords = 7168;                // 28 KiB of activation records
constexpr int kFusedXBytes = kFusedXWords * 4;

#include "q4_0_norm_prologue.h"  // norm_prologue, after the constants above

// MODE kFusedQuantize: the prologue quantizes x. MODE kFusedGiven: x comes quantized already (q8 [M, K]
// int8, d8 and s8 [M, K/32] fp32, each 16-byte aligned: ops.q4_0_matmul's x_q8), and the prologue
// only copies it into the records (20 16-byte pieces a record); x is unread. MODE kFusedNorm (M = 1,
// 16-bit T, K at most kNormThreads pieces of 8): x is first replaced by add_rmsnorm's y of x and
// res (res null: none) with norm_w and eps, in add_rmsnorm_kernel's arithmetic -- work item t of
// the prologue is its thread t (piece t, elements 8t..8t+7), the sums of squares meet by the same
// shuffles and the same partials in the same order, so y has its bits -- then y is quantized as x
// would be; block 0 also stores s (with res) and y.
constexpr int kFusedQuantize = 0, kFusedGiven = 1, kFusedNorm = 2;

template <typename T, int MV_M, int MODE>
__global__ void __launch_bounds__(kGroup * kFusedGroups)
    q4_0_mv_fused_kernel(const typename T::storage* __restrict__ x, int64_t x_stride,
                         const int8_t* __restrict__ q8, const float* __restrict__ d8,
                         const float* __restrict__ s8,
                         const uint8_t* __restrict__ w, int64_t row_bytes,
                         typename T::storage* __restrict__ y, int64_t n_rows, int64_t k, int g_lanes,
                         const typename T::storage* __restrict__ res, int64_t r_stride,
                         const typename T::storage* __restrict__ norm_w, typename T::storage* __restrict__ s_out,
                         typename T::storage* __restrict__ y_out, float eps) {
  constexpr bool PRE = MODE == kFusedGiven;
  static_assert(MODE != kFusedNorm || (MV_M == 1 && sizeof(typename T::storage) == 2),
                "the norm prologue takes one row of a 16-bit dtype");
  __shared__ bytes16 region[kFusedGroups][kGroup * kSuperPieces];
  __shared__ bytes16 xrec_v[kFusedXWords / 4];  // 16-byte aligned: records are read as vectors
  uint32_t* xrec = reinterpret_cast<uint32_t*>(xrec_v);
  const int lane = threadIdx.x;
  const int group = threadIdx.y;
  const int tid = group * kGroup + lane;
  // 32-bit index math throughout: K is bounded by the activation records' LDS and N < 2^31 (the
  // launcher checks both), so no 64-bit divisions in the prologue or the loop.
  const int nb = static_cast<int>(k / kQK);
  const int supers = nb / kSuperBlocks;               // per row
  const int rows_per_set = kGroup / g_lanes;
  const int set_pieces = g_lanes * kSuperPieces;      // pieces of one row in a region
  const int k_steps = (supers + g_lanes - 1) / g_lanes;
  const int row_sets = static_cast<int>((n_rows + rows_per_set - 1) / rows_per_set);
  const int groups = static_cast<int>(gridDim.x) * kFusedGroups;
  const int first_set = static_cast<int>(blockIdx.x) * kFusedGroups + group;
  const int items = first_set < row_sets ? ((row_sets - 1 - first_set) / groups + 1) * k_steps : 0;

  bytes16 r[kSuperPieces];
  // Piece t of lane's share of region `item`: its address, or null past the rows / superblocks.
  auto region_piece = [&](int item, int t) -> const bytes16* {
    const int set = first_set + (item / k_steps) * groups;
    const int ks = item - (item / k_steps) * k_steps;
    const int p = t * kGroup + lane;
    const int rr = p / set_pieces, q = p - rr * set_pieces;
    const int64_t row = static_cast<int64_t>(set) * rows_per_set + rr;
    const int sb = ks * g_lanes + q / kSuperPieces;
    if (row >= n_rows || sb >= supers) return nullptr;
    return reinterpret_cast<const bytes16*>(w + row * row_bytes) + ks * g_lanes * kSuperPieces + q;
  };
  auto load_region = [&](int item) {
#pragma unroll
    for (int t = 0; t < kSuperPieces; ++t) {
      const bytes16* src = region_piece(item, t);
      r[t] = src ? *src : bytes16{};
    }
  };
  // Launched dependent on the kernel before (launch_pdl): while it finishes, the first region's
  // lines are asked of the L2 (a hint: no load before the wait, so nothing read can be stale);
  // then the region is loaded (in flight while the activations are quantized), x only after.
  if (PORT_HAS_L2_PREFETCH && items > 0) {
#pragma unroll
    for (int t = 0; t < kSuperPieces; ++t) {
      const bytes16* src = region_piece(0, t);
      if (src) port_prefetch_l2(src);
    }
  }
  port_pdl_wait();
  port_pdl_trigger();
  if (items > 0) load_region(0);

  if (PRE) {  // record piece c < 16: q8 bytes 16c..16c+15 of the superblock; 16, 17: d8; 18, 19: s8
    const int pieces = MV_M * supers * 20;
    for (int p = tid; p < pieces; p += kGroup * kFusedGroups) {
      const int rec = p / 20, c = p - rec * 20;  // rec = m * supers + sb: q8 row m is at m * K
      const bytes16* src = c < 16 ? reinterpret_cast<const bytes16*>(q8 + rec * 256) + c
                           : c < 18 ? reinterpret_cast<const bytes16*>(d8 + rec * 8) + (c - 16)
                                    : reinterpret_cast<const bytes16*>(s8 + rec * 8) + (c - 18);
      xrec_v[rec * (kRecordWords / 4) + c] = *src;
    }
  }
  if (MODE == kFusedNorm) norm_prologue<T>(x, res, norm_w, s_out, y_out, eps, nb, tid, xrec);
  // Else Q8_1 of x into the records (quantize_records: quantize_q8_1_kernel's arithmetic).
  if (MODE == kFusedQuantize) quantize_records<T, MV_M, kGroup * kFusedGroups>(x, x_stride, nb, tid, xrec);
  __syncthreads();

  float acc[MV_M];
#pragma unroll
  for (int m = 0; m < MV_M; ++m) acc[m] = 0.0f;
  for (int item = 0; item < items; ++item) {
    const int set = first_set + (item / k_steps) * groups;
    const int ks = item - (item / k_steps) * k_steps;
#pragma unroll
    for (int t = 0; t < kSuperPieces; ++t) region[group][t * kGroup + lane] = r[t];
    port_sync_group();
    uint32_t pw[4 * kSuperPieces];
#pragma unroll
    for (int t = 0; t < kSuperPieces; ++t) {
      words_of(region[group][lane * kSuperPieces + t], &pw[4 * t]);
    }
    port_sync_group();
    if (item + 1 < items) load_region(item + 1);
    const int64_t row = static_cast<int64_t>(set) * rows_per_set + lane / g_lanes;
    const int sb = ks * g_lanes + lane % g_lanes;
    if (row < n_rows && sb < supers) {
#pragma unroll
      for (int p = 0; p < kSuperBlocks / 2; ++p) {  // block pairs, as in q4_0_mv_kernel
        const Q4Pair pr = pair_of(pw, p);
#pragma unroll
        for (int m = 0; m < MV_M; ++m) pair_accumulate_record(acc[m], pr, xrec + (m * supers + sb) * kRecordWords, p);
      }
    }
    if (ks == k_steps - 1) {  // the row set is done: reduce over the G lanes of each row
#pragma unroll
      for (int m = 0; m < MV_M; ++m) {
        float v = acc[m];
        for (int off = g_lanes / 2; off > 0; off >>= 1) v += port_shfl_xor(v, off);
        if (lane % g_lanes == 0 && row < n_rows) y[m * n_rows + row] = T::from_float(v);
        acc[m] = 0.0f;
      }
    }
  }
}

// Every configuration the launcher uses.
#define FTLAB_Q4_0_MV_INSTANTIATE(T, M)                                                             \
  template __global__ void q4_0_mv_kernel<T, M>(const uint8_t*, int64_t, const int8_t*, const float*, \
                                                const float*, T::storage*, int64_t, int64_t);
#define FTLAB_Q4_0_MV_ALL_M(T)                                                                 \
  FTLAB_Q4_0_MV_INSTANTIATE(T, 1) FTLAB_Q4_0_MV_INSTANTIATE(T, 2) FTLAB_Q4_0_MV_INSTANTIATE(T, 3) \
  FTLAB_Q4_0_MV_INSTANTIATE(T, 4) FTLAB_Q4_0_MV_INSTANTIATE(T, 5) FTLAB_Q4_0_MV_INSTANTIATE(T, 6) \
  FTLAB_Q4_0_MV_INSTANTIATE(T, 7) FTLAB_Q4_0_MV_INSTANTIATE(T, 8)
FTLAB_Q4_0_MV_ALL_M(f32_t)
FTLAB_Q4_0_MV_ALL_M(f16_t)
FTLAB_Q4_0_MV_ALL_M(bf16_t)

#define FTLAB_Q4_0_MV_FUSED_ONE(T, M, MODE)                                                       \
  template __global__ void q4_0_mv_fused_kernel<T, M, MODE>(                                     \
      const T::storage*, int64_t, const int8_t*, const float*, const float*, const uint8_t*,     \
      int64_t, T::storage*, int64_t, int64_t, int, const T::storage*, int64_t, const T::storage*, \
      T::storage*, T::storage*, float);
#define FTLAB_Q4_0_MV_FUSED_ALL_M(T)                                                       \
  FTLAB_Q4_0_MV_FUSED_ONE(T, 1, kFusedQuantize) /* one row quantizes x itself */         \
  FTLAB_Q4_0_MV_FUSED_ONE(T, 1, kFusedGiven) FTLAB_Q4_0_MV_FUSED_ONE(T, 2, kFusedGiven) \
  FTLAB_Q4_0_MV_FUSED_ONE(T, 3, kFusedGiven) FTLAB_Q4_0_MV_FUSED_ONE(T, 4, kFusedGiven)
FTLAB_Q4_0_MV_FUSED_ALL_M(f32_t)
FTLAB_Q4_0_MV_FUSED_ALL_M(f16_t)
FTLAB_Q4_0_MV_FUSED_ALL_M(bf16_t)
FTLAB_Q4_0_MV_FUSED_ONE(f16_t, 1, kFusedNorm)
FTLAB_Q4_0_MV_FUSED_ONE(bf16_t, 1, kFusedNorm)

}  // namespace ftlab

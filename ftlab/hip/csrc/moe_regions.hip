// moe_regions.hip — device code of hip's Q4_0 decode experts for banks whose rows are whole
// superblocks (H and I multiples of 256, 16-byte aligned): gate/up + SwiGLU, then down weighted
// and summed over the slots, as moe.hip's moe_gate_up_q4_kernel / moe_down_q4_kernel compute them,
// with the weights read in coalesced regions transposed through LDS. The launcher
// (moe_launch.hip, launch_decode_q4) picks these when both banks are so aligned, in their linear
// form where a region spans whole packed rows (every GGUF bank of Qwen3-30B-A3B's shape): one
// contiguous run a region, read without per-piece (row, column) arithmetic, which took a large
// share of these kernels' instructions (benchmarks/NOTES.md, "Decode experts in linear
// regions").
//
// Contract: docs/OPS.md section 3 (moe_experts); reference: ftlab/reference/moe.py.
// Includes moe_common.h (then q4_0_common.h and port.h) only: the gfx compile check compiles
// this file alone.
#include "moe_common.h"

namespace ftlab {

// ------------------------------------------------------------------ decode experts, Q4_0, regions
// For banks whose rows are superblock-aligned (`wide`): the weights are read as
// q4_0_mv_fused_kernel reads them. A 32-lane group owns regions of 32/G rows x G consecutive
// superblocks of each row; it loads a region with 16-byte loads, lane l taking piece 32t + l
// (t = 0..8), so a load instruction covers 512 bytes of at most 32/G row segments (contiguous
// where the rows are); stores it to its own 4608 bytes of LDS; and lane l reads back superblock
// l (row l / G, superblock l % G of the region) at a 144-byte stride, free of bank conflicts.
// A lane reading its own superblock straight from memory instead makes each load instruction
// touch 32 scattered, half-used sectors.
constexpr int kRegionPieces = kMoeGroup * kSuperPieces;  // 288 pieces: 4608 bytes
constexpr int kRegionGroups = kMoeThreads / kMoeGroup;   // 8 groups a block

// Piece t of lane's share of region (rows base, base + row_stride, ... of which `rows` exist;
// superblocks ks * G .. ks * G + G - 1 of `supers`): its address, or null past them.
template <int G>
__device__ __forceinline__ const bytes16* region_piece(const uint8_t* base, int64_t row_stride, int rows, int supers,
                                                       int ks, int t, int lane) {
  constexpr int kSetPieces = G * kSuperPieces;  // pieces of one row in a region
  const int p = t * kMoeGroup + lane;
  const int rr = p / kSetPieces, q = p - rr * kSetPieces;
  if (rr >= rows || ks * G + q / kSuperPieces >= supers) return nullptr;
  return reinterpret_cast<const bytes16*>(base + rr * row_stride) + ks * kSetPieces + q;
}

// A region of whole rows that lie back to back in memory (`linear`: the bank's rows are packed,
// row_stride = supers * 144 bytes, and a region spans every superblock of its rows, supers <= G):
// its pieces are one contiguous run, piece p at base + 16p, so lane l's piece t is p = 32t + l,
// read without the (row, column) arithmetic of region_piece; null past the run's `pieces`.
// Stored to LDS in the same order, the superblock of a lane (row l / G, superblock l % G) lies at
// piece ((l / G) * supers + l % G) * 9 (linear_super); that is l * 9 when supers == G.
__device__ __forceinline__ const bytes16* linear_piece(const uint8_t* base, int pieces, int t, int lane) {
  const int p = t * kMoeGroup + lane;
  return p < pieces ? reinterpret_cast<const bytes16*>(base) + p : nullptr;
}

template <int G>
__device__ __forceinline__ int linear_super(int lane, int supers) {
  return ((lane / G) * supers + lane % G) * kSuperPieces;
}

// A group's walk over its `items` regions, kRegionBuffers of them in registers at a time (one
// where the target has the L2 hint: the kernels then ask the L2 for the later regions up front,
// and the registers stay few enough for two blocks an SM; two elsewhere). load_region issues the
// loads of one region (the caller starts the first kRegionBuffers items, ra then rb);
// run_regions then, per item, stores its pieces to the group's LDS (lds, 288 pieces), issues the
// loads of item + kRegionBuffers into the freed registers and calls consume(item, sp) with the
// lane's superblock in LDS (sp = lds + sp_off, 9 pieces: sp_off is 9 * lane in region_piece's
// layout, linear_super in a linear region's), which it reads block pair by block pair
// (pair_in_lds). piece_of(item, t) gives the address of the lane's piece t of region `item` or
// null (read as zeros). Every lane of the group runs the same items (consume may shuffle within
// the group). Two buffers on CUDA too took so many registers that one block fit an SM, and were
// slower (benchmarks/NOTES.md, "The decode experts in regions").
constexpr int kRegionBuffers = PORT_HAS_L2_PREFETCH ? 1 : 2;

template <typename PieceOf>
__device__ __forceinline__ void load_region(bytes16* r, int item, int items, PieceOf piece_of) {
#pragma unroll
  for (int t = 0; t < kSuperPieces; ++t) {
    const bytes16* src = item < items ? piece_of(item, t) : nullptr;
    r[t] = src ? *src : bytes16{};
  }
}

template <typename PieceOf, typename Consume>
__device__ __forceinline__ void region_step(bytes16* r, int item, int items, bytes16* lds, int lane, int sp_off,
                                            PieceOf piece_of, Consume consume) {
#pragma unroll
  for (int t = 0; t < kSuperPieces; ++t) lds[t * kMoeGroup + lane] = r[t];
  port_sync_group();
  if (item + kRegionBuffers < items) load_region(r, item + kRegionBuffers, items, piece_of);
  consume(item, lds + sp_off);
  port_sync_group();  // every read of this region before the next one is stored
}

template <typename PieceOf, typename Consume>
__device__ __forceinline__ void run_regions(bytes16* ra, bytes16* rb, int items, bytes16* lds, int lane, int sp_off,
                                            PieceOf piece_of, Consume consume) {
  for (int item = 0; item < items; item += kRegionBuffers) {
    region_step(ra, item, items, lds, lane, sp_off, piece_of, consume);
    if (kRegionBuffers == 2 && item + 1 < items) region_step(rb, item + 1, items, lds, lane, sp_off, piece_of, consume);
  }
}

// Asks the L2 for the regions from item `from` on (one piece in 8 of the lane's: 128 bytes).
template <typename PieceOf>
__device__ __forceinline__ void prefetch_regions(int from, int items, int lane, PieceOf piece_of) {
  for (int item = from; item < items; ++item) {
#pragma unroll
    for (int t = 0; t < kSuperPieces; ++t) {
      const bytes16* src = (t * kMoeGroup + lane) % 8 == 0 ? piece_of(item, t) : nullptr;
      if (src) port_prefetch_l2(src);
    }
  }
}

// Block pair p of the superblock at sp (9 pieces in LDS): its words 9p..9p+8 lie in pieces
// 2p..2p+2, from word p of them on.
__device__ __forceinline__ Q4Pair pair_in_lds(const bytes16* sp, int p) {
  uint32_t w[12];
#pragma unroll
  for (int c = 0; c < 3; ++c) words_of(sp[2 * p + c], &w[4 * c]);
  return pair_of(w + p, 0);
}

// The 8 block terms of the superblock at sp (LDS) against activation record rec.
__device__ __forceinline__ float super_record_dot(const bytes16* sp, const uint32_t* rec) {
  float acc = 0.0f;
#pragma unroll
  for (int p = 0; p < kSuperBlocks / 2; ++p) pair_accumulate_record(acc, pair_in_lds(sp, p), rec, p);
  return acc;
}

// moe_gate_up_q4_kernel for wide banks: one block of 256 threads per (pair, 32 rows of h), the
// same 64 weight rows (32 gate, 32 up) and the same h, in regions of 4 rows x 8 superblocks.
// Group w takes gate rows 4w..4w+3 (set 0) and up rows 4w..4w+3 (set 1), K-step by K-step; x's
// Q8_1 is quantized into activation records (quantize_records) while the first region's loads
// (the first two's without the L2 hint) are in flight. Same outputs and conventions as moe_gate_up_q4_kernel, whose h
// arithmetic it shares; the dot of a row sums its superblocks' terms per lane, then over the 8
// lanes (xor 1, 2, 4). Linear (packed rows of at most 8 superblocks: H <= 2048): each region is
// its 4 rows whole, one contiguous run (linear_piece). Each block asks the L2 for down_share bytes
// (128-byte lines, the launcher's share of blockIdx.y) of its expert's down matrix.
constexpr int kGateUpLanes = 8;  // lanes per row: a region is 4 rows x 8 superblocks

template <typename T, bool Linear>
__global__ void __launch_bounds__(kMoeThreads)
    moe_gate_up_q4_regions_kernel(const typename T::storage* __restrict__ x, int64_t x_stride,
                                  const uint8_t* __restrict__ bank, int64_t e_stride, int64_t row_bytes,
                                  const int32_t* __restrict__ ids, int8_t* __restrict__ hq, float* __restrict__ hd,
                                  float* __restrict__ hs, int num_experts, int hidden, int inter, int top_k,
                                  const uint8_t* __restrict__ down_bank, int64_t down_e_stride, int64_t down_bytes,
                                  int64_t down_share) {
  __shared__ bytes16 region[kRegionGroups][kRegionPieces];
  __shared__ bytes16 xrec_v[kMaxQ8Blocks / kSuperBlocks * kRecordWords / 4];
  __shared__ float gu[2 * kQK];
  uint32_t* xrec = reinterpret_cast<uint32_t*>(xrec_v);
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl): ids and x only after this
  port_pdl_trigger();
  const int64_t pair = blockIdx.x;
  const int e = ids[pair];
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kQK;
  const int64_t hb = pair * (inter / kQK) + blockIdx.y;  // h's Q8_1 block
  if (e < 0 || e >= num_experts) {
    if (threadIdx.x < kQK / 4) reinterpret_cast<uint32_t*>(hq + pair * inter + n0)[threadIdx.x] = 0u;
    if (threadIdx.x == 0) hd[hb] = hs[hb] = 0.0f;
    return;
  }
  const int nb = hidden / kQK, supers = nb / kSuperBlocks;
  const int k_steps = Linear ? 1 : (supers + kGateUpLanes - 1) / kGateUpLanes;  // Linear: supers <= 8
  const int items = 2 * k_steps;
  const int group = threadIdx.x / kMoeGroup, lane = threadIdx.x % kMoeGroup;
  constexpr int kSetRows = kMoeGroup / kGateUpLanes;  // 4
  const uint8_t* gate0 = bank + e * e_stride + (n0 + kSetRows * group) * row_bytes;
  const uint8_t* up0 = gate0 + static_cast<int64_t>(inter) * row_bytes;
  const int lin_pieces = kSetRows * supers * kSuperPieces;  // Linear: the region's 4 rows, back to back
  auto piece_of = [&](int item, int t) -> const bytes16* {
    const int set = Linear ? item : item / k_steps;
    if (Linear) return linear_piece(set == 0 ? gate0 : up0, lin_pieces, t, lane);
    return region_piece<kGateUpLanes>(set == 0 ? gate0 : up0, row_bytes, kSetRows, supers, item - set * k_steps, t,
                                      lane);
  };
  const int sp_off = Linear ? linear_super<kGateUpLanes>(lane, supers) : lane * kSuperPieces;
  bytes16 ra[kSuperPieces], rb[kRegionBuffers == 2 ? kSuperPieces : 1];
  load_region(ra, 0, items, piece_of);
  if (kRegionBuffers == 2) load_region(rb, 1, items, piece_of);
  if (PORT_HAS_L2_PREFETCH) {
    prefetch_regions(kRegionBuffers, items, lane, piece_of);
    if (down_bank != nullptr) {  // this block's share of expert e's down matrix, 128-byte lines
      const int64_t begin = blockIdx.y * down_share;
      const int64_t end = begin + down_share < down_bytes ? begin + down_share : down_bytes;
      const uint8_t* base = down_bank + e * down_e_stride;
      for (int64_t off = begin + threadIdx.x * 128; off < end; off += kMoeThreads * 128) port_prefetch_l2(base + off);
    }
  }
  quantize_records<T, 1, kMoeThreads>(x + (pair / top_k) * x_stride, 0, nb, threadIdx.x, xrec);
  __syncthreads();
  float acc = 0.0f;
  run_regions(ra, rb, items, region[group], lane, sp_off, piece_of, [&](int item, const bytes16* sp) {
    const int set = Linear ? item : item / k_steps, ks = item - set * k_steps;
    const int sb = ks * kGateUpLanes + lane % kGateUpLanes;
    if (sb < supers) acc += super_record_dot(sp, xrec + sb * kRecordWords);
    if (ks == k_steps - 1) {  // the set's rows are done: reduce over the 8 lanes of each row
#pragma unroll
      for (int off = 1; off < kGateUpLanes; off <<= 1) acc += port_shfl_xor(acc, off);
      if (lane % kGateUpLanes == 0) gu[set * kQK + kSetRows * group + lane / kGateUpLanes] = acc;
      acc = 0.0f;
    }
  });
  __syncthreads();
  if (threadIdx.x < kQK) silu_mul_q8_1(gu, threadIdx.x, hq + pair * inter + n0, hd + hb, hs + hb);
}

// moe_down_q4_kernel for wide banks: one block per (token, 8 rows of y); group g takes slots
// g, g + 8, ..., each slot's 8 rows in regions of 8 rows x 4 superblocks, the lane's superblock
// against that pair's Q8_1 h (read from memory, 16-byte loads); then y as moe_down_q4_kernel
// forms it. Invalid ids read no expert memory. Linear (packed rows of at most 4 superblocks:
// I <= 1024): a region is its 8 rows whole, one contiguous run.
template <typename T, bool Linear>
__global__ void __launch_bounds__(kMoeThreads)
    moe_down_q4_regions_kernel(const int8_t* __restrict__ hq, const float* __restrict__ hd,
                               const float* __restrict__ hs, const uint8_t* __restrict__ bank, int64_t e_stride,
                               int64_t row_bytes, const int32_t* __restrict__ ids, const float* __restrict__ wts,
                               typename T::storage* __restrict__ y, int64_t y_stride, int num_experts, int hidden,
                               int inter, int top_k) {
  __shared__ bytes16 region[kRegionGroups][kRegionPieces];
  __shared__ float parts[kMaxSlots][kDownRows];
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl)
  port_pdl_trigger();
  const int64_t t = blockIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kDownRows;
  const int group = threadIdx.x / kMoeGroup, lane = threadIdx.x % kMoeGroup;
  const int rows = hidden - n0 < kDownRows ? static_cast<int>(hidden - n0) : kDownRows;
  const int nb = inter / kQK, supers = nb / kSuperBlocks;
  const int k_steps = Linear ? 1 : (supers + kDownLanes - 1) / kDownLanes;  // Linear: supers <= 4
  const int slots = group < top_k ? (top_k - 1 - group) / kRegionGroups + 1 : 0;
  const int items = slots * k_steps;
  auto slot_of = [&](int item) { return group + kRegionGroups * (Linear ? item : item / k_steps); };
  const int lin_pieces = rows * supers * kSuperPieces;  // Linear: the region's rows, back to back
  auto piece_of = [&](int item, int tt) -> const bytes16* {
    const int e = ids[t * top_k + slot_of(item)];
    if (e < 0 || e >= num_experts) return nullptr;
    if (Linear) return linear_piece(bank + e * e_stride + n0 * row_bytes, lin_pieces, tt, lane);
    return region_piece<kDownLanes>(bank + e * e_stride + n0 * row_bytes, row_bytes, rows, supers,
                                          item % k_steps, tt, lane);
  };
  const int sp_off = Linear ? linear_super<kDownLanes>(lane, supers) : lane * kSuperPieces;
  bytes16 ra[kSuperPieces], rb[kRegionBuffers == 2 ? kSuperPieces : 1];
  load_region(ra, 0, items, piece_of);
  if (kRegionBuffers == 2) load_region(rb, 1, items, piece_of);
  if (PORT_HAS_L2_PREFETCH) prefetch_regions(kRegionBuffers, items, lane, piece_of);
  float acc = 0.0f;
  run_regions(ra, rb, items, region[group], lane, sp_off, piece_of, [&](int item, const bytes16* sp) {
    const int j = slot_of(item), ks = Linear ? 0 : item % k_steps;
    const int64_t pair = t * top_k + j;
    const int sb = ks * kDownLanes + lane % kDownLanes;
    if (sb < supers) {
      const bytes16* qv = reinterpret_cast<const bytes16*>(hq + pair * inter + sb * kSuperBlocks * kQK);
      const float* d8 = hd + pair * nb + sb * kSuperBlocks;
      const float* s8 = hs + pair * nb + sb * kSuperBlocks;
#pragma unroll
      for (int p = 0; p < kSuperBlocks / 2; ++p) {
        pair_accumulate(acc, pair_in_lds(sp, p), qv + 4 * p, d8[2 * p], d8[2 * p + 1], s8[2 * p], s8[2 * p + 1]);
      }
    }
    if (ks == k_steps - 1) {  // the slot's rows are done: reduce over the 4 lanes of each row
#pragma unroll
      for (int off = 1; off < kDownLanes; off <<= 1) acc += port_shfl_xor(acc, off);
      if (lane % kDownLanes == 0) parts[j][lane / kDownLanes] = acc;
      acc = 0.0f;
    }
  });
  __syncthreads();
  if (threadIdx.x < kDownRows && n0 + threadIdx.x < hidden) {
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const int e = ids[t * top_k + j];
      if (e >= 0 && e < num_experts) sum += wts[t * top_k + j] * parts[j][threadIdx.x];
    }
    y[t * y_stride + n0 + threadIdx.x] = T::from_float(sum);
  }
}

// Every configuration the launcher uses.
#define FTLAB_MOE_REGIONS_INSTANTIATE_L(T, L)                                                                 \
  template __global__ void moe_gate_up_q4_regions_kernel<T, L>(const T::storage*, int64_t, const uint8_t*,     \
                                                               int64_t, int64_t, const int32_t*, int8_t*,       \
                                                               float*, float*, int, int, int, int,              \
                                                               const uint8_t*, int64_t, int64_t, int64_t);      \
  template __global__ void moe_down_q4_regions_kernel<T, L>(const int8_t*, const float*, const float*,         \
                                                            const uint8_t*, int64_t, int64_t, const int32_t*,   \
                                                            const float*, T::storage*, int64_t, int, int, int,  \
                                                            int);
#define FTLAB_MOE_REGIONS_INSTANTIATE(T) \
  FTLAB_MOE_REGIONS_INSTANTIATE_L(T, false) FTLAB_MOE_REGIONS_INSTANTIATE_L(T, true)
FTLAB_MOE_REGIONS_INSTANTIATE(f32_t)
FTLAB_MOE_REGIONS_INSTANTIATE(f16_t)
FTLAB_MOE_REGIONS_INSTANTIATE(bf16_t)

}  // namespace ftlab

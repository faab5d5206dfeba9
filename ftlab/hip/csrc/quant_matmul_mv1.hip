// quant_matmul_mv1.hip — device code of the one-row int8 matvec of K-quant weights (Q4_K, Q5_K,
// Q6_K; and Q4_0 / Q8_0 in groups of eight blocks, quant_records.h) in one launch: x (fp32 / fp16 / bf16) quantized to Q8_1 in every block, the weights read
// in 16-byte pieces (quant_records.h's MvOf: quant_vec.h's eighths of a super-block for Q4_K /
// Q5_K, quads for Q6_K), y written in x's dtype. The decode step's attention projections take it
// where the quantize, matvec and cast were three launches; its staged form (rows copied into LDS
// slots asynchronously, below) takes Q6_K's lm_head.
//
// Contract: docs/OPS.md section 11 (quant_matmul, int8 path); reference:
// ftlab/reference/quant_matmul.py. Includes quant_records.h (then quant_vec.h, quant_units.h,
// q4_0_common.h and port.h) only: the gfx compile check compiles this file alone.
#pragma once
#include "quant_records.h"

namespace ftlab {
namespace qmm {

constexpr int kFusedSteps = 2;  // steps (kGroup / kLanes super-blocks each) loaded at once on long rows
constexpr int kFusedThreads = 256;  // 8 groups of 32 lanes a block
constexpr int kFusedMaxK = 8192;    // x's activation records in LDS: 32 super-blocks, 10.5 KiB

// y[n] (x's dtype) = the int8 dot of weight row n with the Q8_1 of x [K] (fp32 / fp16 / bf16), in
// one launch: each block quantizes x into activation records in LDS (q4_0_common.h's
// quantize_records: quantize_q8_1_kernel's bits), then its groups walk rows n = block * 8 + group,
// + 8 * grid, ... with MvOf<Q>'s pieces (kLanes lanes a super-block, 16-byte loads). Where a row is
// at most kHeld steps (K <= 2048) each lane's activations stay in registers and the next row's
// pieces are loaded before this row's terms are summed; the group's first row is asked of the L2
// before the wait on the kernel before (launch_pdl: prefetches only). w 16-byte aligned.
template <typename T, typename Q>
__global__ void __launch_bounds__(kFusedThreads)
    quant_mv1_fused_kernel(const typename T::storage* __restrict__ x, const uint8_t* __restrict__ w,
                           int64_t row_bytes, typename T::storage* __restrict__ y, int64_t n_rows, int k) {
  using V = typename MvOf<Q>::type;
  constexpr int kPer = kGroup / V::kLanes;  // super-blocks a step
  __shared__ bytes16 rec_v[kFusedMaxK / 256 * kRecordWords / 4];
  uint32_t* rec = reinterpret_cast<uint32_t*>(rec_v);
  const int group = threadIdx.x / kGroup, lane = threadIdx.x % kGroup;
  const int c = lane % V::kLanes, s0 = lane / V::kLanes;
  const int supers = k / Q::kBlock;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (kFusedThreads / kGroup);
  int64_t n = static_cast<int64_t>(blockIdx.x) * (kFusedThreads / kGroup) + group;
  if (supers <= kPer * V::kHeld) {
    bool has[V::kHeld];
#pragma unroll
    for (int t = 0; t < V::kHeld; ++t) {
      has[t] = s0 + kPer * t < supers;
      // the first row's lines asked of the L2 while the kernel before finishes (a hint: no data
      // is read before the wait, so weights written by that kernel are never seen stale)
      if (PORT_HAS_L2_PREFETCH && has[t] && n < n_rows)  // kLanes lanes spread over the super-block
        port_prefetch_l2(w + n * row_bytes + (s0 + kPer * t) * Q::kBytes + Q::kBytes * c / V::kLanes);
    }
    port_pdl_wait();  // launched dependent on the kernel before (launch_pdl): w and x only after this
    port_pdl_trigger();
    V cur[V::kHeld];
#pragma unroll
    for (int t = 0; t < V::kHeld; ++t) {
      if (has[t] && n < n_rows) cur[t].load(w + n * row_bytes + (s0 + kPer * t) * Q::kBytes, c);
    }
    quantize_records<T, 1, kFusedThreads>(x, 0, k / kQK, threadIdx.x, rec);
    __syncthreads();
    typename V::X xh[V::kHeld];
#pragma unroll
    for (int t = 0; t < V::kHeld; ++t) {
      if (has[t]) V::xload(xh[t], acts_of_record(rec + (s0 + kPer * t) * kRecordWords), c);
    }
    for (; n < n_rows; n += stride) {  // uniform in a group: the shuffles stay in-group
      V next[V::kHeld];
#pragma unroll
      for (int t = 0; t < V::kHeld; ++t) {
        if (has[t] && n + stride < n_rows) next[t].load(w + (n + stride) * row_bytes + (s0 + kPer * t) * Q::kBytes, c);
      }
      float acc = 0.0f;
#pragma unroll
      for (int t = 0; t < V::kHeld; ++t)
        if (has[t]) acc += cur[t].term(c, xh[t]);
      acc = group_sum(acc);
      if (lane == 0) y[n] = T::from_float(acc);
#pragma unroll
      for (int t = 0; t < V::kHeld; ++t) cur[t] = next[t];
    }
    return;
  }
  port_pdl_wait();
  port_pdl_trigger();
  quantize_records<T, 1, kFusedThreads>(x, 0, k / kQK, threadIdx.x, rec);
  __syncthreads();
  for (; n < n_rows; n += stride) {
    const uint8_t* row = w + n * row_bytes;
    float acc = 0.0f;
    for (int base = 0; base < supers; base += kPer * kFusedSteps) {
      V p[kFusedSteps];
#pragma unroll
      for (int t = 0; t < kFusedSteps; ++t)
        if (base + s0 + kPer * t < supers) p[t].load(row + (base + s0 + kPer * t) * Q::kBytes, c);
#pragma unroll
      for (int t = 0; t < kFusedSteps; ++t) {
        const int s = base + s0 + kPer * t;
        if (s < supers) {
          typename V::X xs;
          V::xload(xs, acts_of_record(rec + s * kRecordWords), c);
          acc += p[t].term(c, xs);
        }
      }
    }
    acc = group_sum(acc);
    if (lane == 0) y[n] = T::from_float(acc);
  }
}

constexpr int kStages = 3;  // rows a group's LDS ring holds (the staged kernel): two in flight while one is read

// The staged variant of quant_mv1_fused_kernel for rows of at most 8 super-blocks (K <= 2048) of
// whole 16-byte pieces (row_bytes % 16 == 0): each group copies its rows into a ring of kStages
// row slots in LDS with port_copy16_async (cp.async on sm_80+: no register holds a row in flight),
// kStages - 1 rows ahead of the one it sums, so an SM keeps its groups' next two rows in flight where
// the register prefetch of quant_mv1_fused_kernel holds one. The lanes read MvOf<Q>'s pieces
// from the slot and sum them in quant_mv1_fused_kernel's order: the same bits. Where the target has
// no asynchronous copy (PORT_HAS_ASYNC_COPY 0) the copies are plain ones: correct, no overlap.
template <typename T, typename Q>
__global__ void __launch_bounds__(kFusedThreads)
    quant_mv1_staged_kernel(const typename T::storage* __restrict__ x, const uint8_t* __restrict__ w,
                            int64_t row_bytes, typename T::storage* __restrict__ y, int64_t n_rows, int k) {
  using V = typename MvOf<Q>::type;
  constexpr int kPer = kGroup / V::kLanes;  // super-blocks a step
  constexpr int kGroups = kFusedThreads / kGroup;
  constexpr int kSlot = 8 * Q::kBytes;  // a row of up to 8 super-blocks: a multiple of 16 bytes
  static_assert(kPer * V::kHeld >= 8, "the held activations must cover a slot's 8 super-blocks");
  __shared__ bytes16 rec_v[8 * kRecordWords / 4];
  __shared__ bytes16 ring_v[kGroups * kStages * kSlot / 16];
  uint32_t* rec = reinterpret_cast<uint32_t*>(rec_v);
  const int group = threadIdx.x / kGroup, lane = threadIdx.x % kGroup;
  const int c = lane % V::kLanes, s0 = lane / V::kLanes;
  const int supers = k / Q::kBlock, pieces = static_cast<int>(row_bytes / 16);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kGroups;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kGroups + group;
  uint8_t* ring = reinterpret_cast<uint8_t*>(ring_v) + group * (kStages * kSlot);
  // row n's pieces into a slot, one commit group whether or not the row exists (uniform counts)
  auto stage = [&](int64_t n, int slot) {
    if (n < n_rows) {
      const uint8_t* src = w + n * row_bytes + 16 * lane;
      uint8_t* dst = ring + slot * kSlot + 16 * lane;
#pragma unroll
      for (int i = 0; i < (kSlot / 16 + kGroup - 1) / kGroup; ++i)
        if (lane + kGroup * i < pieces) port_copy16_async(dst + 16 * kGroup * i, src + 16 * kGroup * i);
    }
    port_copy_commit();
  };
  if (PORT_HAS_L2_PREFETCH && first < n_rows) {  // hints only before the wait (launch_pdl)
    for (int64_t b = 128 * lane; b < row_bytes; b += 128 * kGroup) port_prefetch_l2(w + first * row_bytes + b);
  }
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl): w and x only after this
  port_pdl_trigger();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) stage(first + s * stride, s);
  quantize_records<T, 1, kFusedThreads>(x, 0, k / kQK, threadIdx.x, rec);
  __syncthreads();
  bool has[V::kHeld];
  typename V::X xh[V::kHeld];
#pragma unroll
  for (int t = 0; t < V::kHeld; ++t) {
    has[t] = s0 + kPer * t < supers;
    if (has[t]) V::xload(xh[t], acts_of_record(rec + (s0 + kPer * t) * kRecordWords), c);
  }
  int slot = 0;
  for (int64_t n = first; n < n_rows; n += stride) {  // uniform in a group: the shuffles stay in-group
    port_copy_wait<kStages - 2>();  // this lane's copies of row n have landed ...
    port_sync_group();              // ... and every lane's; every lane is done with the slot before
    stage(n + (kStages - 1) * stride, slot == 0 ? kStages - 1 : slot - 1);
    const uint8_t* row = ring + slot * kSlot;
    float acc = 0.0f;
#pragma unroll
    for (int t = 0; t < V::kHeld; ++t) {
      if (has[t]) {
        V p;
        p.load_slot(row, (s0 + kPer * t) * Q::kBytes, c);
        acc += p.term(c, xh[t]);
      }
    }
    acc = group_sum(acc);
    if (lane == 0) y[n] = T::from_float(acc);
    slot = slot == kStages - 1 ? 0 : slot + 1;
  }
  port_copy_wait<0>();  // no copy outlives the block's LDS
}

constexpr int kSlicedMaxK = 16384;  // x's activation records in LDS: 64 super-blocks, 21 KiB
constexpr int kSlice = 8;            // super-blocks a group's slice of a row (an lm_head row: 2048 weights)
constexpr int kSlicedRounds = 8;     // row rounds between the block's barriers (the slices' sums meet in LDS)

// Groups (32 lanes) a row of `supers` super-blocks takes in the sliced matvec: the fewest slices of
// kSlice that cover it, rounded up to a power of two (1, 2, 4 or 8); a block of 8 groups takes
// 8 / that rows a round.
__host__ __device__ constexpr int sliced_groups(int supers) {
  return supers <= kSlice ? 1 : supers <= 2 * kSlice ? 2 : supers <= 4 * kSlice ? 4 : 8;
}

// The one-row matvec of long rows (K up to kSlicedMaxK) in one launch: each block quantizes x into
// activation records in LDS, then its 8 groups of 32 lanes take G = sliced_groups(K / 256) groups a
// row, group j of a row summing super-blocks 8 j .. 8 j + 7 of it -- the fused kernel's held form
// (MvOf<Q>'s pieces, kHeld steps, activations held in registers for the whole kernel, the next
// row's pieces loaded before this row's terms are summed) on a slice rather than a whole row. The
// block walks rounds of 8 / G rows over a persistent grid; each group's sum lands in LDS, and every
// kSlicedRounds rounds (one barrier) the block adds each row's slices in order (slice 0 first) and
// writes y in x's dtype. Deterministic; its sums are grouped otherwise than fused's (held to the
// int8 bound, not to fused's bits). w 16-byte aligned.
// kGiven: x comes quantized already (q8 [K] int8, d8 and s8 [K / 32] fp32: quantize_q8_1_kernel's,
// launched before this one; 4-byte aligned), each lane reading its slice's activations from them
// into registers: no records, no quantization in the block (x is unread). Else q8, d8, s8 are unread.
template <typename T, typename Q, bool kGiven>
__global__ void __launch_bounds__(kFusedThreads)
    quant_mv1_sliced_kernel(const typename T::storage* __restrict__ x, const int8_t* __restrict__ q8,
                            const float* __restrict__ d8, const float* __restrict__ s8, const uint8_t* __restrict__ w,
                            int64_t row_bytes, typename T::storage* __restrict__ y, int64_t n_rows, int k) {
  using V = typename MvOf<Q>::type;
  constexpr int kPer = kGroup / V::kLanes;  // super-blocks a step
  constexpr int kGroups = kFusedThreads / kGroup;
  static_assert(kPer * V::kHeld == kSlice, "a group's held steps are its slice");
  __shared__ float part[2][kSlicedRounds][kGroups];  // two sets: one barrier a set
  const int group = threadIdx.x / kGroup, lane = threadIdx.x % kGroup;
  const int c = lane % V::kLanes, s0 = lane / V::kLanes;
  const int supers = k / Q::kBlock, g = sliced_groups(supers), per_round = kGroups / g;
  const int j = group % g, r = group / g;  // this group's slice and its row in a round
  const int64_t stride = static_cast<int64_t>(gridDim.x) * per_round;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * per_round;
  bool has[V::kHeld];
  int off[V::kHeld];  // the step's super-block, in bytes into a row
#pragma unroll
  for (int t = 0; t < V::kHeld; ++t) {
    const int s = kSlice * j + s0 + kPer * t;
    has[t] = s < supers;
    off[t] = s * Q::kBytes;
    if (PORT_HAS_L2_PREFETCH && has[t] && first + r < n_rows)  // hints only before the wait (launch_pdl)
      port_prefetch_l2(w + (first + r) * row_bytes + off[t] + Q::kBytes * c / V::kLanes);
  }
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl): w and x only after this
  port_pdl_trigger();
  V cur[V::kHeld];
#pragma unroll
  for (int t = 0; t < V::kHeld; ++t)
    if (has[t] && first + r < n_rows) cur[t].load(w + (first + r) * row_bytes + off[t], c);
  typename V::X xh[V::kHeld];
  if constexpr (kGiven) {
#pragma unroll
    for (int t = 0; t < V::kHeld; ++t)
      if (has[t]) V::xload(xh[t], acts_of_q8(q8, d8, s8, off[t] / Q::kBytes), c);
  } else {
    __shared__ bytes16 rec_v[kSlicedMaxK / 256 * kRecordWords / 4];
    uint32_t* rec = reinterpret_cast<uint32_t*>(rec_v);
    quantize_records<T, 1, kFusedThreads>(x, 0, k / kQK, threadIdx.x, rec);
    __syncthreads();
#pragma unroll
    for (int t = 0; t < V::kHeld; ++t)
      if (has[t]) V::xload(xh[t], acts_of_record(rec + (off[t] / Q::kBytes) * kRecordWords), c);
  }
  int round = 0, set = 0;
  for (int64_t base = first; base < n_rows; base += stride) {  // uniform in the block: the barriers
    const int64_t n = base + r, next_n = n + stride;
    V next[V::kHeld];
#pragma unroll
    for (int t = 0; t < V::kHeld; ++t)
      if (has[t] && next_n < n_rows) next[t].load(w + next_n * row_bytes + off[t], c);
    float acc = 0.0f;
    if (n < n_rows) {
#pragma unroll
      for (int t = 0; t < V::kHeld; ++t)
        if (has[t]) acc += cur[t].term(c, xh[t]);
    }
    acc = group_sum(acc);
    if (lane == 0) part[set][round][group] = acc;
#pragma unroll
    for (int t = 0; t < V::kHeld; ++t) cur[t] = next[t];
    if (++round == kSlicedRounds || base + stride >= n_rows) {
      __syncthreads();  // the set's sums are in; the other set's readers are past this barrier
      if (threadIdx.x < round * per_round) {
        const int q = threadIdx.x / per_round, rr = threadIdx.x % per_round;
        const int64_t row = base - (round - 1 - q) * stride + rr;
        if (row < n_rows) {
          float sum = 0.0f;
          for (int i = 0; i < g; ++i) sum += part[set][q][rr * g + i];
          y[row] = T::from_float(sum);
        }
      }
      round = 0;
      set ^= 1;
    }
  }
}

#define FTLAB_QMM_ONE(K, T, Q) \
  template __global__ void K<T, Q>(const T::storage*, const uint8_t*, int64_t, T::storage*, int64_t, int);
#define FTLAB_QMM_SLICED(T, Q, GIVEN)                                                                        \
  template __global__ void quant_mv1_sliced_kernel<T, Q, GIVEN>(const T::storage*, const int8_t*, const float*, \
                                                                const float*, const uint8_t*, int64_t, T::storage*, \
                                                                int64_t, int);
#define FTLAB_QMM_FUSED(T, Q) \
  FTLAB_QMM_ONE(quant_mv1_fused_kernel, T, Q) FTLAB_QMM_SLICED(T, Q, false) FTLAB_QMM_SLICED(T, Q, true)
#define FTLAB_QMM_FUSED_STAGED(T, Q) FTLAB_QMM_FUSED(T, Q) FTLAB_QMM_ONE(quant_mv1_staged_kernel, T, Q)
// Q8_0 has no staged form: three slots of eight of its 272-byte groups a lane group are 52 KiB of LDS
#define FTLAB_QMM_FUSED_T(T)                                                                 \
  FTLAB_QMM_FUSED_STAGED(T, QK4<false>) FTLAB_QMM_FUSED_STAGED(T, QK4<true>) FTLAB_QMM_FUSED_STAGED(T, Q6_K) \
  FTLAB_QMM_FUSED_STAGED(T, Q4_0x8) FTLAB_QMM_FUSED(T, Q8_0x8)
FTLAB_QMM_FUSED_T(f32_t)
FTLAB_QMM_FUSED_T(f16_t)
FTLAB_QMM_FUSED_T(bf16_t)
#undef FTLAB_QMM_FUSED_T
#undef FTLAB_QMM_FUSED_STAGED
#undef FTLAB_QMM_FUSED
#undef FTLAB_QMM_ONE
#undef FTLAB_QMM_SLICED

}  // namespace qmm
}  // namespace ftlab

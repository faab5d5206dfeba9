// moe.hip — device code of the routed experts of Qwen3-MoE at decode: per (token, slot)
// matvecs, gate/up + SwiGLU then down weighted and summed over the slots, for Q4_0 banks
// through the int8 dot and for dense banks in fp32. The router and align step are in
// moe_route.hip, the prefill grouped GEMMs in moe_gemm.hip, the decode kernels for banks of
// whole-superblock rows in moe_regions.hip.
//
// Contract: docs/OPS.md section 3 (moe_experts); reference: ftlab/reference/moe.py.
// Includes moe_common.h (then q4_0_common.h and port.h) only: the gfx compile check compiles
// this file alone.
#include "moe_common.h"

namespace ftlab {

// ------------------------------------------------------------------ decode experts, Q4_0

constexpr int kLanesPerRow = 8;                        // lanes sharing a Q4_0 weight row
constexpr int kGateUpThreads = 2 * kQK * kLanesPerRow; // 64 weight rows (32 gate + 32 up): 512

// Q8_1 of one row of nb blocks into LDS (block b's q at words 9b..9b+7, d[b], s[b]), four
// threads a block, eight elements each, amax and sum by shuffles: q8_1_block's arithmetic
// (q8_1_word), so bit-identical to quantize_q8_1_kernel. Same trip count in every thread.
template <typename T, int THREADS>
__device__ void stage_q8_1_row(const typename T::storage* src, int nb, uint32_t* q, float* d, float* s) {
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0;  // then every 8-element piece is
  for (int t0 = 0; t0 < 4 * nb; t0 += THREADS) {
    const int t = t0 + threadIdx.x;
    const bool active = t < 4 * nb;
    const int b = active ? t / 4 : 0, quarter = t % 4;
    float v[8];
    load8<T>(src + b * kQK + 8 * quarter, vec, v);
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[i] = active ? v[i] : 0.0f;
      amax = __builtin_fmaxf(amax, __builtin_fabsf(v[i]));
    }
    amax = __builtin_fmaxf(amax, port_shfl_xor(amax, 1));
    amax = __builtin_fmaxf(amax, port_shfl_xor(amax, 2));
    const float dd = port_div_rn(amax, 127.0f);
    int sum = 0;
    const uint32_t w0 = q8_1_word(&v[0], amax, dd, &sum), w1 = q8_1_word(&v[4], amax, dd, &sum);
    sum += port_shfl_xor(sum, 1);
    sum += port_shfl_xor(sum, 2);
    if (active) {
      q[b * kQ8Stride + 2 * quarter] = w0;
      q[b * kQ8Stride + 2 * quarter + 1] = w1;
      if (quarter == 0) {
        d[b] = dd;
        s[b] = dd * static_cast<float>(sum);
      }
    }
  }
}

// One Q4_0 block in registers: the fp16 scale as fp32 and the four qs words.
struct Q4Block {
  float d;
  uint32_t qs[4];
};

__device__ __forceinline__ Q4Block load_q4_block(const uint8_t* row, int b) {
  const uint16_t* blk = reinterpret_cast<const uint16_t*>(row + static_cast<int64_t>(b) * kBlockBytes);
  Q4Block r;
  r.d = port_half_to_float(blk[0]);
#pragma unroll
  for (int i = 0; i < 4; ++i) r.qs[i] = static_cast<uint32_t>(blk[1 + 2 * i]) | (static_cast<uint32_t>(blk[2 + 2 * i]) << 16);
  return r;
}

// d4 * (d8 * sumi - 8 * s8) of block b against Q8_1 activations (block b's words at q + b * QS).
template <int QS>
__device__ __forceinline__ float q4_block_term(const Q4Block& w, int b, const uint32_t* q, const float* d,
                                               const float* s) {
  int q8[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) q8[i] = static_cast<int>(q[b * QS + i]);
  return w.d * (d[b] * static_cast<float>(block_dot(w.qs, q8)) - 8.0f * s[b]);
}

// Superblocks: 8 consecutive blocks, 144 bytes = 9 x 16; rows whose block count is a
// multiple of 8 (and a 16-byte aligned bank) keep them 16-byte aligned, so a lane reads
// its superblock with nine 16-byte loads. Other rows are read block by block.
struct Super {
  uint32_t w[kSuperBytes / 4];
};

__device__ __forceinline__ void load_super(Super& s, const uint8_t* row, int sb) {
  const bytes16* p = reinterpret_cast<const bytes16*>(row + static_cast<int64_t>(sb) * kSuperBytes);
#pragma unroll
  for (int t = 0; t < kSuperBytes / 16; ++t) words_of(p[t], &s.w[4 * t]);
}

// The 8 block terms of superblock sb: block pair p is words 9p..9p+8 (block A's scale in the
// low half of word 9p and its qs straddling words 9p..9p+4; block B's scale in the high half
// of word 9p + 4, its qs words 9p + 5..9p + 8).
template <int QS>
__device__ __forceinline__ float super_terms(const Super& sp, int sb, const uint32_t* q, const float* d,
                                             const float* s) {
  float acc = 0.0f;
#pragma unroll
  for (int p = 0; p < kSuperBlocks / 2; ++p) {
    Q4Block a, b;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a.qs[i] = (sp.w[9 * p + i] >> 16) | (sp.w[9 * p + i + 1] << 16);
      b.qs[i] = sp.w[9 * p + 5 + i];
    }
    a.d = port_half_to_float(static_cast<uint16_t>(sp.w[9 * p] & 0xffff));
    b.d = port_half_to_float(static_cast<uint16_t>(sp.w[9 * p + 4] >> 16));
    const int blk = sb * kSuperBlocks + 2 * p;
    acc += q4_block_term<QS>(a, blk, q, d, s);
    acc += q4_block_term<QS>(b, blk + 1, q, d, s);
  }
  return acc;
}

// The int8 dot of a Q4_0 row with Q8_1 activations over the row's LANES lanes: superblocks
// sub, sub + LANES, ... (`wide`: the row is superblock-aligned; `first`: the lane's first
// superblock, already loaded, when `have_first`), then the blocks past the last whole superblock (all of them
// when not `wide`), reduced over the lanes. `live` false: 0 (the shuffles still run).
template <int LANES, int QS>
__device__ __forceinline__ float q4_row_dot(const Super& first, bool have_first, const uint8_t* row, int nb,
                                            const uint32_t* q, const float* d, const float* s, int sub, bool wide,
                                            bool live) {
  float acc = 0.0f;
  if (live) {
    const int nsb = wide ? nb / kSuperBlocks : 0;
    int sb = sub;
    if (have_first && sb < nsb) {
      acc += super_terms<QS>(first, sb, q, d, s);
      sb += LANES;
    }
    for (; sb < nsb; sb += LANES) {
      Super w;
      load_super(w, row, sb);
      acc += super_terms<QS>(w, sb, q, d, s);
    }
    for (int b = nsb * kSuperBlocks + sub; b < nb; b += LANES) {
      acc += q4_block_term<QS>(load_q4_block(row, b), b, q, d, s);
    }
  }
#pragma unroll
  for (int off = 1; off < LANES; off <<= 1) acc += port_shfl_xor(acc, off);
  return acc;
}

// One block of 512 threads per (pair, 32 rows of h): 64 weight rows (32 gate, 32 up) of
// expert ids[pair], 8 lanes a row; each lane asks the L2 for its superblocks (where the target
// has the hint; else it loads its first one into registers), then x[pair / k] is quantized
// to Q8_1 in LDS (the loads in flight meanwhile), then the dots; one group forms
// h = silu(g) * u for the 32 rows and writes it as one Q8_1 block (q int8 [pairs, I], d and
// s fp32 [pairs, I/32]), the arithmetic of quantize_q8_1_kernel on fp32 h. With the hint, the
// blocks of a pair also ask the L2 for the down rows of its expert (down_bank, a share each),
// which the down launch reads next. An invalid id reads no expert memory and writes the zero
// block.
template <typename T>
__global__ void __launch_bounds__(kGateUpThreads)
    moe_gate_up_q4_kernel(const typename T::storage* __restrict__ x, int64_t x_stride,
                          const uint8_t* __restrict__ bank, int64_t e_stride, int64_t row_bytes,
                          const int32_t* __restrict__ ids, int8_t* __restrict__ hq, float* __restrict__ hd,
                          float* __restrict__ hs, int num_experts, int hidden, int inter, int top_k, bool wide,
                          const uint8_t* __restrict__ down_bank, int64_t down_e_stride, int64_t down_bytes) {
  __shared__ uint32_t xq[kMaxQ8Blocks * kQ8Stride];
  __shared__ float xd[kMaxQ8Blocks], xs[kMaxQ8Blocks];
  __shared__ float gu[2 * kQK];
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
  const int nb = hidden / kQK;
  const int r = threadIdx.x / kLanesPerRow;  // 0..31 gate, 32..63 up
  const int sub = threadIdx.x % kLanesPerRow;
  const uint8_t* row = bank + e * e_stride + (r < kQK ? n0 + r : inter + n0 + (r - kQK)) * row_bytes;
  Super pre;  // without the L2 hint: the lane's first superblock, in flight while x is quantized
  const bool pre_ok = !PORT_HAS_L2_PREFETCH && wide && sub < nb / kSuperBlocks;
  if (pre_ok) load_super(pre, row, sub);
  if (PORT_HAS_L2_PREFETCH) {
    if (wide) {
      for (int sb = sub; sb < nb / kSuperBlocks; sb += kLanesPerRow) {  // the three lines a superblock may touch
        const uint8_t* p = row + static_cast<int64_t>(sb) * kSuperBytes;
        port_prefetch_l2(p);
        port_prefetch_l2(p + kSuperBytes / 2);
        port_prefetch_l2(p + kSuperBytes - 1);
      }
    }
    if (down_bank != nullptr) {  // this block's share of expert e's down matrix, 128-byte lines
      const int64_t share = (down_bytes + gridDim.y * 128 - 1) / (gridDim.y * 128) * 128;
      const int64_t begin = blockIdx.y * share, end = begin + share < down_bytes ? begin + share : down_bytes;
      const uint8_t* base = down_bank + e * down_e_stride;
      for (int64_t off = begin + threadIdx.x * 128; off < end; off += kGateUpThreads * 128) port_prefetch_l2(base + off);
    }
  }
  stage_q8_1_row<T, kGateUpThreads>(x + (pair / top_k) * x_stride, nb, xq, xd, xs);
  __syncthreads();
  const float v = q4_row_dot<kLanesPerRow, kQ8Stride>(pre, pre_ok, row, nb, xq, xd, xs, sub, wide, true);
  if (sub == 0) gu[r] = v;
  __syncthreads();
  if (threadIdx.x < kQK) silu_mul_q8_1(gu, threadIdx.x, hq + pair * inter + n0, hd + hb, hs + hb);
}

// One block per (token, 8 rows of y): group g takes slots g, g + 8, ..., 4 lanes a row, each
// slot's int8 dot of its expert's down row with that pair's Q8_1 h (read from memory); then
// y[t, n] = sum_j w[t, j] * part_j, the slots in order. Invalid ids read nothing.

template <typename T>
__global__ void __launch_bounds__(kMoeThreads)
    moe_down_q4_kernel(const int8_t* __restrict__ hq, const float* __restrict__ hd, const float* __restrict__ hs,
                       const uint8_t* __restrict__ bank, int64_t e_stride, int64_t row_bytes,
                       const int32_t* __restrict__ ids, const float* __restrict__ wts,
                       typename T::storage* __restrict__ y, int64_t y_stride, int num_experts, int hidden,
                       int inter, int top_k, bool wide) {
  __shared__ float parts[kMaxSlots][kDownRows];
  port_pdl_wait();  // launched dependent on the kernel before (launch_pdl)
  port_pdl_trigger();
  const int64_t t = blockIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kDownRows;
  const int lane = threadIdx.x % kMoeGroup, group = threadIdx.x / kMoeGroup;
  const int r = lane / kDownLanes, sub = lane % kDownLanes;
  const int64_t n = n0 + r;
  const int nb = inter / kQK;
  for (int j = group; j < top_k; j += kMoeRows) {
    const int64_t pair = t * top_k + j;
    const int e = ids[pair];
    const bool live = e >= 0 && e < num_experts && n < hidden;
    const uint8_t* row = bank + (live ? e * e_stride + n * row_bytes : 0);
    const Super none{};
    const float v = q4_row_dot<kDownLanes, 8>(none, false, row, nb, reinterpret_cast<const uint32_t*>(hq + pair * inter),
                                               hd + pair * nb, hs + pair * nb, sub, wide, live);
    if (sub == 0) parts[j][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < kDownRows && n0 + threadIdx.x < hidden) {
    float acc = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const int e = ids[t * top_k + j];
      if (e >= 0 && e < num_experts) acc += wts[t * top_k + j] * parts[j][threadIdx.x];
    }
    y[t * y_stride + n0 + threadIdx.x] = T::from_float(acc);
  }
}

// ------------------------------------------------------------------ decode experts, dense

template <typename T>
__device__ void stage_f32(const typename T::storage* src, int64_t stride, int rows, int len, float* dst) {
  for (int i = threadIdx.x; i < rows * len; i += kMoeThreads) dst[i] = T::load(src + (i / len) * stride + i % len);
}

template <typename W>
__device__ __forceinline__ float dense_row_dot(const typename W::storage* row, int len, const float* x, int lane) {
  float acc = 0.0f;
  for (int i = lane; i < len; i += kMoeGroup) acc += W::load(row + i) * x[i];
  return group_sum(acc);
}

// h[pair, n] = silu(g) * u, g and u row n and row I + n of expert ids[pair] (dtype T)
// applied to x[pair / k] (fp32 in LDS); one block per (pair, 8 rows), a 32-lane group per
// row. An invalid id reads nothing and writes h = 0.
template <typename T>
__global__ void __launch_bounds__(kMoeThreads)
    moe_gate_up_dense_kernel(const typename T::storage* __restrict__ x, int64_t x_stride,
                             const typename T::storage* __restrict__ bank, int64_t e_stride, int64_t row_stride,
                             const int32_t* __restrict__ ids, float* __restrict__ h, int num_experts, int hidden,
                             int inter, int top_k) {
  __shared__ float xs[kDecodeFloats];
  const int pair = blockIdx.x;
  const int e = ids[pair];
  const int n = blockIdx.y * kMoeRows + threadIdx.x / kMoeGroup;
  const int lane = threadIdx.x % kMoeGroup;
  if (e < 0 || e >= num_experts) {  // the whole block: no expert memory is read
    if (lane == 0 && n < inter) h[static_cast<int64_t>(pair) * inter + n] = 0.0f;
    return;
  }
  stage_f32<T>(x + static_cast<int64_t>(pair / top_k) * x_stride, 0, 1, hidden, xs);
  __syncthreads();
  if (n >= inter) return;
  const typename T::storage* w = bank + e * e_stride;
  const float g = dense_row_dot<T>(w + n * row_stride, hidden, xs, lane);
  const float u = dense_row_dot<T>(w + (inter + n) * row_stride, hidden, xs, lane);
  if (lane == 0) h[static_cast<int64_t>(pair) * inter + n] = g / (1.0f + port_expf(-g)) * u;
}

// y[t, n] = sum_j w[t, j] * (row n of expert ids[t, j] applied to h[t * k + j]), the slots
// in order; one block per (token, 8 rows), h's k rows staged in LDS.
template <typename T>
__global__ void __launch_bounds__(kMoeThreads)
    moe_down_dense_kernel(const float* __restrict__ h, const typename T::storage* __restrict__ bank,
                          int64_t e_stride, int64_t row_stride, const int32_t* __restrict__ ids,
                          const float* __restrict__ wts, typename T::storage* __restrict__ y, int64_t y_stride,
                          int num_experts, int hidden, int inter, int top_k) {
  __shared__ float hs[kDecodeFloats];
  const int64_t t = blockIdx.x;
  const int n = blockIdx.y * kMoeRows + threadIdx.x / kMoeGroup;
  const int lane = threadIdx.x % kMoeGroup;
  stage_f32<f32_t>(h + t * top_k * inter, inter, top_k, inter, hs);
  __syncthreads();
  if (n >= hidden) return;
  float acc = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    const int64_t pair = t * top_k + j;
    const int e = ids[pair];
    if (e < 0 || e >= num_experts) continue;  // contributes nothing, reads nothing
    acc += wts[pair] * dense_row_dot<T>(bank + e * e_stride + n * row_stride, inter, hs + j * inter, lane);
  }
  if (lane == 0) y[t * y_stride + n] = T::from_float(acc);
}

// Every configuration the launcher uses.
#define FTLAB_MOE_DECODE_INSTANTIATE(T)                                                                 \
  template __global__ void moe_gate_up_q4_kernel<T>(const T::storage*, int64_t, const uint8_t*, int64_t, \
                                                    int64_t, const int32_t*, int8_t*, float*, float*, int, \
                                                    int, int, int, bool, const uint8_t*, int64_t, int64_t);                               \
  template __global__ void moe_down_q4_kernel<T>(const int8_t*, const float*, const float*, const uint8_t*, \
                                                 int64_t, int64_t, const int32_t*, const float*, T::storage*, \
                                                 int64_t, int, int, int, int, bool);                    \
  template __global__ void moe_gate_up_dense_kernel<T>(const T::storage*, int64_t, const T::storage*,    \
                                                       int64_t, int64_t, const int32_t*, float*, int, int, \
                                                       int, int);                                       \
  template __global__ void moe_down_dense_kernel<T>(const float*, const T::storage*, int64_t, int64_t,   \
                                                    const int32_t*, const float*, T::storage*, int64_t, int, \
                                                    int, int, int);
FTLAB_MOE_DECODE_INSTANTIATE(f32_t)
FTLAB_MOE_DECODE_INSTANTIATE(f16_t)
FTLAB_MOE_DECODE_INSTANTIATE(bf16_t)

}  // namespace ftlab

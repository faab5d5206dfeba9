// moe_launch.hip — host glue for moe_route.hip, moe.hip and moe_gemm.hip: tvm-ffi entry points taking torch tensors (via
// DLPack) and launching on torch's current stream. ftlab.hip.moe allocates the outputs and
// picks decode or grouped GEMM; the checks here keep a direct caller in bounds.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include "launch_common.h"
#include "moe.hip"
#include "moe_regions.hip"
#include "moe_gemm.hip"
#include "moe_route.hip"

namespace ftlab {

using tvm::ffi::TensorView;
using namespace launch;

namespace {

bool is_q4_bank(const TensorView& w) { return w.dtype().code == kDLUInt && w.dtype().bits == 8; }

void check_i32(const TensorView& t, const char* name) {
  check_contiguous(t, name);
  TVM_FFI_CHECK(t.dtype().code == kDLInt && t.dtype().bits == 32, TypeError) << name << " must be int32";
}

void check_f32(const TensorView& t, const char* name) {
  check_contiguous(t, name);
  TVM_FFI_CHECK(t.dtype().code == kDLFloat && t.dtype().bits == 32, TypeError) << name << " must be float32";
}

// A bank [E, N, K] (dense, x's dtype) or [E, N, K/32*18] (Q4_0 bytes); strides in elements.
struct Bank {
  const void* data;
  int64_t e_stride, row_stride, experts, rows;
  bool q4;
};

Bank bank_of(const TensorView& w, const TensorView& x, int64_t k, const char* name) {
  check_contiguous(w, name);
  TVM_FFI_CHECK(w.ndim() == 3, ValueError) << name << " must be a bank [E, N, K]";
  const bool q4 = is_q4_bank(w);
  if (q4) {
    TVM_FFI_CHECK(w.size(2) == k / kQK * kBlockBytes && k % kQK == 0, ValueError)
        << name << " must hold K/32 Q4_0 blocks of 18 bytes per row, K = " << k;
  } else {
    TVM_FFI_CHECK(w.size(2) == k, ValueError) << name << " must have K = " << k << " columns";
    TVM_FFI_CHECK(fp_of(w, name) == fp_of(x, "x"), TypeError) << name << " must have x's dtype";
  }
  return {base_of(w), w.stride(0), w.stride(1), w.size(0), w.size(1), q4};
}

unsigned cdiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace

#include "moe_route_launch.h"  // route_topk, router_topk, the norm + router

// moe_align: ids int32 [pairs] -> sorted [capacity], expert_ids [capacity / block_m], npad [1];
// counts int32 [E] is scratch.
void moe_align(TensorView ids, TensorView counts, TensorView sorted, TensorView expert_ids, TensorView npad,
               int64_t block_m) {
  check_i32(ids, "ids");
  check_i32(counts, "counts");
  check_i32(sorted, "sorted");
  check_i32(expert_ids, "expert_ids");
  check_i32(npad, "npad");
  const int64_t pairs = ids.numel(), experts = counts.numel(), capacity = sorted.numel();
  TVM_FFI_CHECK(block_m >= 1 && capacity % block_m == 0 && expert_ids.numel() == capacity / block_m &&
                    capacity >= pairs + experts * (block_m - 1) && npad.numel() == 1 && pairs < (int64_t{1} << 31),
                ValueError)
      << "sorted must hold the align capacity, expert_ids capacity / block_m, npad one value";
  if (experts == 0) return;
  port_stream_t st = stream_of(sorted);
  const int32_t* ip = static_cast<const int32_t*>(base_of(ids));
  int32_t* cp = static_cast<int32_t*>(base_of(counts));
  moe_align_count_kernel<<<static_cast<unsigned>(experts), kMoeThreads, 0, st>>>(ip, pairs, cp);
  moe_align_scatter_kernel<<<static_cast<unsigned>(experts), kMoeThreads, 0, st>>>(
      ip, pairs, cp, static_cast<int>(experts), static_cast<int>(block_m), static_cast<int32_t*>(base_of(sorted)),
      static_cast<int32_t*>(base_of(expert_ids)), static_cast<int32_t*>(base_of(npad)), capacity);
  check_launch("moe_align kernels");
}

namespace {
struct DecodeArgs {
  int64_t t, hidden, inter, top_k;
  Bank gu, dn;
};

DecodeArgs decode_args(const TensorView& x, const TensorView& w_gate_up, const TensorView& w_down,
                       const TensorView& ids, const TensorView& wts, const TensorView& y, int64_t inter) {
  TVM_FFI_CHECK(x.ndim() == 2 && (x.size(1) <= 1 || x.stride(1) == 1), ValueError)
      << "x must be [T, H] with contiguous rows";
  const int64_t t = x.size(0), hidden = x.size(1);
  check_i32(ids, "ids");
  check_f32(wts, "wts");
  check_contiguous(y, "y");
  TVM_FFI_CHECK(ids.ndim() == 2 && ids.size(0) == t && wts.numel() == ids.numel(), ValueError)
      << "ids and wts must be [T, k]";
  const int64_t top_k = ids.size(1);
  const Bank gu = bank_of(w_gate_up, x, hidden, "w_gate_up");
  const Bank dn = bank_of(w_down, x, inter, "w_down");
  TVM_FFI_CHECK(gu.q4 == dn.q4 && gu.rows == 2 * inter && dn.rows == hidden && gu.experts == dn.experts, ValueError)
      << "banks must be w_gate_up [E, 2I, H] and w_down [E, H, I] of one kind";
  TVM_FFI_CHECK(y.ndim() == 2 && y.size(0) == t && y.size(1) == hidden && fp_of(y, "y") == fp_of(x, "x"), ValueError)
      << "y must be [T, H] in x's dtype";
  TVM_FFI_CHECK(hidden <= kDecodeFloats && top_k * inter <= kDecodeFloats && top_k >= 1 && top_k <= kMaxSlots &&
                    hidden % kQK == 0 && inter % kQK == 0,
                ValueError)
      << "the decode experts take H and k * I up to " << kDecodeFloats << ", multiples of 32, and 1 <= k <= "
      << kMaxSlots << ", got H = " << hidden << ", I = " << inter << ", k = " << top_k;
  return {t, hidden, inter, top_k, gu, dn};
}

// Whether a Q4_0 bank's rows are superblock-aligned (16-byte aligned rows of 8k blocks).
bool wide(const Bank& b) {
  return b.row_stride % kSuperBytes == 0 && reinterpret_cast<uintptr_t>(b.data) % 16 == 0;
}

template <typename T>
void launch_decode_q4(const DecodeArgs& a, const TensorView& x, const TensorView& ids, const TensorView& wts,
                      const TensorView& hq, const TensorView& hd, const TensorView& hs, const TensorView& y) {
  port_stream_t st = stream_of(y);
  const int32_t* ip = static_cast<const int32_t*>(base_of(ids));
  const int experts = static_cast<int>(a.gu.experts);
  const int hidden = static_cast<int>(a.hidden), inter = static_cast<int>(a.inter), k = static_cast<int>(a.top_k);
  int8_t* qp = static_cast<int8_t*>(base_of(hq));
  float* dp = static_cast<float*>(base_of(hd));
  float* sp = static_cast<float*>(base_of(hs));
  const auto* xp = static_cast<const typename T::storage*>(base_of(x));
  const auto* gp = static_cast<const uint8_t*>(a.gu.data);
  const auto* np = static_cast<const uint8_t*>(a.dn.data);
  const float* wp = static_cast<const float*>(base_of(wts));
  auto* yp = static_cast<typename T::storage*>(base_of(y));
  const int64_t down_bytes = a.dn.rows * a.dn.row_stride;
  const dim3 gu_grid(static_cast<unsigned>(a.t * a.top_k), cdiv(a.inter, kQK));
  const dim3 dn_grid(static_cast<unsigned>(a.t), cdiv(a.hidden, kDownRows));
  if (wide(a.gu) && wide(a.dn)) {  // superblock-aligned rows: the region kernels (coalesced loads)
    // packed rows that a region spans whole: linear regions (moe_regions.hip)
    const int gu_supers = hidden / kQK / kSuperBlocks, dn_supers = inter / kQK / kSuperBlocks;
    const bool gu_linear = a.gu.row_stride == gu_supers * kSuperBytes && gu_supers <= kGateUpLanes;
    const bool dn_linear = a.dn.row_stride == dn_supers * kSuperBytes && dn_supers <= kDownLanes;
    auto gu_kernel = gu_linear ? moe_gate_up_q4_regions_kernel<T, true> : moe_gate_up_q4_regions_kernel<T, false>;
    auto dn_kernel = dn_linear ? moe_down_q4_regions_kernel<T, true> : moe_down_q4_regions_kernel<T, false>;
    // each gate/up block asks the L2 for its share of its expert's down matrix (128-byte lines)
    const int64_t down_share = (down_bytes + gu_grid.y * 128 - 1) / (gu_grid.y * 128) * 128;
    launch_pdl(gu_kernel, gu_grid, dim3(kMoeThreads), st, xp, x.stride(0), gp, a.gu.e_stride,
               a.gu.row_stride, ip, qp, dp, sp, experts, hidden, inter, k, np, a.dn.e_stride, down_bytes,
               down_share);
    launch_pdl(dn_kernel, dn_grid, dim3(kMoeThreads), st, qp, dp, sp, np, a.dn.e_stride,
               a.dn.row_stride, ip, wp, yp, y.stride(0), experts, hidden, inter, k);
    return;
  }
  launch_pdl(moe_gate_up_q4_kernel<T>, gu_grid, dim3(kGateUpThreads), st, xp, x.stride(0), gp, a.gu.e_stride,
             a.gu.row_stride, ip, qp, dp, sp, experts, hidden, inter, k, wide(a.gu), np, a.dn.e_stride, down_bytes);
  launch_pdl(moe_down_q4_kernel<T>, dn_grid, dim3(kMoeThreads), st, qp, dp, sp, np, a.dn.e_stride, a.dn.row_stride, ip,
             wp, yp, y.stride(0), experts, hidden, inter, k, wide(a.dn));
}

template <typename T>
void launch_decode_dense(const DecodeArgs& a, const TensorView& x, const TensorView& ids, const TensorView& wts,
                         const TensorView& h, const TensorView& y) {
  port_stream_t st = stream_of(y);
  const int32_t* ip = static_cast<const int32_t*>(base_of(ids));
  const int experts = static_cast<int>(a.gu.experts);
  const int hidden = static_cast<int>(a.hidden), inter = static_cast<int>(a.inter), k = static_cast<int>(a.top_k);
  const auto* gw = static_cast<const typename T::storage*>(a.gu.data);
  const auto* dw = static_cast<const typename T::storage*>(a.dn.data);
  moe_gate_up_dense_kernel<T><<<dim3(static_cast<unsigned>(a.t * a.top_k), cdiv(a.inter, kMoeRows)), kMoeThreads, 0,
                                st>>>(static_cast<const typename T::storage*>(base_of(x)), x.stride(0), gw,
                                      a.gu.e_stride, a.gu.row_stride, ip, static_cast<float*>(base_of(h)), experts,
                                      hidden, inter, k);
  moe_down_dense_kernel<T><<<dim3(static_cast<unsigned>(a.t), cdiv(a.hidden, kMoeRows)), kMoeThreads, 0, st>>>(
      static_cast<const float*>(base_of(h)), dw, a.dn.e_stride, a.dn.row_stride, ip,
      static_cast<const float*>(base_of(wts)), static_cast<typename T::storage*>(base_of(y)), y.stride(0), experts,
      hidden, inter, k);
}
}  // namespace

// Decode experts on Q4_0 banks (int8 path): x [T, H], w_gate_up [E, 2I, H/32*18], w_down
// [E, H, I/32*18], ids int32 / wts fp32 [T, k]; scratch hq int8 [T * k, I], hd / hs fp32
// [T * k, I/32] (h as Q8_1); y [T, H] in x's dtype. H and k * I at most 8192, k at most 32.
void moe_experts_decode_q4(TensorView x, TensorView w_gate_up, TensorView w_down, TensorView ids, TensorView wts,
                           TensorView hq, TensorView hd, TensorView hs, TensorView y) {
  check_contiguous(hq, "hq");
  check_f32(hd, "hd");
  check_f32(hs, "hs");
  TVM_FFI_CHECK(hq.ndim() == 2, ValueError) << "hq must be [T * k, I]";
  const DecodeArgs a = decode_args(x, w_gate_up, w_down, ids, wts, y, hq.size(1));
  TVM_FFI_CHECK(a.gu.q4 && hq.size(0) == a.t * a.top_k && hd.numel() == hq.numel() / kQK && hs.numel() == hd.numel(),
                ValueError)
      << "Q4_0 banks, hq [T * k, I] and hd, hs [T * k, I/32]";
  if (a.t == 0) return;
  switch (fp_of(x, "x")) {
    case Fp::f32: launch_decode_q4<f32_t>(a, x, ids, wts, hq, hd, hs, y); break;
    case Fp::f16: launch_decode_q4<f16_t>(a, x, ids, wts, hq, hd, hs, y); break;
    case Fp::bf16: launch_decode_q4<bf16_t>(a, x, ids, wts, hq, hd, hs, y); break;
  }
  check_launch("moe Q4_0 decode kernels");
}

// Decode experts on dense banks (x's dtype): h fp32 [T * k, I] scratch; as above otherwise.
void moe_experts_decode_dense(TensorView x, TensorView w_gate_up, TensorView w_down, TensorView ids, TensorView wts,
                              TensorView h, TensorView y) {
  check_f32(h, "h");
  TVM_FFI_CHECK(h.ndim() == 2, ValueError) << "h must be [T * k, I]";
  const DecodeArgs a = decode_args(x, w_gate_up, w_down, ids, wts, y, h.size(1));
  TVM_FFI_CHECK(!a.gu.q4 && h.size(0) == a.t * a.top_k, ValueError) << "dense banks and h [T * k, I]";
  if (a.t == 0) return;
  switch (fp_of(x, "x")) {
    case Fp::f32: launch_decode_dense<f32_t>(a, x, ids, wts, h, y); break;
    case Fp::f16: launch_decode_dense<f16_t>(a, x, ids, wts, h, y); break;
    case Fp::bf16: launch_decode_dense<bf16_t>(a, x, ids, wts, h, y); break;
  }
  check_launch("moe dense decode kernels");
}

namespace {
struct Align {
  const int32_t* sorted;
  const int32_t* expert_ids;
  const int32_t* npad;
  int64_t capacity;
  int block_m;
};

Align align_of(const TensorView& sorted, const TensorView& expert_ids, const TensorView& npad) {
  check_i32(sorted, "sorted");
  check_i32(expert_ids, "expert_ids");
  check_i32(npad, "npad");
  const int64_t blocks = expert_ids.numel();
  TVM_FFI_CHECK(blocks > 0 && sorted.numel() % blocks == 0 && npad.numel() == 1, ValueError)
      << "sorted, expert_ids and npad must be moe_align's output (sorted: block_m rows per expert_ids entry), got "
      << sorted.numel() << " sorted rows for " << blocks << " blocks";
  const int64_t block_m = sorted.numel() / blocks;
  TVM_FFI_CHECK(block_m == 32 || block_m == 64, ValueError)
      << "the grouped GEMM takes moe_align's output with block_m 32 or 64, got " << block_m;
  return {static_cast<const int32_t*>(base_of(sorted)), static_cast<const int32_t*>(base_of(expert_ids)),
          static_cast<const int32_t*>(base_of(npad)), sorted.numel(), static_cast<int>(block_m)};
}

// The dp4a and FMA tiles take 64 rows a block.
void check_block64(const Align& al, const char* what) {
  TVM_FFI_CHECK(al.block_m == kGemmTile, ValueError)
      << what << " takes moe_align's output with block_m = " << kGemmTile << ", got " << al.block_m;
}

void check_out(const TensorView& out, const TensorView& wts, int64_t pairs, int64_t n_out) {
  check_f32(out, "out");
  check_f32(wts, "wts");
  TVM_FFI_CHECK(out.ndim() == 2 && out.size(0) == pairs && out.size(1) == n_out && wts.numel() == pairs, ValueError)
      << "out must be [pairs, N] and wts [pairs]";
}
}  // namespace

// Grouped GEMM over moe_align's rows, Q4_0 bank [E, N or 2N, K/32*18] on the int8 path:
// activations as Q8_1 (q8 int8 [rows, K], d8 / s8 fp32 [rows, K/32]; rows = T when gated,
// else pairs). gated: out[pair] = SwiGLU of rows n and N + n; else out[pair] = wts[pair] * dot.
void moe_gemm_q4(TensorView w, TensorView q8, TensorView d8, TensorView s8, TensorView sorted, TensorView expert_ids,
                 TensorView npad, TensorView wts, TensorView out, int64_t top_k, bool gated) {
  check_contiguous(w, "w");
  check_contiguous(q8, "q8");
  check_f32(d8, "d8");
  check_f32(s8, "s8");
  const int64_t k = q8.size(1), pairs = out.size(0), n_out = out.size(1);
  TVM_FFI_CHECK(w.ndim() == 3 && is_q4_bank(w) && w.size(2) == k / kQK * kBlockBytes && k % kQK == 0 &&
                    w.size(1) == (gated ? 2 : 1) * n_out,
                ValueError)
      << "w must be a Q4_0 bank [E, " << (gated ? "2N" : "N") << ", K/32*18] for q8 [*, K]";
  TVM_FFI_CHECK(q8.ndim() == 2 && d8.numel() == q8.size(0) * (k / kQK) && s8.numel() == d8.numel() &&
                    q8.size(0) == (gated ? pairs / top_k : pairs),
                ValueError)
      << "q8 / d8 / s8 must be the Q8_1 of the activation rows";
  check_out(out, wts, pairs, n_out);
  const Align al = align_of(sorted, expert_ids, npad);
  check_block64(al, "the Q4_0 grouped GEMM");
  if (pairs == 0 || n_out == 0) return;
  const dim3 grid(cdiv(n_out, kGemmTile), static_cast<unsigned>(al.capacity / kGemmTile));
  port_stream_t st = stream_of(out);
  const uint8_t* wp = static_cast<const uint8_t*>(base_of(w));
  const int8_t* qp = static_cast<const int8_t*>(base_of(q8));
  const float* dp = static_cast<const float*>(base_of(d8));
  const float* sp = static_cast<const float*>(base_of(s8));
  const float* wt = static_cast<const float*>(base_of(wts));
  float* op = static_cast<float*>(base_of(out));
  const int kk = static_cast<int>(top_k);
  if (gated) {
    moe_gemm_q4_kernel<true><<<grid, kMoeThreads, 0, st>>>(wp, w.stride(0), w.stride(1), qp, dp, sp, al.sorted,
                                                           al.expert_ids, al.npad, wt, op, pairs, kk, n_out, k);
  } else {
    moe_gemm_q4_kernel<false><<<grid, kMoeThreads, 0, st>>>(wp, w.stride(0), w.stride(1), qp, dp, sp, al.sorted,
                                                            al.expert_ids, al.npad, wt, op, pairs, kk, n_out, k);
  }
  check_launch("moe_gemm_q4_kernel");
}

namespace {
template <typename A, typename W, typename O, bool G>
void launch_gemm_dense(const TensorView& a, const TensorView& w, const Align& al, const TensorView& wts,
                       const TensorView& out, int64_t top_k) {
  const int64_t pairs = out.size(0), n_out = out.size(1), k = a.size(1);
  const dim3 grid(cdiv(n_out, kGemmTile), static_cast<unsigned>(al.capacity / kGemmTile));
  moe_gemm_dense_kernel<A, W, O, G><<<grid, kMoeThreads, 0, stream_of(out)>>>(
      static_cast<const typename A::storage*>(base_of(a)), a.stride(0),
      static_cast<const typename W::storage*>(base_of(w)), w.stride(0), w.stride(1), al.sorted, al.expert_ids,
      al.npad, static_cast<const float*>(base_of(wts)), static_cast<typename O::storage*>(base_of(out)), pairs,
      static_cast<int>(top_k), n_out, k);
}

// The matrix-core kernel reads 16-byte chunks of a's and w's rows (and counts K in int).
bool chunked(const TensorView& a, const TensorView& w) {
  const int64_t k = a.size(1);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return k % 8 == 0 && k < (int64_t{1} << 30) && (a.size(0) <= 1 || a.stride(0) % 8 == 0) &&
         w.stride(0) % 8 == 0 && w.stride(1) % 8 == 0 &&
         aligned(base_of(a)) && aligned(base_of(w));
}

template <typename T, bool G, int BM, int BN, int KS>
void launch_mma_shape(const TensorView& a, const TensorView& w, const Align& al, const TensorView& wts,
                      const TensorView& out, int64_t top_k) {
  const int64_t pairs = out.size(0), n_out = out.size(1), k = a.size(1);
  const int lds = MmaShape<BM, BN, KS, G>::lds_bytes();
  auto kernel = moe_gemm_mma_kernel<T, G, BM, BN, KS>;
  if (lds + 1024 > 48 * 1024) {  // past 48 KB with the static rows: the opt-in
    const port_error_t err = port_max_dynamic_lds(kernel, lds);
    if (err != port_success) port_get_last_error();  // cleared: a later launch check must not see it
    TVM_FFI_CHECK(err == port_success, RuntimeError)
        << "the matrix-core grouped GEMM (block_m " << BM << (G ? ", gate/up" : ", down") << ") needs " << lds
        << " bytes of shared memory a block, which this device does not grant: " << port_error_string(err);
  }
  const dim3 grid(cdiv(n_out, BN), static_cast<unsigned>(al.capacity / BM));
  kernel<<<grid, kMoeThreads, lds, stream_of(out)>>>(
      static_cast<const uint16_t*>(base_of(a)), a.stride(0), static_cast<const uint16_t*>(base_of(w)), w.stride(0),
      w.stride(1), al.sorted, al.expert_ids, al.npad, static_cast<const float*>(base_of(wts)), base_of(out), pairs,
      static_cast<int>(top_k), n_out, k);
}

// The shape of moe_align's block_m (32 or 64 rows a block: align_of checks).
template <typename T, bool G>
void launch_gemm_mma(const TensorView& a, const TensorView& w, const Align& al, const TensorView& wts,
                     const TensorView& out, int64_t top_k) {
#define FTLAB_MMA_PICK(T_, G_, BM, BN, KS) \
  if (al.block_m == BM) return launch_mma_shape<T_, G_, BM, BN, KS>(a, w, al, wts, out, top_k);
  FTLAB_MMA_SHAPES(FTLAB_MMA_PICK, T, G)
#undef FTLAB_MMA_PICK
  TVM_FFI_THROW(ValueError) << "no matrix-core shape for block_m " << al.block_m;
}

template <typename W>
void dispatch_gemm_dense(bool gated, const TensorView& a, const TensorView& w, const Align& al, const TensorView& wts,
                         const TensorView& out, int64_t top_k) {
  if constexpr (sizeof(typename W::storage) == 2) {
    if (chunked(a, w)) {
      if (gated) {
        launch_gemm_mma<W, true>(a, w, al, wts, out, top_k);
      } else {
        launch_gemm_mma<W, false>(a, w, al, wts, out, top_k);
      }
      return;
    }
  }
  check_block64(al, "the FMA tiles (fp32 banks, or rows not in 16-byte chunks)");
  if (gated) {
    launch_gemm_dense<W, W, W, true>(a, w, al, wts, out, top_k);
  } else {
    launch_gemm_dense<W, W, f32_t, false>(a, w, al, wts, out, top_k);
  }
}
}  // namespace

// Grouped GEMM over moe_align's rows, dense bank [E, N or 2N, K]: a = x [T, K] (gated) or h [pairs, K]
// in the bank's dtype; out: gated, h [pairs, N] in the bank's dtype (SwiGLU of rows n and N + n); else
// fp32 [pairs, N], weighted by wts. fp16 / bf16 banks run on the matrix cores where K, the row strides
// and the base addresses are whole 16-byte chunks, else (and fp32 banks) on fp32 FMA tiles.
void moe_gemm_dense(TensorView a, TensorView w, TensorView sorted, TensorView expert_ids, TensorView npad,
                    TensorView wts, TensorView out, int64_t top_k, bool gated) {
  TVM_FFI_CHECK(a.ndim() == 2 && (a.size(1) <= 1 || a.stride(1) == 1), ValueError)
      << "a must be 2-D with contiguous rows";
  check_contiguous(w, "w");
  check_contiguous(wts, "wts");
  check_f32(wts, "wts");
  TVM_FFI_CHECK(out.ndim() == 2, ValueError) << "out must be 2-D [pairs, N]";
  const int64_t pairs = out.size(0), n_out = out.size(1), k = a.size(1);
  TVM_FFI_CHECK(w.ndim() == 3 && w.size(2) == k && w.size(1) == (gated ? 2 : 1) * n_out, ValueError)
      << "w must be a bank [E, " << (gated ? "2N" : "N") << ", K] for a [*, K]";
  TVM_FFI_CHECK(!gated || (top_k >= 1 && pairs % top_k == 0), ValueError)
      << "gated: top_k must be >= 1 and divide the pairs (out's rows), got top_k = " << top_k << ", pairs = " << pairs;
  TVM_FFI_CHECK(a.size(0) == (gated ? pairs / top_k : pairs), ValueError) << "a must have one row per token (gated) or pair";
  const Fp wf = fp_of(w, "w");
  TVM_FFI_CHECK(fp_of(a, "a") == wf, TypeError) << "a must have w's dtype";
  check_contiguous(out, "out");
  TVM_FFI_CHECK(gated ? fp_of(out, "out") == wf : fp_of(out, "out") == Fp::f32, TypeError)
      << "out must have w's dtype (gated) or be float32";
  TVM_FFI_CHECK(out.size(0) == pairs && wts.numel() == pairs, ValueError) << "out must be [pairs, N] and wts [pairs]";
  const Align al = align_of(sorted, expert_ids, npad);
  if (pairs == 0 || n_out == 0) return;
  switch (wf) {
    case Fp::f32: dispatch_gemm_dense<f32_t>(gated, a, w, al, wts, out, top_k); break;
    case Fp::f16: dispatch_gemm_dense<f16_t>(gated, a, w, al, wts, out, top_k); break;
    case Fp::bf16: dispatch_gemm_dense<bf16_t>(gated, a, w, al, wts, out, top_k); break;
  }
  check_launch("moe_gemm_dense");
}

}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_route_topk, ftlab::moe_route_topk);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_router_topk, ftlab::moe_router_topk);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_norm_router_topk, ftlab::moe_norm_router_topk);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_align, ftlab::moe_align);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_experts_decode_q4, ftlab::moe_experts_decode_q4);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_experts_decode_dense, ftlab::moe_experts_decode_dense);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_gemm_q4, ftlab::moe_gemm_q4);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_gemm_dense, ftlab::moe_gemm_dense);

// quant_matmul_launch.hip — host glue for quant_matmul.hip and quant_matmul_tiled.hip: tvm-ffi
// entry points of the int8-dot matvecs (up to 8 rows: per-lane units or tiled) and prefill GEMMs of GGUF Q8_0, Q4_K, Q5_K and Q6_K weights
// (uint8 tensors) with Q8_1 activations, launched on torch's current stream. One entry point
// per block type and kernel (the Python wrapper picks it by the weight's qtype).
//
// ftlab.ops validates shapes, dtypes and devices before calling in here; the checks below
// only keep a direct caller from reading or writing out of bounds (or misaligned).
#include <algorithm>

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include "launch_common.h"
#include "quant_matmul.hip"
#include "quant_matmul_tiled.hip"
#include "quant_matmul_mv1.hip"

namespace ftlab {
namespace qmm {

using tvm::ffi::TensorView;
using namespace launch;

namespace {

struct Args {
  const uint8_t* w;
  int64_t row_bytes;
  const int8_t* q;
  const float* d;
  const float* s;
  float* y;
  int64_t m, n, k;
};

// y [M, N] fp32 = the int8 dots of q8 [M, K] int8 (d8, s8 [M, K/32] fp32) with w [N, row bytes].
// y has splits * M rows (the tiled matvec's partial sums per K split), M for the others.
template <typename Q>
Args check(const TensorView& w, const TensorView& q, const TensorView& d, const TensorView& s, const TensorView& y,
           const char* what, int64_t splits = 1) {
  check_contiguous(w, "w");
  check_contiguous(q, "q8");
  check_contiguous(d, "d8");
  check_contiguous(s, "s8");
  check_contiguous(y, "y");
  TVM_FFI_CHECK(q.ndim() == 2 && q.size(1) % Q::kBlock == 0, ValueError)
      << "q8 must be [M, K] with K a multiple of " << Q::kBlock << " for " << what;
  const int64_t m = q.size(0), k = q.size(1);
  TVM_FFI_CHECK(d.numel() == m * (k / 32) && s.numel() == d.numel(), ValueError) << "d8 and s8 must be [M, K/32]";
  TVM_FFI_CHECK(w.ndim() == 2 && w.size(1) == k / Q::kBlock * Q::kBytes, ValueError)
      << "w must be [N, K/" << Q::kBlock << "*" << Q::kBytes << "] " << what << " blocks matching the activations' K";
  TVM_FFI_CHECK(w.dtype().code == kDLUInt && w.dtype().bits == 8, TypeError) << "w must be uint8";
  const int64_t n = w.size(0);
  TVM_FFI_CHECK(y.ndim() == 2 && y.size(0) == m * splits && y.size(1) == n, ValueError)
      << "y must be [" << splits << " * M, N]";
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(base_of(w)) % 4 == 0 && reinterpret_cast<uintptr_t>(base_of(q)) % 4 == 0,
                ValueError)
      << "w and q8 must be 4-byte aligned";
  return {static_cast<const uint8_t*>(base_of(w)), w.size(1), static_cast<const int8_t*>(base_of(q)),
          static_cast<const float*>(base_of(d)), static_cast<const float*>(base_of(s)), static_cast<float*>(base_of(y)),
          m, n, k};
}

// quant_mv1_kernel<Q, V> on a persistent grid of as many blocks as fit an SM at the kernel's
// registers (at most kMv1BlocksPerSm): one wave, each group walking rows (more blocks an SM ran
// in two or three waves and were slower: benchmarks/NOTES.md).
template <typename Q, int V>
void launch_mv1(const Args& a, int64_t grid, port_stream_t st) {
  int device = 0, sms = 1, resident = 0;
  port_get_device(&device);
  port_sm_count(&sms, device);
  port_occupancy(&resident, quant_mv1_kernel<Q, V>, kGroup * kRowsPerBlock);
  const int per_sm = resident > 0 ? std::min(resident, kMv1BlocksPerSm) : kMv1BlocksPerSm;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(grid, int64_t{sms} * per_sm));
  quant_mv1_kernel<Q, V><<<blocks, dim3(kGroup, kRowsPerBlock), 0, st>>>(a.w, a.row_bytes, a.q, a.d, a.s, a.y,
                                                                         a.n, a.k);
  check_launch("quant_mv1_kernel");
}

template <typename Q>
void matvec(const TensorView& w, const TensorView& q, const TensorView& d, const TensorView& s, const TensorView& y,
            const char* what, int variant = kMv1Lanes) {
  const Args a = check<Q>(w, q, d, s, y, what);
  const int64_t m = a.m, n = a.n, k = a.k;
  TVM_FFI_CHECK(m >= 1 && m <= 8, ValueError) << "the matvec takes 1 to 8 rows, got " << m;
  if (n == 0 || k == 0) return;
  const int64_t grid = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  TVM_FFI_CHECK(grid <= 0x7fffffff, ValueError) << "w has too many rows for one launch: " << n;
  const dim3 block(kGroup, kRowsPerBlock);
  port_stream_t st = stream_of(y);
  if (m == 1) {
    TVM_FFI_CHECK(variant != kMv1Vec || reinterpret_cast<uintptr_t>(a.w) % 16 == 0, ValueError)
        << "the vec matvec needs w 16-byte aligned";
    if constexpr (Q::kVec) {
      if (variant == kMv1Vec) {
        launch_mv1<Q, kMv1Vec>(a, grid, st);
        return;
      }
    }
    launch_mv1<Q, kMv1Lanes>(a, grid, st);
    return;
  }
  switch (m) {
#define FTLAB_QMM_CASE(M)                                                                                  \
  case M:                                                                                                  \
    quant_mv_kernel<Q, M><<<static_cast<unsigned>(grid), block, 0, st>>>(a.w, a.row_bytes, a.q, a.d, a.s, a.y, n, k); \
    break;
    FTLAB_QMM_CASE(1)
    FTLAB_QMM_CASE(2)
    FTLAB_QMM_CASE(3)
    FTLAB_QMM_CASE(4)
    FTLAB_QMM_CASE(5)
    FTLAB_QMM_CASE(6)
    FTLAB_QMM_CASE(7)
    FTLAB_QMM_CASE(8)
#undef FTLAB_QMM_CASE
  }
  check_launch("quant_mv_kernel");
}

// The tiled matvec: g supers of a row per lane group and step (1, 2, 4, 8, 16 or 32), K cut
// into `splits` ranges whose partial sums go to y [splits * M, N]; a persistent grid of as many
// blocks as are resident at once.
template <typename Q, typename QT>
void matvec_tiled(const TensorView& w, const TensorView& q, const TensorView& d, const TensorView& s,
                  const TensorView& y, int64_t g, int64_t splits, const char* what) {
  TVM_FFI_CHECK(splits >= 1 && splits <= 1024, ValueError) << "splits must be 1..1024, got " << splits;
  const Args a = check<Q>(w, q, d, s, y, what, splits);
  const int64_t m = a.m, n = a.n, k = a.k;
  TVM_FFI_CHECK(m >= 1 && m <= 8, ValueError) << "the matvec takes 1 to 8 rows, got " << m;
  TVM_FFI_CHECK(g >= 1 && g <= qmt::kGroup && qmt::kGroup % g == 0, ValueError)
      << "g must be 1, 2, 4, 8, 16 or 32, got " << g;
  const int64_t pieces = (14 + g * QT::kBytes + 15) / 16;
  TVM_FFI_CHECK(qmt::kGroup / g * pieces <= qmt::kGroup * QT::kPieces, ValueError)
      << "g = " << g << " overflows the tiled matvec's LDS for " << what;
  TVM_FFI_CHECK(k % (32 * QT::kUnits) == 0, ValueError)
      << "the tiled matvec needs K % " << 32 * QT::kUnits << " == 0 for " << what << ", got " << k;
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(a.q) % 16 == 0, ValueError) << "q8 must be 16-byte aligned";
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(a.w) % 16 == 0 && (a.n * a.row_bytes) % 16 == 0, ValueError)
      << "the tiled matvec needs w to start and end 16-byte aligned";
  TVM_FFI_CHECK(n <= 0x7fffffff && k <= 0x7fffffff, ValueError) << "the tiled matvec takes N, K < 2^31";
  if (n == 0 || k == 0) return;
  const int rows = static_cast<int>(qmt::kGroup / g);
  const int64_t works = (n + rows - 1) / rows * splits;
  TVM_FFI_CHECK(works <= 0x7fffffff, ValueError) << "too many (row set, split) pairs: " << works;
  const int64_t blocks = (works + qmt::kGroups - 1) / qmt::kGroups;
  int device = 0, sms = 1, resident = 1;
  port_get_device(&device);
  port_sm_count(&sms, device);
  const dim3 block(qmt::kGroup, qmt::kGroups);
  port_stream_t st = stream_of(y);
  const int gi = static_cast<int>(g), si = static_cast<int>(splits);
  switch (m) {
#define FTLAB_QMT_CASE(M)                                                                                 \
  case M: {                                                                                               \
    port_occupancy(&resident, qmt::quant_mv_tiled_kernel<QT, M>, qmt::kGroup * qmt::kGroups);             \
    const int64_t cap = static_cast<int64_t>(resident > 0 ? resident : 1) * sms;                          \
    const unsigned grid = static_cast<unsigned>(blocks < cap ? blocks : cap);                             \
    qmt::quant_mv_tiled_kernel<QT, M><<<grid, block, 0, st>>>(a.w, a.row_bytes, a.q, a.d, a.s, a.y, n, k, gi, si); \
    break;                                                                                                \
  }
    FTLAB_QMT_CASE(1)
    FTLAB_QMT_CASE(2)
    FTLAB_QMT_CASE(3)
    FTLAB_QMT_CASE(4)
    FTLAB_QMT_CASE(5)
    FTLAB_QMT_CASE(6)
    FTLAB_QMT_CASE(7)
    FTLAB_QMT_CASE(8)
#undef FTLAB_QMT_CASE
  }
  check_launch("quant_mv_tiled_kernel");
}

template <typename Q>
void gemm(const TensorView& w, const TensorView& q, const TensorView& d, const TensorView& s, const TensorView& y,
          const char* what) {
  const Args a = check<Q>(w, q, d, s, y, what);
  if (a.m == 0 || a.n == 0 || a.k == 0) return;
  const int64_t gx = (a.n + kTileN - 1) / kTileN, gy = (a.m + kTileM - 1) / kTileM;
  TVM_FFI_CHECK(gx <= 0x7fffffff && gy <= 65535, ValueError)
      << "the GEMM takes at most " << 65535 * kTileM << " rows of activations, got " << a.m;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  quant_gemm_kernel<Q><<<grid, kGemmThreads, 0, stream_of(y)>>>(a.w, a.row_bytes, a.q, a.d, a.s, a.y, a.m, a.n,
                                                                 a.k);
  check_launch("quant_gemm_kernel");
}

}  // namespace

void quant_mv_q8_0(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  matvec<Q8_0>(w, q, d, s, y, "Q8_0");
}
void quant_mv_q4_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  matvec<QK4<false>>(w, q, d, s, y, "Q4_K");
}
void quant_mv_q5_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  matvec<QK4<true>>(w, q, d, s, y, "Q5_K");
}
void quant_mv_q6_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  matvec<Q6_K>(w, q, d, s, y, "Q6_K");
}

// The one-row matvec with quant_vec.h's 16-byte pieces (quant_mv1_kernel's `vec`; w 16-byte
// aligned); 2 to 8 rows go to quant_mv_kernel as in quant_mv_*.
void quant_mv_vec_q4_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  matvec<QK4<false>>(w, q, d, s, y, "Q4_K", kMv1Vec);
}
void quant_mv_vec_q5_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  matvec<QK4<true>>(w, q, d, s, y, "Q5_K", kMv1Vec);
}
void quant_mv_vec_q6_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  matvec<Q6_K>(w, q, d, s, y, "Q6_K", kMv1Vec);
}

void quant_mv_tiled_q8_0(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y, int64_t g,
                         int64_t splits) {
  matvec_tiled<Q8_0, qmt::SQ8_0>(w, q, d, s, y, g, splits, "Q8_0");
}
void quant_mv_tiled_q4_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y, int64_t g,
                         int64_t splits) {
  matvec_tiled<QK4<false>, qmt::SQK4<false>>(w, q, d, s, y, g, splits, "Q4_K");
}
void quant_mv_tiled_q5_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y, int64_t g,
                         int64_t splits) {
  matvec_tiled<QK4<true>, qmt::SQK4<true>>(w, q, d, s, y, g, splits, "Q5_K");
}
void quant_mv_tiled_q6_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y, int64_t g,
                         int64_t splits) {
  matvec_tiled<Q6_K, qmt::SQ6_K>(w, q, d, s, y, g, splits, "Q6_K");
}

void quant_gemm_q8_0(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  gemm<Q8_0>(w, q, d, s, y, "Q8_0");
}
void quant_gemm_q4_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  gemm<QK4<false>>(w, q, d, s, y, "Q4_K");
}
void quant_gemm_q5_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  gemm<QK4<true>>(w, q, d, s, y, "Q5_K");
}
void quant_gemm_q6_k(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  gemm<Q6_K>(w, q, d, s, y, "Q6_K");
}

namespace {

enum class OneRow { fused, staged, sliced };
template <typename Q>
constexpr bool kHasStaged = true;  // quant_matmul_mv1.hip instantiates no staged kernel of Q8_0
template <>
constexpr bool kHasStaged<Q8_0x8> = false;

// Blocks of a persistent grid for `kernel`: as many as fit an SM at its registers and LDS (each
// quantizes x once, or reads its slices' Q8_1), at most one per block's round of rows.
template <typename K>
int64_t persistent_blocks(K kernel, int64_t n, int64_t rows_per_block) {
  int device = 0, sms = 1, resident = 0;
  port_get_device(&device);
  port_sm_count(&sms, device);
  port_occupancy(&resident, kernel, kFusedThreads);
  return std::min<int64_t>((n + rows_per_block - 1) / rows_per_block, int64_t{sms} * std::max(resident, 1));
}

// quant_mv1_fused_kernel<T, Q> (staged: quant_mv1_staged_kernel; sliced: quant_mv1_sliced_kernel,
// given x's Q8_1 where q8 is not null) on a persistent grid: rounds of 8 rows a block (sliced: 8 / sliced_groups).
template <typename T, typename Q>
void launch_fused(const TensorView& x, const int8_t* q8, const float* d8, const float* s8, const uint8_t* w,
                  int64_t row_bytes, const TensorView& y, int64_t n, int k, OneRow v) {
  using S = typename T::storage;
  const auto* xp = q8 ? nullptr : static_cast<const S*>(base_of(x));
  auto* yp = static_cast<S*>(base_of(y));
  const int64_t groups = kFusedThreads / kGroup;
  if (v == OneRow::sliced) {
    auto kernel = q8 ? quant_mv1_sliced_kernel<T, Q, true> : quant_mv1_sliced_kernel<T, Q, false>;
    const int64_t blocks = persistent_blocks(kernel, n, groups / sliced_groups(k / Q::kBlock));
    launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kFusedThreads), stream_of(y), xp, q8, d8, s8, w,
               row_bytes, yp, n, k);
    return;
  }
  auto kernel = quant_mv1_fused_kernel<T, Q>;
  if constexpr (kHasStaged<Q>) {
    if (v == OneRow::staged) kernel = quant_mv1_staged_kernel<T, Q>;
  }
  const int64_t blocks = persistent_blocks(kernel, n, groups);
  launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kFusedThreads), stream_of(y), xp, w, row_bytes, yp, n,
             k);
}

template <typename T>
void fused_of(int64_t code, const TensorView& x, const int8_t* q8, const float* d8, const float* s8, const uint8_t* w,
              int64_t row_bytes, const TensorView& y, int64_t n, int k, OneRow v) {
  switch (code) {
    case 1: launch_fused<T, QK4<false>>(x, q8, d8, s8, w, row_bytes, y, n, k, v); break;
    case 2: launch_fused<T, QK4<true>>(x, q8, d8, s8, w, row_bytes, y, n, k, v); break;
    case 3: launch_fused<T, Q6_K>(x, q8, d8, s8, w, row_bytes, y, n, k, v); break;
    case 4: launch_fused<T, Q4_0x8>(x, q8, d8, s8, w, row_bytes, y, n, k, v); break;
    default: launch_fused<T, Q8_0x8>(x, q8, d8, s8, w, row_bytes, y, n, k, v); break;  // no staged form (one_row)
  }
}

// The weights' and y's checks and the launch of the one-launch matvecs (fused: K up to 8192; staged:
// up to 2048, rows of whole 16-byte pieces; sliced: up to 16384), of K and dtype fp taken from x
// (given x's Q8_1 where q8 is not null: sliced only).
void checked_launch(const TensorView& x, const int8_t* q8, const float* d8, const float* s8, Fp fp, int64_t k,
                    const TensorView& w, int64_t code, const TensorView& y, OneRow v) {
  constexpr int64_t kBytes[6] = {0, QK4<false>::kBytes, QK4<true>::kBytes, Q6_K::kBytes, Q4_0x8::kBytes,
                                 Q8_0x8::kBytes};  // by code, for 256 weights
  const bool staged = v == OneRow::staged;
  const char* name = staged ? "the staged matvec" : v == OneRow::sliced ? "the sliced matvec" : "the fused matvec";
  const int64_t max_k = staged ? 2048 : v == OneRow::sliced ? kSlicedMaxK : kFusedMaxK;
  TVM_FFI_CHECK(code >= 1 && code <= (staged ? 4 : 5), ValueError)
      << name << " takes Q4_K, Q5_K, Q6_K" << (staged ? " or Q4_0" : ", Q4_0 or Q8_0") << " weights (codes 1.."
      << (staged ? 4 : 5) << "), got code " << code;
  TVM_FFI_CHECK(k % 256 == 0 && k > 0 && k <= max_k, ValueError)
      << (q8 ? "q8" : "x") << " must have K a multiple of 256 up to " << max_k << " (" << name << "), got K = " << k;
  check_contiguous(w, "w");
  check_contiguous(y, "y");
  TVM_FFI_CHECK(w.dtype().code == kDLUInt && w.dtype().bits == 8, TypeError) << "w must be uint8";
  TVM_FFI_CHECK(w.ndim() == 2 && w.size(1) == k / 256 * kBytes[code], ValueError)
      << "w must be [N, " << k / 256 * kBytes[code] << "] for K = " << k << ", got ndim " << w.ndim() << " with "
      << (w.ndim() == 2 ? w.size(1) : -1) << " bytes a row";
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(base_of(w)) % 16 == 0, ValueError) << "w must be 16-byte aligned";
  TVM_FFI_CHECK(!staged || w.size(1) % 16 == 0, ValueError)
      << "the staged matvec copies whole 16-byte pieces: w's rows must be a multiple of 16 bytes (Q6_K: K = "
         "2048), got "
      << w.size(1) << " bytes a row";
  const int64_t n = w.size(0);
  TVM_FFI_CHECK(y.ndim() == 2 && y.size(0) == 1 && y.size(1) == n && fp_of(y, "y") == fp, ValueError)
      << "y must be [1, " << n << "] in " << (q8 ? "a float dtype" : "x's dtype");
  if (n == 0) return;
  const auto* wp = static_cast<const uint8_t*>(base_of(w));
  const int kk = static_cast<int>(k);
  switch (fp) {
    case Fp::f32: fused_of<f32_t>(code, x, q8, d8, s8, wp, w.size(1), y, n, kk, v); break;
    case Fp::f16: fused_of<f16_t>(code, x, q8, d8, s8, wp, w.size(1), y, n, kk, v); break;
    case Fp::bf16: fused_of<bf16_t>(code, x, q8, d8, s8, wp, w.size(1), y, n, kk, v); break;
  }
  check_launch(staged ? "quant_mv1_staged_kernel" : v == OneRow::sliced ? "quant_mv1_sliced_kernel" : "quant_mv1_fused_kernel");
}

void one_row(TensorView x, TensorView w, int64_t code, TensorView y, OneRow v) {
  check_contiguous(x, "x");
  const Fp fp = fp_of(x, "x");
  TVM_FFI_CHECK(x.ndim() == 2 && x.size(0) == 1, ValueError) << "x must be [1, K], got ndim " << x.ndim()
                                                             << (x.ndim() == 2 ? " with rows " : "")
                                                             << (x.ndim() == 2 ? x.size(0) : 0);
  checked_launch(x, nullptr, nullptr, nullptr, fp, x.size(1), w, code, y, v);
}

}  // namespace

// The one-row matvec in one launch (quant_matmul_mv1.hip): x [1, K] (fp32, fp16 or bf16,
// contiguous, K a multiple of 256 up to 8192), w [N, K/256*bytes] of type code (1 Q4_K, 2 Q5_K,
// 3 Q6_K, 4 Q4_0, 5 Q8_0; bytes for 256 weights), contiguous and 16-byte aligned; y [1, N] in x's dtype.
void quant_mv_fused(TensorView x, TensorView w, int64_t code, TensorView y) { one_row(x, w, code, y, OneRow::fused); }

// The same, rows staged through LDS by asynchronous copies (quant_mv1_staged_kernel): K up to
// 2048, w's rows a multiple of 16 bytes, no Q8_0.
void quant_mv_staged(TensorView x, TensorView w, int64_t code, TensorView y) { one_row(x, w, code, y, OneRow::staged); }

// Long rows in slices held by the groups of a block (quant_mv1_sliced_kernel): K up to 16384.
void quant_mv_sliced(TensorView x, TensorView w, int64_t code, TensorView y) { one_row(x, w, code, y, OneRow::sliced); }

// The same given x's Q8_1 (quantize_q8_1's q8 [1, K] int8, d8 and s8 [1, K / 32] fp32, contiguous,
// 4-byte aligned), which the kernel reads instead of quantizing x in every block; y [1, N] fp32, fp16
// or bf16.
void quant_mv_sliced_q8(TensorView q8, TensorView d8, TensorView s8, TensorView w, int64_t code, TensorView y) {
  check_contiguous(q8, "q8");
  check_contiguous(d8, "d8");
  check_contiguous(s8, "s8");
  TVM_FFI_CHECK(q8.dtype().code == kDLInt && q8.dtype().bits == 8 && q8.ndim() == 2 && q8.size(0) == 1, ValueError)
      << "q8 must be int8 [1, K]";
  const int64_t k = q8.size(1);
  for (const auto* t : {&d8, &s8}) {
    TVM_FFI_CHECK(t->dtype().code == kDLFloat && t->dtype().bits == 32 && t->ndim() == 2 && t->size(0) == 1 &&
                      t->size(1) == k / 32,
                  ValueError)
        << (t == &d8 ? "d8" : "s8") << " must be fp32 [1, " << k / 32 << "] for K = " << k;
  }
  for (const auto* t : {&q8, &d8, &s8})
    TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(base_of(*t)) % 4 == 0, ValueError)
        << (t == &q8 ? "q8" : t == &d8 ? "d8" : "s8") << " must be 4-byte aligned";
  checked_launch(y, static_cast<const int8_t*>(base_of(q8)), static_cast<const float*>(base_of(d8)),
                 static_cast<const float*>(base_of(s8)), fp_of(y, "y"), k, w, code, y, OneRow::sliced);
}

}  // namespace qmm
}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_q8_0, ftlab::qmm::quant_mv_q8_0);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_q4_k, ftlab::qmm::quant_mv_q4_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_q5_k, ftlab::qmm::quant_mv_q5_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_q6_k, ftlab::qmm::quant_mv_q6_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_fused, ftlab::qmm::quant_mv_fused);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_staged, ftlab::qmm::quant_mv_staged);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_sliced, ftlab::qmm::quant_mv_sliced);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_sliced_q8, ftlab::qmm::quant_mv_sliced_q8);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_vec_q4_k, ftlab::qmm::quant_mv_vec_q4_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_vec_q5_k, ftlab::qmm::quant_mv_vec_q5_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_vec_q6_k, ftlab::qmm::quant_mv_vec_q6_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_tiled_q8_0, ftlab::qmm::quant_mv_tiled_q8_0);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_tiled_q4_k, ftlab::qmm::quant_mv_tiled_q4_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_tiled_q5_k, ftlab::qmm::quant_mv_tiled_q5_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_mv_tiled_q6_k, ftlab::qmm::quant_mv_tiled_q6_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_gemm_q8_0, ftlab::qmm::quant_gemm_q8_0);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_gemm_q4_k, ftlab::qmm::quant_gemm_q4_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_gemm_q5_k, ftlab::qmm::quant_gemm_q5_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quant_gemm_q6_k, ftlab::qmm::quant_gemm_q6_k);

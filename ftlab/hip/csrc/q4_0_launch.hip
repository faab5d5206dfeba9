// q4_0_launch.hip — host glue for q4_0.hip, q4_0_matvec.hip and q4_0_gemm.hip: tvm-ffi entry points taking torch tensors
// (via DLPack) and launching on torch's current stream.
//
// ftlab.ops validates shapes, dtypes and devices before calling in here; the checks below
// only keep a direct caller from reading or writing out of bounds.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include "launch_common.h"
#include "q4_0.hip"
#include "q4_0_gemm.hip"
#include "q4_0_matvec.hip"

namespace ftlab {

using tvm::ffi::TensorView;
using namespace launch;

namespace {

unsigned grid_for(int64_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

template <typename T>
void launch_quantize(const TensorView& x, const TensorView& out, int64_t nb) {
  quantize_q4_0_kernel<T><<<grid_for(nb), kThreads, 0, stream_of(out)>>>(
      static_cast<const typename T::storage*>(base_of(x)), static_cast<uint8_t*>(base_of(out)), nb);
}

template <typename T>
void launch_dequantize(const TensorView& w, const TensorView& out, int64_t nb) {
  dequantize_q4_0_kernel<T><<<grid_for(nb), kThreads, 0, stream_of(out)>>>(
      static_cast<const uint8_t*>(base_of(w)), static_cast<typename T::storage*>(base_of(out)), nb);
}

template <typename T>
void launch_q8_1(const TensorView& x, const TensorView& q, const TensorView& d, const TensorView& s) {
  const int64_t rows = x.size(0), k = x.size(1);
  launch_pdl(quantize_q8_1_kernel<T>, dim3(grid_for(4 * rows * (k / kQK))), dim3(kThreads), stream_of(q),
             static_cast<const typename T::storage*>(base_of(x)), x.stride(0), static_cast<int8_t*>(base_of(q)),
             static_cast<float*>(base_of(d)), static_cast<float*>(base_of(s)), rows, k);
}

struct Q8Args {
  const int8_t* q;
  const float* d;
  const float* s;
  int64_t m, k;
};

Q8Args q8_args(const TensorView& q, const TensorView& d, const TensorView& s) {
  check_contiguous(q, "q8");
  check_contiguous(d, "d8");
  check_contiguous(s, "s8");
  TVM_FFI_CHECK(q.ndim() == 2 && q.size(1) % kQK == 0, ValueError) << "q8 must be [M, K] with K % 32 == 0";
  TVM_FFI_CHECK(d.numel() == q.size(0) * (q.size(1) / kQK) && s.numel() == d.numel(), ValueError)
      << "d8 and s8 must be [M, K/32]";
  return {static_cast<const int8_t*>(base_of(q)), static_cast<const float*>(base_of(d)),
          static_cast<const float*>(base_of(s)), q.size(0), q.size(1)};
}

// A persistent grid: as many blocks of `kernel` as are resident at once, at most `needed`.
template <typename K>
unsigned persistent_grid(K kernel, int threads, int64_t needed) {
  int device = 0, sms = 1, resident = 1;
  port_get_device(&device);
  port_sm_count(&sms, device);
  port_occupancy(&resident, kernel, threads);
  const int64_t blocks = static_cast<int64_t>(resident > 0 ? resident : 1) * sms;
  return static_cast<unsigned>(needed < blocks ? needed : blocks);
}

void check_weight(const TensorView& w, int64_t k) {
  check_contiguous(w, "w");
  TVM_FFI_CHECK(w.ndim() == 2 && w.size(1) == k / kQK * kBlockBytes, ValueError)
      << "w must be [N, K/32*18] Q4_0 blocks matching the activations' K";
}

}  // namespace

void quantize_q4_0(TensorView x, TensorView out) {
  check_contiguous(x, "x");
  check_contiguous(out, "out");
  const int64_t nb = x.numel() / kQK;
  TVM_FFI_CHECK(x.numel() % kQK == 0 && out.numel() == nb * kBlockBytes, ValueError)
      << "out must hold numel(x)/32 blocks of 18 bytes";
  if (nb == 0) return;
  switch (fp_of(x, "x")) {
    case Fp::f32: launch_quantize<f32_t>(x, out, nb); break;
    case Fp::f16: launch_quantize<f16_t>(x, out, nb); break;
    case Fp::bf16: launch_quantize<bf16_t>(x, out, nb); break;
  }
  check_launch("quantize_q4_0_kernel");
}

void dequantize_q4_0(TensorView w, TensorView out) {
  check_contiguous(w, "w");
  check_contiguous(out, "out");
  const int64_t nb = out.numel() / kQK;
  TVM_FFI_CHECK(out.numel() % kQK == 0 && w.numel() == nb * kBlockBytes, ValueError)
      << "w must hold numel(out)/32 blocks of 18 bytes";
  if (nb == 0) return;
  switch (fp_of(out, "out")) {
    case Fp::f32: launch_dequantize<f32_t>(w, out, nb); break;
    case Fp::f16: launch_dequantize<f16_t>(w, out, nb); break;
    case Fp::bf16: launch_dequantize<bf16_t>(w, out, nb); break;
  }
  check_launch("dequantize_q4_0_kernel");
}

void quantize_q8_1(TensorView x, TensorView q, TensorView d, TensorView s) {
  TVM_FFI_CHECK(x.ndim() == 2 && x.size(1) % kQK == 0 && (x.size(1) <= 1 || x.stride(1) == 1), ValueError)
      << "x must be [M, K] with contiguous rows and K % 32 == 0";
  const Q8Args a = q8_args(q, d, s);
  TVM_FFI_CHECK(a.m == x.size(0) && a.k == x.size(1), ValueError) << "q8 must match x's shape";
  if (a.m == 0 || a.k == 0) return;
  switch (fp_of(x, "x")) {
    case Fp::f32: launch_q8_1<f32_t>(x, q, d, s); break;
    case Fp::f16: launch_q8_1<f16_t>(x, q, d, s); break;
    case Fp::bf16: launch_q8_1<bf16_t>(x, q, d, s); break;
  }
  check_launch("quantize_q8_1_kernel");
}

namespace {
template <typename T>
void launch_mv(const TensorView& w, const Q8Args& a, const TensorView& y) {
  // a persistent grid: as many blocks as are resident at once, each walking rows
  const int64_t n = w.size(0);
  const dim3 block(kGroup, kRowsPerBlock);
  const int64_t row_blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  const uint8_t* wp = static_cast<const uint8_t*>(base_of(w));
  auto* yp = static_cast<typename T::storage*>(base_of(y));
  const int64_t rb = w.size(1);
  port_stream_t st = stream_of(y);
  switch (a.m) {
#define FTLAB_MV_CASE(M)                                                                              \
  case M: {                                                                                           \
    const dim3 grid(persistent_grid(q4_0_mv_kernel<T, M>, kGroup * kRowsPerBlock, row_blocks));       \
    launch_pdl(q4_0_mv_kernel<T, M>, grid, block, st, wp, rb, a.q, a.d, a.s, yp, n, a.k);             \
    break;                                                                                            \
  }
    FTLAB_MV_CASE(1)
    FTLAB_MV_CASE(2)
    FTLAB_MV_CASE(3)
    FTLAB_MV_CASE(4)
    FTLAB_MV_CASE(5)
    FTLAB_MV_CASE(6)
    FTLAB_MV_CASE(7)
    FTLAB_MV_CASE(8)
#undef FTLAB_MV_CASE
  }
}
}  // namespace

// y [M, N] (fp32, fp16 or bf16: written in its dtype) = int8 dot of Q8_1 activations (M <= 8)
// with Q4_0 weights w [N, K/32*18].
void q4_0_mv(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  const Q8Args a = q8_args(q, d, s);
  check_weight(w, a.k);
  const int64_t n = w.size(0);
  check_contiguous(y, "y");
  TVM_FFI_CHECK(y.ndim() == 2 && y.size(0) == a.m && y.size(1) == n, ValueError) << "y must be [M, N]";
  TVM_FFI_CHECK(a.m >= 1 && a.m <= 8, ValueError) << "the matvec takes 1 to 8 rows, got " << a.m;
  TVM_FFI_CHECK((a.k / kQK) % 2 == 0 && reinterpret_cast<uintptr_t>(base_of(w)) % 4 == 0, ValueError)
      << "the matvec needs an even number of blocks per row and a 4-byte aligned w";
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(a.q) % 16 == 0, ValueError)
      << "the matvec reads q8 in 16-byte pieces: q8 must be 16-byte aligned";
  if (n == 0) return;
  switch (fp_of(y, "y")) {
    case Fp::f32: launch_mv<f32_t>(w, a, y); break;
    case Fp::f16: launch_mv<f16_t>(w, a, y); break;
    case Fp::bf16: launch_mv<bf16_t>(w, a, y); break;
  }
  check_launch("q4_0_mv_kernel");
}

namespace {
// q8 null: x is quantized inside the kernel; else q8 / d8 / s8 are x's Q8_1 (x unread).
template <typename T, int M>
void launch_mv_fused(const TensorView& w, const TensorView& x, const Q8Args* q8, const TensorView& y, int g_lanes) {
  const int64_t n = w.size(0), k = q8 ? q8->k : x.size(1);
  const int64_t row_sets = (n + kGroup / g_lanes - 1) / (kGroup / g_lanes);
  const dim3 block(kGroup, kFusedGroups);
  const auto xp = q8 ? nullptr : static_cast<const typename T::storage*>(base_of(x));
  const int64_t xs = q8 ? 0 : x.stride(0);
  auto go = [&](auto kernel) {
    const dim3 grid(persistent_grid(kernel, kGroup * kFusedGroups, (row_sets + kFusedGroups - 1) / kFusedGroups));
    launch_pdl(kernel, grid, block, stream_of(y), xp, xs, q8 ? q8->q : nullptr, q8 ? q8->d : nullptr,
               q8 ? q8->s : nullptr, static_cast<const uint8_t*>(base_of(w)), w.size(1),
               static_cast<typename T::storage*>(base_of(y)), n, k, g_lanes, nullptr, int64_t{0}, nullptr, nullptr,
               nullptr, 0.0f);
  };
  if (q8) {
    go(q4_0_mv_fused_kernel<T, M, kFusedGiven>);
  } else if constexpr (M == 1) {  // several rows are quantized first (q4_0_mv_fused checks M)
    go(q4_0_mv_fused_kernel<T, 1, kFusedQuantize>);
  }
}

// The norm prologue's launch (one row): x [1, K] and res (null: none) with 16-byte aligned rows,
// norm_w [K], s_out / y_out [1, K] (s_out unused without res); out [1, N].
template <typename T>
void launch_mv_fused_norm(const TensorView& w, const TensorView& x, const TensorView* res, const TensorView& norm_w,
                          const TensorView& s_out, const TensorView& y_out, float eps, const TensorView& out,
                          int g_lanes) {
  typedef typename T::storage S;
  const int64_t n = w.size(0), k = x.size(1);
  const int64_t row_sets = (n + kGroup / g_lanes - 1) / (kGroup / g_lanes);
  const dim3 block(kGroup, kFusedGroups);
  auto kernel = q4_0_mv_fused_kernel<T, 1, kFusedNorm>;
  const dim3 grid(persistent_grid(kernel, kGroup * kFusedGroups, (row_sets + kFusedGroups - 1) / kFusedGroups));
  launch_pdl(kernel, grid, block, stream_of(out), static_cast<const S*>(base_of(x)), x.stride(0), nullptr, nullptr,
             nullptr, static_cast<const uint8_t*>(base_of(w)), w.size(1), static_cast<S*>(base_of(out)), n, k,
             g_lanes, res ? static_cast<const S*>(base_of(*res)) : nullptr, res ? res->stride(0) : int64_t{0},
             static_cast<const S*>(base_of(norm_w)), static_cast<S*>(base_of(s_out)), static_cast<S*>(base_of(y_out)),
             eps);
}

template <typename T>
void dispatch_mv_fused(const TensorView& w, const TensorView& x, const Q8Args* q8, const TensorView& y,
                       int g_lanes) {
  switch (y.size(0)) {
    case 1: launch_mv_fused<T, 1>(w, x, q8, y, g_lanes); break;
    case 2: launch_mv_fused<T, 2>(w, x, q8, y, g_lanes); break;
    case 3: launch_mv_fused<T, 3>(w, x, q8, y, g_lanes); break;
    case 4: launch_mv_fused<T, 4>(w, x, q8, y, g_lanes); break;
  }
}

// The checks of both fused entries (M rows, K columns, y [M, N] of dtype fp); returns g_lanes, 0 for N = 0.
int fused_checks(const TensorView& w, int64_t m, int64_t k, const TensorView& y) {
  check_weight(w, k);
  const int64_t n = w.size(0);
  check_contiguous(y, "y");
  TVM_FFI_CHECK(y.ndim() == 2 && y.size(0) == m && y.size(1) == n, ValueError) << "y must be [M, N]";
  TVM_FFI_CHECK(m >= 1 && m <= 4, ValueError) << "the fused matvec takes 1 to 4 rows, got " << m;
  const int64_t supers = k / kQK / kSuperBlocks;
  TVM_FFI_CHECK(k % (kQK * kSuperBlocks) == 0 && reinterpret_cast<uintptr_t>(base_of(w)) % 16 == 0, ValueError)
      << "the fused matvec needs K % 256 == 0 and a 16-byte aligned w, got K = " << k;
  TVM_FFI_CHECK(m * supers * kRecordWords * 4 <= kFusedXBytes, ValueError)
      << "the fused matvec holds at most " << kFusedXBytes << " bytes of activation records, M x K = "
      << m << " x " << k << " needs " << m * supers * kRecordWords * 4;
  TVM_FFI_CHECK(n < (int64_t{1} << 31), ValueError) << "the fused matvec takes fewer than 2^31 rows, got " << n;
  if (n == 0) return 0;
  int g_lanes = 1;
  while (g_lanes < kGroup && g_lanes < supers) g_lanes *= 2;
  return g_lanes;
}

template <typename... A>
void dispatch_fused_dtype(Fp fp, A&&... a) {
  switch (fp) {
    case Fp::f32: dispatch_mv_fused<f32_t>(a...); break;
    case Fp::f16: dispatch_mv_fused<f16_t>(a...); break;
    case Fp::bf16: dispatch_mv_fused<bf16_t>(a...); break;
  }
}
}  // namespace

// y [M, N] in x's dtype = int8 dot of x [M, K] (quantized to Q8_1 inside the kernel, M <= 4)
// with Q4_0 weights w [N, K/32*18]; K a multiple of 256, w 16-byte aligned, and M * K small
// enough for the activation records to fit in LDS (ops.q4_0_matmul checks; else it takes
// quantize_q8_1 + q4_0_mv).
void q4_0_mv_fused(TensorView w, TensorView x, TensorView y) {
  TVM_FFI_CHECK(x.ndim() == 2 && x.size(0) == 1 && x.size(1) % kQK == 0 && (x.size(1) <= 1 || x.stride(1) == 1),
                ValueError)
      << "x must be one contiguous row [1, K] with K % 32 == 0 (several rows: quantize them, then q4_0_mv_fused_q8), "
         "got a tensor of "
      << x.ndim() << " dims and " << x.numel() << " elements";
  const int g_lanes = fused_checks(w, x.size(0), x.size(1), y);
  TVM_FFI_CHECK(fp_of(y, "y") == fp_of(x, "x"), TypeError) << "y must have x's dtype";
  if (g_lanes == 0) return;
  dispatch_fused_dtype(fp_of(x, "x"), w, x, nullptr, y, g_lanes);
  check_launch("q4_0_mv_fused_kernel");
}

// The same with x given as its Q8_1 (q8 [M, K] int8, d8 and s8 [M, K/32] fp32, contiguous and
// 16-byte aligned): y [M, N] in y's dtype (fp32 / fp16 / bf16); no quantization in the kernel.
void q4_0_mv_fused_q8(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  const Q8Args a = q8_args(q, d, s);
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && reinterpret_cast<uintptr_t>(a.d) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(a.s) % 16 == 0,
                ValueError)
      << "q8, d8 and s8 must be 16-byte aligned";
  const int g_lanes = fused_checks(w, a.m, a.k, y);
  if (g_lanes == 0) return;
  dispatch_fused_dtype(fp_of(y, "y"), w, y, &a, y, g_lanes);
  check_launch("q4_0_mv_fused_kernel");
}

// add_rmsnorm then the fused matvec of its y, one launch: x [1, K] (fp16 / bf16) and, when has_res,
// res [1, K] (16-byte aligned contiguous rows; without a residual res is unread), norm_w [K] of x's
// dtype, s and y_norm [1, K] (s = x + res rounded, y_norm its RMSNorm: add_rmsnorm's bits; s
// unwritten without a residual), out [1, N] = y_norm @ w^T as q4_0_mv_fused computes it. K a
// multiple of 256 and at most 2048 (one 8-element piece an add_rmsnorm thread).
void q4_0_mv_fused_norm(TensorView w, TensorView x, TensorView res, bool has_res, TensorView norm_w, TensorView s,
                        TensorView y_norm, double eps, TensorView out) {
  const Fp fp = fp_of(x, "x");
  TVM_FFI_CHECK(fp == Fp::f16 || fp == Fp::bf16, TypeError) << "the norm matvec takes fp16 / bf16 x";
  for (const TensorView* v : {&res, &norm_w, &s, &y_norm, &out})
    TVM_FFI_CHECK(fp_of(*v, "operand") == fp, TypeError) << "every float operand must have x's dtype";
  const int64_t k = x.ndim() == 2 ? x.size(1) : 0;
  auto row16 = [](const TensorView& v) {
    return reinterpret_cast<uintptr_t>(base_of(v)) % 16 == 0 && (v.size(1) <= 1 || v.stride(1) == 1);
  };
  TVM_FFI_CHECK(x.ndim() == 2 && x.size(0) == 1 && k % (kQK * kSuperBlocks) == 0 && k <= 8 * kNormThreads &&
                    row16(x) && (!has_res || (res.ndim() == 2 && res.size(0) == 1 && res.size(1) == k && row16(res))),
                ValueError)
      << "x (and res) must be [1, K], 16-byte aligned contiguous, K a multiple of 256 at most " << 8 * kNormThreads;
  check_contiguous(norm_w, "norm weight");
  TVM_FFI_CHECK(norm_w.numel() == k && reinterpret_cast<uintptr_t>(base_of(norm_w)) % 16 == 0, ValueError)
      << "the norm weight must be [K], 16-byte aligned";
  for (const TensorView* v : {&s, &y_norm}) {
    check_contiguous(*v, "s / y");
    TVM_FFI_CHECK(v->ndim() == 2 && v->size(0) == 1 && v->size(1) == k && reinterpret_cast<uintptr_t>(base_of(*v)) % 16 == 0,
                  ValueError)
        << "s and y must be [1, K], 16-byte aligned";
  }
  const int g_lanes = fused_checks(w, 1, k, out);
  if (g_lanes == 0) return;
  const float e = static_cast<float>(eps);
  if (fp == Fp::f16) {
    launch_mv_fused_norm<f16_t>(w, x, has_res ? &res : nullptr, norm_w, s, y_norm, e, out, g_lanes);
  } else {
    launch_mv_fused_norm<bf16_t>(w, x, has_res ? &res : nullptr, norm_w, s, y_norm, e, out, g_lanes);
  }
  check_launch("q4_0_mv_fused_kernel");
}

// y [M, N] fp32, any M: the dp4a-tiled GEMM.
void q4_0_gemm(TensorView w, TensorView q, TensorView d, TensorView s, TensorView y) {
  const Q8Args a = q8_args(q, d, s);
  check_weight(w, a.k);
  const int64_t n = w.size(0);
  check_contiguous(y, "y");
  TVM_FFI_CHECK(y.ndim() == 2 && y.size(0) == a.m && y.size(1) == n, ValueError) << "y must be [M, N]";
  if (n == 0 || a.m == 0) return;
  const dim3 grid(static_cast<unsigned>((n + kTileN - 1) / kTileN), static_cast<unsigned>((a.m + kTileM - 1) / kTileM));
  q4_0_gemm_kernel<<<grid, kGemmThreads, 0, stream_of(y)>>>(static_cast<const uint8_t*>(base_of(w)), w.size(1),
                                                       a.q, a.d, a.s, static_cast<float*>(base_of(y)), a.m, n, a.k);
  check_launch("q4_0_gemm_kernel");
}

}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(quantize_q4_0, ftlab::quantize_q4_0);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(dequantize_q4_0, ftlab::dequantize_q4_0);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quantize_q8_1, ftlab::quantize_q8_1);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(q4_0_mv, ftlab::q4_0_mv);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(q4_0_mv_fused, ftlab::q4_0_mv_fused);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(q4_0_mv_fused_q8, ftlab::q4_0_mv_fused_q8);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(q4_0_mv_fused_norm, ftlab::q4_0_mv_fused_norm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(q4_0_gemm, ftlab::q4_0_gemm);

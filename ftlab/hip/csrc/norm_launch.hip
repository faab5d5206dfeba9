// norm_launch.hip — host glue for norm.hip (tvm-ffi entries, torch's current stream).
// ftlab.ops checked the layouts; the checks here keep a direct caller in bounds.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include "launch_common.h"
#include "norm.hip"

namespace ftlab {

using tvm::ffi::TensorView;
using namespace launch;

namespace {

bool aligned16(const TensorView& t) { return reinterpret_cast<uintptr_t>(base_of(t)) % 16 == 0; }

// [N, H] with a unit element stride (any row stride).
void check_rows(const TensorView& t, const char* name, int64_t n, int64_t h) {
  TVM_FFI_CHECK(t.ndim() == 2 && t.size(0) == n && t.size(1) == h && (h <= 1 || t.stride(1) == 1), ValueError)
      << name << " must be [N, H] like x with a unit element stride";
}

// Whether rows of [N, H] t all start 16-byte aligned.
bool rows_aligned16(const TensorView& t) {
  const int64_t bytes = t.size(0) > 1 ? t.stride(0) * (t.dtype().bits / 8) : 0;
  return aligned16(t) && bytes % 16 == 0;
}

template <typename T, typename W, int V>
void launch_rows(const TensorView& x, const TensorView* res, const TensorView& w, const TensorView& s,
                 const TensorView& y, float eps) {
  using S = typename T::storage;
  launch_pdl(add_rmsnorm_kernel<T, W, V>, dim3(static_cast<unsigned>(x.size(0))), dim3(kNormThreads), stream_of(x),
      static_cast<const S*>(base_of(x)), x.stride(0), res ? static_cast<const S*>(base_of(*res)) : nullptr,
      res ? res->stride(0) : 0, static_cast<const typename W::storage*>(base_of(w)), static_cast<S*>(base_of(s)),
      static_cast<S*>(base_of(y)), eps, static_cast<int>(x.size(1)));
  check_launch("add_rmsnorm_kernel");
}

template <typename T, typename W>
void launch_vec(bool vec, const TensorView& x, const TensorView* res, const TensorView& w, const TensorView& s,
                const TensorView& y, float eps) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(typename T::storage));
  if (vec) {
    launch_rows<T, W, kVec>(x, res, w, s, y, eps);
  } else {
    launch_rows<T, W, 1>(x, res, w, s, y, eps);
  }
}

template <typename T>
void launch_weight(Fp wfp, bool vec, const TensorView& x, const TensorView* res, const TensorView& w,
                   const TensorView& s, const TensorView& y, float eps) {
  switch (wfp) {
    case Fp::f32: launch_vec<T, f32_t>(vec, x, res, w, s, y, eps); break;
    case Fp::f16: launch_vec<T, f16_t>(vec, x, res, w, s, y, eps); break;
    case Fp::bf16: launch_vec<T, bf16_t>(vec, x, res, w, s, y, eps); break;
  }
}

// res and s null: no residual (s is x; nothing but y is written).
void run(const TensorView& x, const TensorView* res, const TensorView& w, const TensorView* s, const TensorView& y,
         double eps) {
  TVM_FFI_CHECK(x.ndim() == 2, ValueError) << "x must be [N, H]";
  const int64_t n = x.size(0), h = x.size(1);
  TVM_FFI_CHECK(h > 0 && h <= INT32_MAX && n <= INT32_MAX, ValueError) << "x must have 0 < H < 2^31, N < 2^31";
  check_rows(x, "x", n, h);
  check_rows(y, "y", n, h);
  check_contiguous(y, "y");
  check_contiguous(w, "weight");
  TVM_FFI_CHECK(w.numel() == h, ValueError) << "weight must hold H = " << h << " elements";
  const Fp fp = fp_of(x, "x");
  const Fp wfp = fp_of(w, "weight");
  TVM_FFI_CHECK(fp_of(y, "y") == fp, TypeError) << "y must have x's dtype";
  if (res) {
    check_rows(*res, "residual", n, h);
    check_rows(*s, "s", n, h);
    check_contiguous(*s, "s");
    TVM_FFI_CHECK(fp_of(*res, "residual") == fp && fp_of(*s, "s") == fp, TypeError)
        << "residual and s must have x's dtype";
  }
  if (n == 0) return;
  const int64_t elems = 16 / (x.dtype().bits / 8);
  const bool vec = h % elems == 0 && rows_aligned16(x) && aligned16(w) && aligned16(y) &&
                   (!res || (rows_aligned16(*res) && aligned16(*s)));
  const TensorView& out_s = s ? *s : y;  // unwritten without a residual
  const float e = static_cast<float>(eps);
  switch (fp) {
    case Fp::f32: launch_weight<f32_t>(wfp, vec, x, res, w, out_s, y, e); break;
    case Fp::f16: launch_weight<f16_t>(wfp, vec, x, res, w, out_s, y, e); break;
    case Fp::bf16: launch_weight<bf16_t>(wfp, vec, x, res, w, out_s, y, e); break;
  }
}

}  // namespace

// x, residual [N, H] (unit element strides, row strides free), weight [H] contiguous (any float
// dtype), s and y [N, H] contiguous in x's dtype: s = x + residual rounded, y its RMSNorm.
void add_rmsnorm(TensorView x, TensorView residual, TensorView w, TensorView s, TensorView y, double eps) {
  run(x, &residual, w, &s, y, eps);
}

// Without a residual: y = RMSNorm of x (s is x itself).
void rmsnorm(TensorView x, TensorView w, TensorView y, double eps) { run(x, nullptr, w, nullptr, y, eps); }

}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(add_rmsnorm, ftlab::add_rmsnorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm, ftlab::rmsnorm);

// gated_norm_launch.hip — host glue for gated_norm.hip (tvm-ffi entries, torch's current stream).
// ftlab.ops checked the layouts; the checks here keep a direct caller in bounds.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include "gated_norm.hip"
#include "launch_common.h"

namespace ftlab {

using tvm::ffi::TensorView;
using namespace launch;

namespace {

// [N, H, D] with contiguous heads and elements; any token stride.
void check_rows(const TensorView& t, const char* name, int64_t n, int64_t h, int64_t d) {
  TVM_FFI_CHECK(t.ndim() == 3 && t.size(0) == n && t.size(1) == h && t.size(2) == d &&
                    (d <= 1 || t.stride(2) == 1) && (h <= 1 || t.stride(1) == d),
                ValueError)
      << name << " must be [N, H, D] like x with contiguous heads";
}

template <typename T, typename Z>
void launch_norm(const TensorView& x, const TensorView& z, const TensorView& w, const TensorView& y, float eps) {
  const int tokens = static_cast<int>(x.size(0)), heads = static_cast<int>(x.size(1)), d = static_cast<int>(x.size(2));
  const int64_t rows = static_cast<int64_t>(tokens) * heads;
  const unsigned blocks = static_cast<unsigned>((rows + kGatedNormWaves - 1) / kGatedNormWaves);
  gated_rmsnorm_kernel<T, Z><<<blocks, kGatedNormWaves * PORT_WARP_SIZE, 0, stream_of(x)>>>(
      static_cast<const typename T::storage*>(base_of(x)), x.stride(0),
      static_cast<const typename Z::storage*>(base_of(z)), z.stride(0), static_cast<const float*>(base_of(w)),
      static_cast<typename T::storage*>(base_of(y)), eps, tokens, heads, d);
  check_launch("gated_rmsnorm_kernel");
}

template <typename T>
void launch_norm_z(Fp zfp, const TensorView& x, const TensorView& z, const TensorView& w, const TensorView& y,
                   float eps) {
  switch (zfp) {
    case Fp::f32: launch_norm<T, f32_t>(x, z, w, y, eps); break;
    case Fp::f16: launch_norm<T, f16_t>(x, z, w, y, eps); break;
    case Fp::bf16: launch_norm<T, bf16_t>(x, z, w, y, eps); break;
  }
}

template <typename T>
void launch_gate(const TensorView& a, const TensorView& g, const TensorView& y) {
  using S = typename T::storage;
  const int f = static_cast<int>(a.size(1));
  const int per_row = (f + kGateThreads - 1) / kGateThreads;
  const unsigned blocks = static_cast<unsigned>(a.size(0) * per_row);
  output_gate_kernel<T><<<blocks, kGateThreads, 0, stream_of(a)>>>(static_cast<const S*>(base_of(a)), a.stride(0),
                                                                    static_cast<const S*>(base_of(g)), g.stride(0),
                                                                    static_cast<S*>(base_of(y)), f, per_row);
  check_launch("output_gate_kernel");
}

}  // namespace

// x [N, H, D], z [N, H, D] (any float dtype), token strides free; weight [D] fp32; y [N, H, D]
// contiguous in x's dtype.
void gated_rmsnorm(TensorView x, TensorView z, TensorView w, TensorView y, double eps) {
  TVM_FFI_CHECK(x.ndim() == 3, ValueError) << "x must be [N, H, D]";
  const int64_t n = x.size(0), h = x.size(1), d = x.size(2);
  check_rows(x, "x", n, h, d);
  check_rows(z, "z", n, h, d);
  check_rows(y, "y", n, h, d);
  check_contiguous(y, "y");
  check_contiguous(w, "weight");
  TVM_FFI_CHECK(w.dtype().code == kDLFloat && w.dtype().bits == 32, TypeError) << "weight must be float32";
  TVM_FFI_CHECK(w.numel() == d, ValueError) << "weight must hold D = " << d << " elements";
  const Fp fp = fp_of(x, "x");
  TVM_FFI_CHECK(fp_of(y, "y") == fp, TypeError) << "y must have x's dtype";
  const Fp zfp = fp_of(z, "z");
  if (n == 0 || h == 0 || d == 0) return;
  const float e = static_cast<float>(eps);
  switch (fp) {
    case Fp::f32: launch_norm_z<f32_t>(zfp, x, z, w, y, e); break;
    case Fp::f16: launch_norm_z<f16_t>(zfp, x, z, w, y, e); break;
    case Fp::bf16: launch_norm_z<bf16_t>(zfp, x, z, w, y, e); break;
  }
}

// attn, gate [N, F] (unit feature strides, row strides free), y [N, F] contiguous; one dtype.
void output_gate(TensorView attn, TensorView gate, TensorView y) {
  TVM_FFI_CHECK(attn.ndim() == 2 && gate.ndim() == 2 && y.ndim() == 2, ValueError) << "attn, gate, y must be [N, F]";
  const int64_t n = attn.size(0), f = attn.size(1);
  for (const TensorView* t : {&attn, &gate, &y})
    TVM_FFI_CHECK(t->size(0) == n && t->size(1) == f && (f <= 1 || t->stride(1) == 1), ValueError)
        << "attn, gate and y must be [N, F] with unit feature strides";
  check_contiguous(y, "y");
  const Fp fp = fp_of(attn, "attn");
  TVM_FFI_CHECK(fp_of(gate, "gate") == fp && fp_of(y, "y") == fp, TypeError) << "gate and y must have attn's dtype";
  if (n == 0 || f == 0) return;
  switch (fp) {
    case Fp::f32: launch_gate<f32_t>(attn, gate, y); break;
    case Fp::f16: launch_gate<f16_t>(attn, gate, y); break;
    case Fp::bf16: launch_gate<bf16_t>(attn, gate, y); break;
  }
}

}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(gated_rmsnorm, ftlab::gated_rmsnorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(output_gate, ftlab::output_gate);

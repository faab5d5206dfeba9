// conv1d_launch.hip — host glue for conv1d.hip (tvm-ffi entries, torch's current stream).
// ftlab.ops checked the layouts; the checks here keep a direct caller in bounds.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include "conv1d.hip"
#include "launch_common.h"

namespace ftlab {

using tvm::ffi::TensorView;
using namespace launch;

namespace {

void check_f32_vector(const TensorView& t, const char* name, int64_t n) {
  TVM_FFI_CHECK(t.dtype().code == kDLFloat && t.dtype().bits == 32, TypeError) << name << " must be float32";
  check_contiguous(t, name);
  TVM_FFI_CHECK(t.numel() == n, ValueError) << name << " must hold " << n << " elements";
}

int width_of(const TensorView& w, int64_t c) {
  TVM_FFI_CHECK(w.ndim() == 2 && w.size(0) == c && w.size(1) >= 2 && w.size(1) <= 4, ValueError)
      << "weight must be [C, W] with W in [2, 4]";
  check_f32_vector(w, "weight", w.numel());
  return static_cast<int>(w.size(1));
}

template <typename T, int W>
void launch_prefill(const TensorView& x, const TensorView& w, const float* bias, const void* state,
                    const int32_t* lengths, const TensorView& y, const TensorView& new_state, bool silu) {
  using S = typename T::storage;
  const int b = static_cast<int>(x.size(0)), t = static_cast<int>(x.size(1)), c = static_cast<int>(x.size(2));
  const dim3 grid((c + kConvThreads - 1) / kConvThreads, t > 0 ? (t + kConvRun - 1) / kConvRun : 1, b);
  causal_conv1d_kernel<T, W><<<grid, kConvThreads, 0, stream_of(x)>>>(
      static_cast<const S*>(base_of(x)), x.stride(0), x.stride(1), static_cast<const float*>(base_of(w)), bias,
      static_cast<const S*>(state), lengths, static_cast<S*>(base_of(y)), static_cast<S*>(base_of(new_state)), t, c,
      silu);
  check_launch("causal_conv1d_kernel");
}

template <typename T, int W>
void launch_update(const TensorView& x, const TensorView& w, const float* bias, const TensorView& state,
                   const uint8_t* reset, int64_t r_sb, const TensorView& y, bool silu) {
  using S = typename T::storage;
  const int b = static_cast<int>(x.size(0)), c = static_cast<int>(x.size(1));
  const dim3 grid((c + kConvThreads - 1) / kConvThreads, b);
  causal_conv1d_update_kernel<T, W><<<grid, kConvThreads, 0, stream_of(x)>>>(
      static_cast<const S*>(base_of(x)), x.stride(0), static_cast<const float*>(base_of(w)), bias,
      static_cast<S*>(base_of(state)), state.stride(0), state.stride(1), reset, r_sb, static_cast<S*>(base_of(y)), c,
      silu);
  check_launch("causal_conv1d_update_kernel");
}

#define FTLAB_CONV1D_DISPATCH(LAUNCH, fp, width, ...)                 \
  switch (fp) {                                                       \
    case Fp::f32:                                                     \
      if (width == 2) LAUNCH<f32_t, 2>(__VA_ARGS__);                  \
      else if (width == 3) LAUNCH<f32_t, 3>(__VA_ARGS__);             \
      else LAUNCH<f32_t, 4>(__VA_ARGS__);                             \
      break;                                                          \
    case Fp::f16:                                                     \
      if (width == 2) LAUNCH<f16_t, 2>(__VA_ARGS__);                  \
      else if (width == 3) LAUNCH<f16_t, 3>(__VA_ARGS__);             \
      else LAUNCH<f16_t, 4>(__VA_ARGS__);                             \
      break;                                                          \
    case Fp::bf16:                                                    \
      if (width == 2) LAUNCH<bf16_t, 2>(__VA_ARGS__);                 \
      else if (width == 3) LAUNCH<bf16_t, 3>(__VA_ARGS__);            \
      else LAUNCH<bf16_t, 4>(__VA_ARGS__);                            \
      break;                                                          \
  }

}  // namespace

// x [B, T, C] (unit channel stride), weight [C, W] fp32, bias [C] fp32 (used when has_bias),
// state [B, C, W-1] contiguous in x's dtype (when has_state), lengths [B] int32 (when
// has_lengths); y [B, T, C] and new_state [B, C, W-1] contiguous in x's dtype.
void causal_conv1d(TensorView x, TensorView w, TensorView bias, TensorView state, TensorView lengths, TensorView y,
                   TensorView new_state, bool has_bias, bool has_state, bool has_lengths, bool silu) {
  TVM_FFI_CHECK(x.ndim() == 3 && (x.size(2) <= 1 || x.stride(2) == 1), ValueError)
      << "x must be [B, T, C] with a unit channel stride";
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const int width = width_of(w, c);
  if (has_bias) check_f32_vector(bias, "bias", c);
  const Fp fp = fp_of(x, "x");
  for (const TensorView* o : {&y, &new_state}) {
    check_contiguous(*o, "outputs");
    TVM_FFI_CHECK(fp_of(*o, "outputs") == fp, TypeError) << "the outputs must have x's dtype";
  }
  TVM_FFI_CHECK(y.ndim() == 3 && y.size(0) == b && y.size(1) == t && y.size(2) == c, ValueError) << "y must be [B, T, C]";
  TVM_FFI_CHECK(new_state.ndim() == 3 && new_state.size(0) == b && new_state.size(1) == c &&
                    new_state.size(2) == width - 1,
                ValueError)
      << "new_state must be [B, C, W-1]";
  if (has_state) {
    check_contiguous(state, "state");
    TVM_FFI_CHECK(fp_of(state, "state") == fp, TypeError) << "state must have x's dtype";
    TVM_FFI_CHECK(state.numel() == b * c * (width - 1), ValueError) << "state must be [B, C, W-1]";
  }
  if (has_lengths) {
    check_contiguous(lengths, "lengths");
    TVM_FFI_CHECK(lengths.dtype().code == kDLInt && lengths.dtype().bits == 32, TypeError) << "lengths must be int32";
    TVM_FFI_CHECK(lengths.numel() == b, ValueError) << "lengths must be [B]";
  }
  if (b == 0 || c == 0) return;
  const float* bias_p = has_bias ? static_cast<const float*>(base_of(bias)) : nullptr;
  const void* state_p = has_state ? base_of(state) : nullptr;
  const int32_t* len_p = has_lengths ? static_cast<const int32_t*>(base_of(lengths)) : nullptr;
  FTLAB_CONV1D_DISPATCH(launch_prefill, fp, width, x, w, bias_p, state_p, len_p, y, new_state, silu)
}

// x [B, C] (unit channel stride), weight [C, W] fp32, bias [C] fp32 (when has_bias), state
// [B, C, W-1] in x's dtype with a unit last stride (updated in place), reset [B] uint8 (a bool
// tensor's bytes, any stride; when has_reset: nonzero rows start from a zero state), y [B, C]
// contiguous.
void causal_conv1d_update(TensorView x, TensorView w, TensorView bias, TensorView state, TensorView reset, TensorView y,
                          bool has_bias, bool has_reset, bool silu) {
  TVM_FFI_CHECK(x.ndim() == 2 && (x.size(1) <= 1 || x.stride(1) == 1), ValueError)
      << "x must be [B, C] with a unit channel stride";
  const int64_t b = x.size(0), c = x.size(1);
  const int width = width_of(w, c);
  if (has_bias) check_f32_vector(bias, "bias", c);
  const Fp fp = fp_of(x, "x");
  TVM_FFI_CHECK(fp_of(state, "state") == fp && fp_of(y, "y") == fp, TypeError) << "state and y must have x's dtype";
  TVM_FFI_CHECK(state.ndim() == 3 && state.size(0) == b && state.size(1) == c && state.size(2) == width - 1 &&
                    (width == 2 || state.stride(2) == 1),
                ValueError)
      << "state must be [B, C, W-1] with a unit last stride";
  check_contiguous(y, "y");
  TVM_FFI_CHECK(y.ndim() == 2 && y.size(0) == b && y.size(1) == c, ValueError) << "y must be [B, C]";
  if (has_reset) {
    TVM_FFI_CHECK(reset.dtype().code == kDLUInt && reset.dtype().bits == 8 && reset.dtype().lanes == 1, TypeError)
        << "reset must be uint8 (a bool tensor's bytes)";
    TVM_FFI_CHECK(reset.ndim() == 1 && reset.size(0) == b, ValueError) << "reset must be [B]";
  }
  if (b == 0 || c == 0) return;
  const float* bias_p = has_bias ? static_cast<const float*>(base_of(bias)) : nullptr;
  const uint8_t* reset_p = has_reset ? static_cast<const uint8_t*>(base_of(reset)) : nullptr;
  const int64_t r_sb = has_reset ? reset.stride(0) : 0;
  FTLAB_CONV1D_DISPATCH(launch_update, fp, width, x, w, bias_p, state, reset_p, r_sb, y, silu)
}

}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(causal_conv1d, ftlab::causal_conv1d);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(causal_conv1d_update, ftlab::causal_conv1d_update);

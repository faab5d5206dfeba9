// launch_common.h — host helpers shared by the tvm-ffi launchers of the Q4_0 and MoE
// modules: raw pointers and streams of TensorViews, launch errors, dtype dispatch.
#pragma once
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include "port.h"

namespace ftlab {
namespace launch {

using tvm::ffi::TensorView;

inline void* base_of(const TensorView& t) { return static_cast<char*>(t.data_ptr()) + t.byte_offset(); }

inline port_stream_t stream_of(const TensorView& t) {
  return static_cast<port_stream_t>(TVMFFIEnvGetStream(t.device().device_type, t.device().device_id));
}

inline void check_launch(const char* what) {
  port_error_t err = port_get_last_error();
  TVM_FFI_CHECK(err == port_success, RuntimeError) << what << " launch failed: " << port_error_string(err);
}

enum class Fp { f32, f16, bf16 };

inline Fp fp_of(const TensorView& t, const char* name) {
  const DLDataType dt = t.dtype();
  if (dt.code == kDLFloat && dt.bits == 32) return Fp::f32;
  if (dt.code == kDLFloat && dt.bits == 16) return Fp::f16;
  if (dt.code == kDLBfloat && dt.bits == 16) return Fp::bf16;
  TVM_FFI_THROW(TypeError) << name << " must be float32, float16 or bfloat16";
  return Fp::f32;
}

inline void check_contiguous(const TensorView& t, const char* name) {
  TVM_FFI_CHECK(t.IsContiguous(), ValueError) << name << " must be contiguous";
}

}  // namespace launch
}  // namespace ftlab

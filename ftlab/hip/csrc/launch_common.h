// launch_common.h — host helpers shared by the tvm-ffi launchers of the Q4_0 and MoE
// modules: raw pointers and streams of TensorViews, launch errors, dtype dispatch.
#pragma once
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstdlib>
#include <utility>

#include "port.h"

namespace ftlab {
namespace launch {

using tvm::ffi::TensorView;

// Whether launch_pdl launches programmatically dependent on the current device: CUDA on compute
// capability 9.0 or later, unless FTLAB_PDL=0 (read once a process).
inline bool pdl_enabled() {
#if defined(PORT_CUDA)
  static const bool off = [] {
    const char* v = std::getenv("FTLAB_PDL");
    return v != nullptr && v[0] == '0' && v[1] == '\0';
  }();
  static int major[64] = {};  // per device: 0 not asked yet
  int device = 0;
  if (off || cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  if (major[device] == 0) {
    int m = 0;
    cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device);
    major[device] = m > 0 ? m : -1;
  }
  return major[device] >= 9;
#else
  return false;
#endif
}

// kernel<<<grid, block, 0, stream>>>(args...), launched programmatically dependent on the kernel
// before it on the stream where pdl_enabled() (port.h, port_pdl_wait: the kernel's contract); in
// stream order elsewhere. Stream capture records it as a programmatic edge of the graph.
template <typename... P, typename... A>
inline void launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, port_stream_t stream, A&&... args) {
#if defined(PORT_CUDA)
  if (pdl_enabled()) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
    return;
  }
#endif
  kernel<<<grid, block, 0, stream>>>(std::forward<A>(args)...);
}

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

// quants_launch.hip — host glue for quants.hip: tvm-ffi entry points dequantizing GGUF Q8_0,
// Q4_K, Q5_K and Q6_K blocks (uint8 tensors, via DLPack) into fp32 / fp16 / bf16 tensors,
// launched on torch's current stream. One entry point per block type (the Python wrapper
// picks it by the weight's qtype), so the block sizes are never a run-time argument.
//
// ftlab.ops validates shapes, dtypes and devices before calling in here; the checks below
// only keep a direct caller from reading or writing out of bounds (or misaligned).
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include "launch_common.h"
#include "quants.hip"

namespace ftlab {
namespace quants {

using tvm::ffi::TensorView;
using namespace launch;

namespace {

template <typename T, typename Q>
void launch_kernel(const TensorView& w, const TensorView& out, int64_t chunks) {
  const int64_t grid = (chunks + kThreads - 1) / kThreads;
  TVM_FFI_CHECK(grid <= 0x7fffffff, ValueError) << "out is too large for one launch: " << out.numel() << " values";
  dequantize_kernel<T, Q><<<static_cast<unsigned>(grid), kThreads, 0, stream_of(out)>>>(
      static_cast<const uint8_t*>(base_of(w)), static_cast<typename T::storage*>(base_of(out)), chunks);
}

// out (any shape, contiguous, fp32 / fp16 / bf16) = the blocks of w (contiguous uint8, whole
// blocks in order), numel(out) / Q::kBlock of them.
template <typename Q>
void dequantize(const TensorView& w, const TensorView& out, const char* what) {
  check_contiguous(w, "w");
  check_contiguous(out, "out");
  TVM_FFI_CHECK(w.dtype().code == kDLUInt && w.dtype().bits == 8 && w.dtype().lanes == 1, TypeError)
      << "w must be uint8 " << what << " blocks";
  const int64_t nb = out.numel() / Q::kBlock;
  TVM_FFI_CHECK(out.numel() % Q::kBlock == 0 && w.numel() == nb * Q::kBytes, ValueError)
      << "w must hold numel(out)/" << Q::kBlock << " " << what << " blocks of " << Q::kBytes
      << " bytes: got " << w.numel() << " bytes for " << out.numel() << " values";
  const Fp fp = fp_of(out, "out");
  if (nb == 0) return;
  // the kernel reads 16-bit words (blocks are even-sized) and writes 16-byte vectors
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(base_of(w)) % 2 == 0, ValueError) << "w must be 2-byte aligned";
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(base_of(out)) % 16 == 0, ValueError) << "out must be 16-byte aligned";
  const int64_t chunks = out.numel() / kChunk;  // kBlock is a multiple of kChunk
  switch (fp) {
    case Fp::f32: launch_kernel<f32_t, Q>(w, out, chunks); break;
    case Fp::f16: launch_kernel<f16_t, Q>(w, out, chunks); break;
    case Fp::bf16: launch_kernel<bf16_t, Q>(w, out, chunks); break;
  }
  check_launch("dequantize_kernel");
}

template <typename T>
void launch_quantize(const TensorView& x, const TensorView& out, int64_t nb) {
  quantize_q8_0_kernel<T><<<static_cast<unsigned>((nb + kThreads - 1) / kThreads), kThreads, 0, stream_of(out)>>>(
      static_cast<const typename T::storage*>(base_of(x)), static_cast<uint8_t*>(base_of(out)), nb);
}

}  // namespace

// out (contiguous uint8, numel(x) / 32 blocks of 34 bytes, 2-byte aligned) = Q8_0 of x
// (contiguous fp32 / fp16 / bf16).
void quantize_q8_0(TensorView x, TensorView out) {
  check_contiguous(x, "x");
  check_contiguous(out, "out");
  TVM_FFI_CHECK(out.dtype().code == kDLUInt && out.dtype().bits == 8 && out.dtype().lanes == 1, TypeError)
      << "out must be uint8";
  const int64_t nb = x.numel() / Q8_0::kBlock;
  TVM_FFI_CHECK(x.numel() % Q8_0::kBlock == 0 && out.numel() == nb * Q8_0::kBytes, ValueError)
      << "out must hold numel(x)/32 Q8_0 blocks of 34 bytes: got " << out.numel() << " bytes for " << x.numel()
      << " values";
  const Fp fp = fp_of(x, "x");
  if (nb == 0) return;
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(base_of(out)) % 2 == 0, ValueError) << "out must be 2-byte aligned";
  TVM_FFI_CHECK((nb + kThreads - 1) / kThreads <= 0x7fffffff, ValueError) << "x is too large for one launch";
  switch (fp) {
    case Fp::f32: launch_quantize<f32_t>(x, out, nb); break;
    case Fp::f16: launch_quantize<f16_t>(x, out, nb); break;
    case Fp::bf16: launch_quantize<bf16_t>(x, out, nb); break;
  }
  check_launch("quantize_q8_0_kernel");
}

void dequantize_q8_0(TensorView w, TensorView out) { dequantize<Q8_0>(w, out, "Q8_0"); }
void dequantize_q4_k(TensorView w, TensorView out) { dequantize<QK4<false>>(w, out, "Q4_K"); }
void dequantize_q5_k(TensorView w, TensorView out) { dequantize<QK4<true>>(w, out, "Q5_K"); }
void dequantize_q6_k(TensorView w, TensorView out) { dequantize<Q6_K>(w, out, "Q6_K"); }

}  // namespace quants
}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(quantize_q8_0, ftlab::quants::quantize_q8_0);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(dequantize_q8_0, ftlab::quants::dequantize_q8_0);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(dequantize_q4_k, ftlab::quants::dequantize_q4_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(dequantize_q5_k, ftlab::quants::dequantize_q5_k);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(dequantize_q6_k, ftlab::quants::dequantize_q6_k);

// moe_kquant_launch.hip — host glue for moe_kquant.hip: tvm-ffi entry points of the routed
// experts' int8 kernels on Q8_0 / K-quant banks (and Q4_0 beside one), launched on torch's
// current stream. The bank's type comes as its code (QT_CODES of ftlab/hip/moe.py: Q8_0 0,
// Q4_K 1, Q5_K 2, Q6_K 3, Q4_0 4).
//
// ftlab.ops validates shapes, dtypes and devices before calling in here; the checks below
// only keep a direct caller from reading or writing out of bounds (or misaligned).
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include "launch_common.h"
#include "moe_kquant.hip"

namespace ftlab {
namespace qmm {

using tvm::ffi::TensorView;
using namespace launch;

namespace {

int64_t block_of(int64_t code) { return code == 0 || code == 4 ? 32 : 256; }
int64_t bytes_of(int64_t code) {
  constexpr int64_t kBytes[5] = {34, 144, 176, 210, 18};
  return kBytes[code];
}

// The Q8_1 rows q8 [R, K] (d8, s8 [R, K/32]) against bank w [E, N, K/block*bytes] of type code.
void check_parts(const TensorView& q, const TensorView& d, const TensorView& s, const TensorView& w, int64_t code,
                 int64_t rows, int64_t k, int64_t n) {
  TVM_FFI_CHECK(code >= 0 && code <= 4, ValueError) << "qtype code must be 0..4, got " << code;
  check_contiguous(q, "q8");
  check_contiguous(d, "d8");
  check_contiguous(s, "s8");
  check_contiguous(w, "w");
  TVM_FFI_CHECK(q.ndim() == 2 && q.size(0) == rows && q.size(1) == k && k % block_of(code) == 0, ValueError)
      << "q8 must be [" << rows << ", " << k << "] with K a multiple of the bank's block";
  TVM_FFI_CHECK(d.numel() == rows * (k / 32) && s.numel() == d.numel(), ValueError) << "d8 and s8 must be [R, K/32]";
  TVM_FFI_CHECK(w.ndim() == 3 && w.size(1) == n && w.size(2) == k / block_of(code) * bytes_of(code), ValueError)
      << "w must be [E, " << n << ", K/block*bytes]";
  TVM_FFI_CHECK(w.dtype().code == kDLUInt && w.dtype().bits == 8, TypeError) << "w must be uint8";
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(base_of(w)) % 4 == 0 && reinterpret_cast<uintptr_t>(base_of(q)) % 4 == 0,
                ValueError)
      << "w and q8 must be 4-byte aligned";
}

void check_ids(const TensorView& ids, int64_t tokens, int64_t top_k) {
  check_contiguous(ids, "ids");
  TVM_FFI_CHECK(ids.dtype().code == kDLInt && ids.dtype().bits == 32 && ids.numel() == tokens * top_k, TypeError)
      << "ids must be int32 [T, k]";
}

}  // namespace

// h fp32 [T*k, I] = SwiGLU of the gate/up rows of w [E, 2I, *] against Q8_1 x (q8 [T, H]).
void moe_gate_up_kq(TensorView q8, TensorView d8, TensorView s8, TensorView w, int64_t code, TensorView ids,
                    TensorView h) {
  const int64_t tokens = q8.size(0), hidden = q8.size(1), inter = h.size(1);
  TVM_FFI_CHECK(h.ndim() == 2 && h.size(0) % (tokens > 0 ? tokens : 1) == 0, ValueError) << "h must be [T*k, I]";
  const int64_t pairs = h.size(0), top_k = tokens > 0 ? pairs / tokens : 1;
  check_parts(q8, d8, s8, w, code, tokens, hidden, 2 * inter);
  check_ids(ids, tokens, top_k);
  check_contiguous(h, "h");
  if (pairs == 0 || inter == 0) return;
  const dim3 grid(static_cast<unsigned>(pairs), static_cast<unsigned>((inter + kRowsPerBlock - 1) / kRowsPerBlock));
  const dim3 block(kGroup, kRowsPerBlock);
  const auto* qp = static_cast<const int8_t*>(base_of(q8));
  const auto* dp = static_cast<const float*>(base_of(d8));
  const auto* sp = static_cast<const float*>(base_of(s8));
  const auto* wp = static_cast<const uint8_t*>(base_of(w));
  const auto* ip = static_cast<const int32_t*>(base_of(ids));
  auto* hp = static_cast<float*>(base_of(h));
  const int64_t e_bytes = w.size(1) * w.size(2), row_bytes = w.size(2), experts = w.size(0);
  port_stream_t st = stream_of(h);
#define FTLAB_GU(Q) \
  moe_gate_up_kq_kernel<Q><<<grid, block, 0, st>>>(qp, dp, sp, wp, e_bytes, row_bytes, ip, hp, experts, hidden, inter, top_k)
  switch (code) {
    case 0: FTLAB_GU(Q8_0); break;
    case 1: FTLAB_GU(QK4<false>); break;
    case 2: FTLAB_GU(QK4<true>); break;
    case 3: FTLAB_GU(Q6_K); break;
    default: FTLAB_GU(QUnit4_0); break;
  }
#undef FTLAB_GU
  check_launch("moe_gate_up_kq_kernel");
}

// y fp32 [T, H] = sum over the slots of wts * the down rows of w [E, H, *] against Q8_1 h.
void moe_down_kq(TensorView q8, TensorView d8, TensorView s8, TensorView w, int64_t code, TensorView ids,
                 TensorView wts, TensorView y) {
  const int64_t tokens = y.size(0), hidden = y.size(1), pairs = q8.size(0), inter = q8.size(1);
  TVM_FFI_CHECK(y.ndim() == 2 && tokens > 0 && pairs % tokens == 0, ValueError) << "y must be [T, H], h [T*k, I]";
  const int64_t top_k = pairs / tokens;
  check_parts(q8, d8, s8, w, code, pairs, inter, hidden);
  check_ids(ids, tokens, top_k);
  check_contiguous(wts, "wts");
  check_contiguous(y, "y");
  TVM_FFI_CHECK(wts.numel() == pairs && wts.dtype().code == kDLFloat && wts.dtype().bits == 32, TypeError)
      << "wts must be fp32 [T, k]";
  if (hidden == 0) return;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((hidden + kRowsPerBlock - 1) / kRowsPerBlock));
  const dim3 block(kGroup, kRowsPerBlock);
  const auto* qp = static_cast<const int8_t*>(base_of(q8));
  const auto* dp = static_cast<const float*>(base_of(d8));
  const auto* sp = static_cast<const float*>(base_of(s8));
  const auto* wp = static_cast<const uint8_t*>(base_of(w));
  const auto* ip = static_cast<const int32_t*>(base_of(ids));
  const auto* ww = static_cast<const float*>(base_of(wts));
  auto* yp = static_cast<float*>(base_of(y));
  const int64_t e_bytes = w.size(1) * w.size(2), row_bytes = w.size(2), experts = w.size(0);
  port_stream_t st = stream_of(y);
#define FTLAB_DN(Q)                                                                                          \
  moe_down_kq_kernel<Q><<<grid, block, 0, st>>>(qp, dp, sp, wp, e_bytes, row_bytes, ip, ww, yp, experts, hidden, \
                                                inter, top_k)
  switch (code) {
    case 0: FTLAB_DN(Q8_0); break;
    case 1: FTLAB_DN(QK4<false>); break;
    case 2: FTLAB_DN(QK4<true>); break;
    case 3: FTLAB_DN(Q6_K); break;
    default: FTLAB_DN(QUnit4_0); break;
  }
#undef FTLAB_DN
  check_launch("moe_down_kq_kernel");
}

}  // namespace qmm
}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_gate_up_kq, ftlab::qmm::moe_gate_up_kq);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_down_kq, ftlab::qmm::moe_down_kq);

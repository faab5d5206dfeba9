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

namespace {

// A K-quant bank of the vec decode: uint8 [E, rows, K/256*bytes], contiguous, 16-byte aligned.
const uint8_t* vec_bank(const TensorView& w, int64_t code, int64_t rows, int64_t k, const char* name) {
  TVM_FFI_CHECK(code >= 1 && code <= 3, ValueError)
      << "the vec decode experts take Q4_K, Q5_K or Q6_K banks (codes 1..3) for " << name << ", got code " << code;
  check_contiguous(w, name);
  TVM_FFI_CHECK(w.dtype().code == kDLUInt && w.dtype().bits == 8, TypeError) << name << " must be uint8";
  TVM_FFI_CHECK(w.ndim() == 3 && w.size(1) == rows && w.size(2) == k / 256 * bytes_of(code), ValueError)
      << name << " must be [E, " << rows << ", " << k / 256 * bytes_of(code) << "], got ndim " << w.ndim()
      << " with " << (w.ndim() == 3 ? w.size(1) : -1) << " rows of " << (w.ndim() == 3 ? w.size(2) : -1) << " bytes";
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(base_of(w)) % 16 == 0, ValueError) << name << " must be 16-byte aligned";
  return static_cast<const uint8_t*>(base_of(w));
}

template <typename T, typename Q>
void vec_gate_up(dim3 grid, port_stream_t st, const TensorView& x, const uint8_t* w, int64_t e_stride,
                 int64_t row_bytes, const int32_t* ids, int8_t* hq, float* hd, float* hs, int experts, int hidden,
                 int inter, int top_k) {
  launch_pdl(moe_gate_up_kq_vec_kernel<T, Q>, grid, dim3(kMoeThreads), st,
             static_cast<const typename T::storage*>(base_of(x)), x.stride(0), w, e_stride, row_bytes, ids, hq, hd,
             hs, experts, hidden, inter, top_k);
}

template <typename T, typename Q>
void vec_down(dim3 grid, port_stream_t st, const int8_t* hq, const float* hd, const float* hs, const uint8_t* w,
              int64_t e_stride, int64_t row_bytes, const int32_t* ids, const float* wts, const TensorView& y,
              int experts, int hidden, int inter, int top_k) {
  launch_pdl(moe_down_kq_vec_kernel<T, Q>, grid, dim3(kMoeThreads), st, hq, hd, hs, w, e_stride, row_bytes, ids, wts,
             static_cast<typename T::storage*>(base_of(y)), y.stride(0), experts, hidden, inter, top_k);
}

template <typename T>
void launch_vec(int64_t gu_code, int64_t dn_code, const TensorView& x, const TensorView& gw, const TensorView& dw,
                const uint8_t* gp, const uint8_t* dp, const int32_t* ids, const float* wts, int8_t* hq, float* hd,
                float* hs, const TensorView& y, int64_t top_k) {
  const int64_t tokens = x.size(0), hidden = x.size(1), inter = dw.size(2) / bytes_of(dn_code) * 256;
  const int experts = static_cast<int>(gw.size(0)), h = static_cast<int>(hidden), i = static_cast<int>(inter),
            k = static_cast<int>(top_k);
  port_stream_t st = stream_of(y);
  const dim3 gu_grid(static_cast<unsigned>(tokens * top_k), static_cast<unsigned>(inter / kQK));
  const dim3 dn_grid(static_cast<unsigned>(tokens), static_cast<unsigned>((hidden + kDownRows - 1) / kDownRows));
  const int64_t gs = gw.size(1) * gw.size(2), gr = gw.size(2), ds = dw.size(1) * dw.size(2), dr = dw.size(2);
  switch (gu_code) {
    case 1: vec_gate_up<T, QK4<false>>(gu_grid, st, x, gp, gs, gr, ids, hq, hd, hs, experts, h, i, k); break;
    case 2: vec_gate_up<T, QK4<true>>(gu_grid, st, x, gp, gs, gr, ids, hq, hd, hs, experts, h, i, k); break;
    default: vec_gate_up<T, Q6_K>(gu_grid, st, x, gp, gs, gr, ids, hq, hd, hs, experts, h, i, k); break;
  }
  switch (dn_code) {
    case 1: vec_down<T, QK4<false>>(dn_grid, st, hq, hd, hs, dp, ds, dr, ids, wts, y, experts, h, i, k); break;
    case 2: vec_down<T, QK4<true>>(dn_grid, st, hq, hd, hs, dp, ds, dr, ids, wts, y, experts, h, i, k); break;
    default: vec_down<T, Q6_K>(dn_grid, st, hq, hd, hs, dp, ds, dr, ids, wts, y, experts, h, i, k); break;
  }
}

}  // namespace

// Decode experts on K-quant banks, two launches (moe_kquant.hip's vec kernels): x [T, H] (fp32,
// fp16 or bf16, rows contiguous), w_gate_up [E, 2I, H/256*bytes] of type gu_code and w_down
// [E, H, I/256*bytes] of type dn_code (1 Q4_K, 2 Q5_K, 3 Q6_K), ids int32 / wts fp32 [T, k];
// scratch hq int8 [T*k, I], hd / hs fp32 [T*k, I/32] (h as Q8_1); y [T, H] in x's dtype.
void moe_experts_decode_kq(TensorView x, TensorView w_gate_up, int64_t gu_code, TensorView w_down, int64_t dn_code,
                           TensorView ids, TensorView wts, TensorView hq, TensorView hd, TensorView hs, TensorView y) {
  TVM_FFI_CHECK(x.ndim() == 2 && (x.size(1) <= 1 || x.stride(1) == 1), ValueError)
      << "x must be [T, H] with contiguous rows, got ndim " << x.ndim();
  const Fp fp = fp_of(x, "x");
  const int64_t tokens = x.size(0), hidden = x.size(1);
  TVM_FFI_CHECK(hq.ndim() == 2, ValueError) << "hq must be [T * k, I], got ndim " << hq.ndim();
  const int64_t inter = hq.size(1);
  TVM_FFI_CHECK(ids.ndim() == 2 && ids.size(0) == tokens, ValueError)
      << "ids must be [T, k] with T = " << tokens << ", got ndim " << ids.ndim();
  const int64_t top_k = ids.size(1);
  check_ids(ids, tokens, top_k);
  TVM_FFI_CHECK(hidden % 256 == 0 && inter % 256 == 0 && hidden <= kDecodeFloats && top_k >= 1 &&
                    top_k <= kMaxSlots && top_k * inter <= kDecodeFloats,
                ValueError)
      << "the vec decode experts take H and I multiples of 256, H and k * I up to " << kDecodeFloats
      << " and 1 <= k <= " << kMaxSlots << ", got H = " << hidden << ", I = " << inter << ", k = " << top_k;
  const uint8_t* gp = vec_bank(w_gate_up, gu_code, 2 * inter, hidden, "w_gate_up");
  const uint8_t* dp = vec_bank(w_down, dn_code, hidden, inter, "w_down");
  TVM_FFI_CHECK(w_down.size(0) == w_gate_up.size(0), ValueError)
      << "w_gate_up and w_down must hold the same experts, got " << w_gate_up.size(0) << " and " << w_down.size(0);
  check_contiguous(wts, "wts");
  TVM_FFI_CHECK(wts.numel() == tokens * top_k && wts.dtype().code == kDLFloat && wts.dtype().bits == 32, TypeError)
      << "wts must be fp32 [T, k]";
  check_contiguous(hq, "hq");
  check_contiguous(hd, "hd");
  check_contiguous(hs, "hs");
  TVM_FFI_CHECK(hq.dtype().code == kDLInt && hq.dtype().bits == 8, TypeError) << "hq must be int8";
  TVM_FFI_CHECK(hq.size(0) == tokens * top_k, ValueError)
      << "hq must be [T * k, I] = [" << tokens * top_k << ", " << inter << "], got " << hq.size(0) << " rows";
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(base_of(hq)) % 16 == 0, ValueError)
      << "hq must be 16-byte aligned (its rows are read as 16-byte pieces)";
  for (const TensorView* v : {&hd, &hs}) {
    TVM_FFI_CHECK(v->numel() == tokens * top_k * (inter / 32) && v->dtype().code == kDLFloat && v->dtype().bits == 32,
                  ValueError)
        << "hd and hs must be fp32 [T * k, I / 32] = [" << tokens * top_k << ", " << inter / 32 << "]";
  }
  check_contiguous(y, "y");
  TVM_FFI_CHECK(y.ndim() == 2 && y.size(0) == tokens && y.size(1) == hidden && fp_of(y, "y") == fp, ValueError)
      << "y must be [T, H] = [" << tokens << ", " << hidden << "] in x's dtype";
  if (tokens == 0) return;
  const auto* ip = static_cast<const int32_t*>(base_of(ids));
  const auto* wp = static_cast<const float*>(base_of(wts));
  auto* qp = static_cast<int8_t*>(base_of(hq));
  auto* dd = static_cast<float*>(base_of(hd));
  auto* ss = static_cast<float*>(base_of(hs));
  switch (fp) {
    case Fp::f32: launch_vec<f32_t>(gu_code, dn_code, x, w_gate_up, w_down, gp, dp, ip, wp, qp, dd, ss, y, top_k); break;
    case Fp::f16: launch_vec<f16_t>(gu_code, dn_code, x, w_gate_up, w_down, gp, dp, ip, wp, qp, dd, ss, y, top_k); break;
    case Fp::bf16:
      launch_vec<bf16_t>(gu_code, dn_code, x, w_gate_up, w_down, gp, dp, ip, wp, qp, dd, ss, y, top_k);
      break;
  }
  check_launch("moe K-quant vec decode kernels");
}

}  // namespace qmm
}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_experts_decode_kq, ftlab::qmm::moe_experts_decode_kq);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_gate_up_kq, ftlab::qmm::moe_gate_up_kq);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_down_kq, ftlab::qmm::moe_down_kq);

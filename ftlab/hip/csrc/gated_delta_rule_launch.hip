// gated_delta_rule_launch.hip — host glue for gated_delta_rule.hip and gated_delta_rule_chunk.hip (tvm-ffi entries, torch's
// current stream).
// ftlab.ops checked shapes, dtypes and layouts; the checks here keep a direct caller in bounds.
#include <type_traits>

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include "gated_delta_rule.hip"
#include "gated_delta_rule_chunk.hip"
#include "gated_delta_rule_chunk_prep.hip"
#include "launch_common.h"

namespace ftlab {

using tvm::ffi::TensorView;
using namespace launch;

namespace {

struct DnDims {
  int64_t b, t, hk, hv, dk, dv;
};

// q, k [B, (T,) Hk, Dk]; v, o [B, (T,) Hv, Dv]; g, beta [B, (T,) Hv] fp32; state [B, Hv, Dk, Dv]
// fp32; all contiguous.
DnDims check_all(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                 const TensorView& beta, const TensorView& state, const TensorView& o, bool seq) {
  const int lead = seq ? 2 : 1;
  TVM_FFI_CHECK(q.ndim() == lead + 2 && v.ndim() == lead + 2, ValueError) << "q and v must have " << lead + 2 << " dims";
  DnDims d{q.size(0), seq ? q.size(1) : 1, q.size(lead), v.size(lead), q.size(lead + 1), v.size(lead + 1)};
  TVM_FFI_CHECK(d.hk > 0 && d.hv % d.hk == 0, ValueError) << "Hv must be a multiple of Hk";
  TVM_FFI_CHECK(d.dk > 0 && d.dk <= kDnMaxDk && d.dv > 0, ValueError)
      << "Dk must be in [1, " << kDnMaxDk << "] and Dv >= 1";
  for (const TensorView* x : {&q, &k, &v, &g, &beta, &state, &o}) check_contiguous(*x, "every operand");
  const int64_t rows = d.b * d.t;
  TVM_FFI_CHECK(k.numel() == q.numel() && q.numel() == rows * d.hk * d.dk, ValueError) << "q and k must match";
  TVM_FFI_CHECK(o.numel() == v.numel() && v.numel() == rows * d.hv * d.dv, ValueError) << "o must match v";
  TVM_FFI_CHECK(g.numel() == rows * d.hv && beta.numel() == rows * d.hv, ValueError) << "g and beta must be [B, T, Hv]";
  TVM_FFI_CHECK(state.numel() == d.b * d.hv * d.dk * d.dv, ValueError) << "state must be [B, Hv, Dk, Dv]";
  const Fp fp = fp_of(q, "q");
  for (const TensorView* x : {&k, &v, &o}) TVM_FFI_CHECK(fp_of(*x, "operand") == fp, TypeError) << "q, k, v, o: one dtype";
  TVM_FFI_CHECK(fp_of(state, "state") == Fp::f32, TypeError) << "state must be float32";
  return d;
}

// a_neg or dt_bias: [n] fp32, contiguous.
void check_gate_vector(const TensorView& t, const char* name, int64_t n) {
  TVM_FFI_CHECK(t.ndim() == 1 && t.size(0) == n && fp_of(t, name) == Fp::f32, ValueError)
      << name << " must be [Hv] float32";
  check_contiguous(t, name);
}

// g and beta fp32 (as given) or, with the gates, the raw projections in q's dtype.
void check_gates(const TensorView& q, const TensorView& g, const TensorView& beta, bool gates) {
  const Fp want = gates ? fp_of(q, "q") : Fp::f32;
  for (const TensorView* x : {&g, &beta})
    TVM_FFI_CHECK(fp_of(*x, "g, beta") == want, TypeError)
        << (gates ? "g and beta (a and b) must have q's dtype with the gates" : "g and beta must be float32");
}

// The decode step's columns a block (16 or 32; 0: 16 when 32 would give fewer than 256 blocks).
int step_cols(const DnDims& d, int cols) {
  if (cols) return cols;
  return d.b * d.hv * ((d.dv + 31) / 32) < 256 ? 16 : 32;
}

// The step's optional inputs: the gates' a_neg and dt_bias [Hv] fp32, the reset bytes [B].
struct StepExtras {
  const float* a_neg = nullptr;
  const float* dt_bias = nullptr;
  const uint8_t* reset = nullptr;
};

template <typename T, bool Gates>
void launch_step(const dim3& grid, int cols, const typename T::storage* qp, const typename T::storage* kp,
                 const typename T::storage* vp, const void* gp, const void* bp, float* sp, typename T::storage* op,
                 const StepExtras& x, int hk, int hv, int dk, int dv, float scale, int l2norm, int vec,
                 const TensorView& q) {
  if (cols == 32)
    gated_delta_step_kernel<T, 8, Gates><<<grid, kDsThreads, 0, stream_of(q)>>>(
        qp, kp, vp, gp, bp, sp, op, x.a_neg, x.dt_bias, x.reset, hk, hv, dk, dv, scale, l2norm, vec);
  else
    gated_delta_step_kernel<T, 4, Gates><<<grid, kDsThreads, 0, stream_of(q)>>>(
        qp, kp, vp, gp, bp, sp, op, x.a_neg, x.dt_bias, x.reset, hk, hv, dk, dv, scale, l2norm, vec);
  check_launch("gated_delta_step_kernel");
}

template <typename T>
void launch(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
            const TensorView& beta, const TensorView& state, const TensorView& o, const DnDims& d, float scale,
            int l2norm, bool seq, int cols, const StepExtras& extras) {
  using S = typename T::storage;
  const auto* qp = static_cast<const S*>(base_of(q));
  const auto* kp = static_cast<const S*>(base_of(k));
  const auto* vp = static_cast<const S*>(base_of(v));
  const void* gp = base_of(g);
  const void* bp = base_of(beta);
  auto* sp = static_cast<float*>(base_of(state));
  auto* op = static_cast<S*>(base_of(o));
  const int hk = static_cast<int>(d.hk), hv = static_cast<int>(d.hv), dk = static_cast<int>(d.dk),
            dv = static_cast<int>(d.dv);
  if (seq) {
    const dim3 grid(static_cast<unsigned>(d.b * d.hv), static_cast<unsigned>((d.dv + kDnCols - 1) / kDnCols));
    gated_delta_scan_kernel<T><<<grid, kDnThreads, 0, stream_of(q)>>>(qp, kp, vp, static_cast<const float*>(gp),
                                                                      static_cast<const float*>(bp), sp, op,
                                                                      static_cast<int>(d.t), hk, hv, dk, dv, scale,
                                                                      l2norm);
    check_launch("gated_delta_scan_kernel");
    return;
  }
  // 16-byte state accesses when every row starts 16-byte aligned
  const int vec = d.dv % 4 == 0 && reinterpret_cast<uintptr_t>(sp) % 16 == 0;
  const dim3 grid(static_cast<unsigned>(d.b * d.hv), static_cast<unsigned>((d.dv + cols - 1) / cols));
  if (extras.a_neg != nullptr)
    launch_step<T, true>(grid, cols, qp, kp, vp, gp, bp, sp, op, extras, hk, hv, dk, dv, scale, l2norm, vec, q);
  else
    launch_step<T, false>(grid, cols, qp, kp, vp, gp, bp, sp, op, extras, hk, hv, dk, dv, scale, l2norm, vec, q);
}

void run(TensorView q, TensorView k, TensorView v, TensorView g, TensorView beta, TensorView state, TensorView o,
         double scale, bool l2norm, bool seq, int64_t cols, const StepExtras& extras) {
  const DnDims d = check_all(q, k, v, g, beta, state, o, seq);
  check_gates(q, g, beta, extras.a_neg != nullptr);
  TVM_FFI_CHECK(cols == 0 || cols == 16 || cols == 32, ValueError) << "cols must be 0, 16 or 32, got " << cols;
  const int c = seq ? 0 : step_cols(d, static_cast<int>(cols));
  if (d.b * d.t == 0) return;
  const float sc = static_cast<float>(scale);
  switch (fp_of(q, "q")) {
    case Fp::f32: launch<f32_t>(q, k, v, g, beta, state, o, d, sc, l2norm, seq, c, extras); break;
    case Fp::f16: launch<f16_t>(q, k, v, g, beta, state, o, d, sc, l2norm, seq, c, extras); break;
    case Fp::bf16: launch<bf16_t>(q, k, v, g, beta, state, o, d, sc, l2norm, seq, c, extras); break;
  }
}

}  // namespace

// One token: q, k [B, Hk, Dk], v, o [B, Hv, Dv], g, beta [B, Hv], state [B, Hv, Dk, Dv] in place;
// cols: the state columns a block (16 or 32; 0 picks by the block count). With has_gates, g and
// beta are the raw projections a and b in q's dtype and a_neg, dt_bias [Hv] fp32 make the gates;
// with has_reset, reset [B] (bytes, nonzero: the row starts from a zero state). Unused tensors
// are placeholders, never read.
void gated_delta_step(TensorView q, TensorView k, TensorView v, TensorView g, TensorView beta, TensorView state,
                      TensorView o, double scale, bool l2norm, int64_t cols, TensorView a_neg, TensorView dt_bias,
                      TensorView reset, bool has_gates, bool has_reset) {
  StepExtras x;
  if (has_gates) {
    const int64_t hv = v.ndim() == 3 ? v.size(1) : 0;
    check_gate_vector(a_neg, "a_neg", hv);
    check_gate_vector(dt_bias, "dt_bias", hv);
    x.a_neg = static_cast<const float*>(base_of(a_neg));
    x.dt_bias = static_cast<const float*>(base_of(dt_bias));
  }
  if (has_reset) {
    TVM_FFI_CHECK(reset.ndim() == 1 && reset.size(0) == q.size(0) && reset.dtype().bits == 8, ValueError)
        << "reset must be [B] bytes";
    check_contiguous(reset, "reset");
    x.reset = static_cast<const uint8_t*>(base_of(reset));
  }
  run(q, k, v, g, beta, state, o, scale, l2norm, false, cols, x);
}

// A sequence: q, k [B, T, Hk, Dk], v, o [B, T, Hv, Dv], g, beta [B, T, Hv]; state holds the
// initial state and receives the final one.
void gated_delta_scan(TensorView q, TensorView k, TensorView v, TensorView g, TensorView beta, TensorView state,
                      TensorView o, double scale, bool l2norm) {
  run(q, k, v, g, beta, state, o, scale, l2norm, true, 0, StepExtras{});
}

// The chunked prefill on the matrix cores (gated_delta_rule_chunk.hip): as gated_delta_scan for bf16 q, k,
// v, o (Dk <= 128), with scratch ab and attn [B, Hv, NT, planes, 64, 64] bf16 and sc [B, Hv, NT, 4,
// 64] fp32 (NT = ceil(T / 64); contiguous, any contents: every element is written before it is
// read). planes: 3 (fp32 operands in three bf16 parts) or 1 (each rounded to bf16 once).
void gated_delta_chunk(TensorView q, TensorView k, TensorView v, TensorView g, TensorView beta, TensorView state,
                       TensorView o, TensorView ab, TensorView attn, TensorView sc, double scale, bool l2norm,
                       int64_t planes) {
  static_assert(kCkDk == kDnMaxDk, "one Dk limit for both prefills");
  const DnDims d = check_all(q, k, v, g, beta, state, o, true);
  check_gates(q, g, beta, false);
  TVM_FFI_CHECK(fp_of(q, "q") == Fp::bf16, TypeError) << "the chunked prefill takes bf16 q, k and v";
  const int64_t nt = (d.t + kCk - 1) / kCk, chunks = d.b * d.hv * nt;
  const int64_t heads_q = (d.hv / d.hk + kCkHeads - 1) / kCkHeads;
  auto check_scratch = [&](const TensorView& x, const char* name, Fp fp, const char* dims, int64_t per_chunk) {
    TVM_FFI_CHECK(fp_of(x, name) == fp, TypeError) << name << " must be " << (fp == Fp::f32 ? "float32" : "bfloat16");
    TVM_FFI_CHECK(x.numel() == chunks * per_chunk, ValueError)
        << name << " must be [B, Hv, NT, " << dims << "] (" << chunks * per_chunk << " elements), got " << x.numel()
        << " elements";
    check_contiguous(x, name);
    TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(base_of(x)) % 16 == 0, ValueError) << name << " must be 16-byte aligned";
  };
  TVM_FFI_CHECK(planes == 1 || planes == 3, ValueError) << "planes must be 1 or 3, got " << planes;
  const char* const dims = planes == 3 ? "3, 64, 64" : "1, 64, 64";
  check_scratch(ab, "ab", Fp::bf16, dims, planes * kCkPlanes);
  check_scratch(attn, "attn", Fp::bf16, dims, planes * kCkPlanes);
  check_scratch(sc, "sc", Fp::f32, "4, 64", 4 * kCk);
  TVM_FFI_CHECK(d.t < (int64_t{1} << 31) - kCk, ValueError) << "the chunked prefill takes T < 2^31 - 64, got " << d.t;
  TVM_FFI_CHECK(d.b * d.hk * heads_q <= 65535 && (d.dv + kCkBV - 1) / kCkBV <= 65535, ValueError)
      << "the chunked prefill's grids take B * Hk * ceil(Hv / Hk / 4) <= 65535 and ceil(Dv / 32) <= 65535, got "
      << d.b * d.hk * heads_q << " and " << (d.dv + kCkBV - 1) / kCkBV;
  TVM_FFI_CHECK(d.hv * d.dv * kCk < (int64_t{1} << 31), ValueError)
      << "the chunked prefill takes Hv * Dv < 2^25, got " << d.hv * d.dv;
  if (chunks == 0) return;
  const auto* qp = static_cast<const uint16_t*>(base_of(q));
  const auto* kp = static_cast<const uint16_t*>(base_of(k));
  auto* abp = static_cast<uint16_t*>(base_of(ab));
  auto* attnp = static_cast<uint16_t*>(base_of(attn));
  auto* scp = static_cast<float*>(base_of(sc));
  const int t = static_cast<int>(d.t), hk = static_cast<int>(d.hk), hv = static_cast<int>(d.hv),
            dk = static_cast<int>(d.dk), dv = static_cast<int>(d.dv);
  const dim3 prep(static_cast<unsigned>(nt), static_cast<unsigned>(d.b * d.hk * heads_q));
  const dim3 scan(static_cast<unsigned>(d.b * d.hv), static_cast<unsigned>((d.dv + kCkBV - 1) / kCkBV));
  auto launch = [&](auto planes_of) {
    constexpr int P = decltype(planes_of)::value;
    const port_error_t err = port_max_dynamic_lds(dn_chunk_prep_kernel<P>, kCkPrepLds);
    const port_error_t err2 = port_max_dynamic_lds(dn_chunk_scan_kernel<P>, kCkScanLds);
    if (err != port_success || err2 != port_success) port_get_last_error();  // cleared for the launch checks
    TVM_FFI_CHECK(err == port_success && err2 == port_success, RuntimeError)
        << "the chunked prefill needs " << kCkPrepLds << " and " << kCkScanLds
        << " bytes of shared memory a block, which this device does not grant: "
        << port_error_string(err != port_success ? err : err2);
    dn_chunk_prep_kernel<P><<<prep, kCkThreads, kCkPrepLds, stream_of(q)>>>(
        qp, kp, static_cast<const float*>(base_of(g)), static_cast<const float*>(base_of(beta)), abp, attnp, scp, t,
        hk, hv, dk, static_cast<int>(heads_q), static_cast<float>(scale), l2norm);
    check_launch("dn_chunk_prep_kernel");
    dn_chunk_scan_kernel<P><<<scan, kCkThreads, kCkScanLds, stream_of(q)>>>(
        qp, kp, static_cast<const uint16_t*>(base_of(v)), abp, attnp, scp, static_cast<float*>(base_of(state)),
        static_cast<uint16_t*>(base_of(o)), t, hk, hv, dk, dv);
    check_launch("dn_chunk_scan_kernel");
  };
  if (planes == 3) launch(std::integral_constant<int, 3>{});
  else launch(std::integral_constant<int, 1>{});
}

}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(gated_delta_chunk, ftlab::gated_delta_chunk);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gated_delta_step, ftlab::gated_delta_step);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gated_delta_scan, ftlab::gated_delta_scan);

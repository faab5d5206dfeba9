// qk_norm_rope_launch.hip — host glue for qk_norm_rope.hip (tvm-ffi entry, torch's current stream).
// ftlab.ops checked the layouts; the checks here keep a direct caller in bounds.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include "launch_common.h"
#include "qk_norm_rope.hip"

namespace ftlab {

using tvm::ffi::TensorView;
using namespace launch;

namespace {

// [N, heads, D] with contiguous heads and elements; any token stride.
void check_rows(const TensorView& t, const char* name, int64_t d) {
  TVM_FFI_CHECK(t.ndim() == 3 && t.size(2) == d && t.stride(2) == 1 && (t.size(1) <= 1 || t.stride(1) == d),
                ValueError)
      << name << " must be [N, heads, " << d << "] with contiguous heads";
}

// The KV cache a call also writes (kc null: none).
struct CacheArgs {
  void* kc = nullptr;
  int64_t kc_row = 0;
  void* vc = nullptr;
  int64_t vc_row = 0;
  const void* slots = nullptr;
  bool slots64 = false;
  int64_t num_slots = 0;
  const void* v = nullptr;
  int64_t v_row = 0;
  int vw = 0;
};

template <typename T>
void launch_rows(const TensorView& q, const TensorView& k, const TensorView& qw, const TensorView& kw,
                 const TensorView& cos, const TensorView& sin, const TensorView& qo, const TensorView& ko, float eps,
                 int rot, const CacheArgs& c) {
  using S = typename T::storage;
  const int tokens = static_cast<int>(q.size(0)), hq = static_cast<int>(q.size(1)), hk = static_cast<int>(k.size(1));
  const int d = static_cast<int>(q.size(2));
  const int64_t rows = static_cast<int64_t>(tokens) * (hq + hk + (c.kc != nullptr ? 1 : 0));
  const unsigned blocks = static_cast<unsigned>((rows + kNormRopeWaves - 1) / kNormRopeWaves);
  launch_pdl(qk_norm_rope_kernel<T, T>, dim3(blocks), dim3(kNormRopeWaves * PORT_WARP_SIZE), stream_of(q),
      static_cast<const S*>(base_of(q)), q.stride(0), static_cast<const S*>(base_of(k)), k.stride(0),
      static_cast<const S*>(base_of(qw)), static_cast<const S*>(base_of(kw)), static_cast<const S*>(base_of(cos)),
      static_cast<const S*>(base_of(sin)), static_cast<S*>(base_of(qo)), static_cast<S*>(base_of(ko)), eps, tokens,
      hq, hk, d, rot, static_cast<S*>(c.kc), c.kc_row, static_cast<S*>(c.vc), c.vc_row, c.slots, c.slots64,
      c.num_slots, static_cast<const S*>(c.v), c.v_row, c.vw);
  check_launch("qk_norm_rope_kernel");
}

void run(TensorView q, TensorView k, TensorView qw, TensorView kw, TensorView cos, TensorView sin, TensorView qo,
         TensorView ko, double eps, int64_t rotary_dim, const CacheArgs& c) {
  const int64_t d = q.ndim() == 3 ? q.size(2) : 0;
  TVM_FFI_CHECK(d > 0 && rotary_dim >= 2 && rotary_dim <= d && rotary_dim % 2 == 0, ValueError)
      << "q must be [N, heads, D] and rotary_dim even in [2, D]";
  check_rows(q, "q", d);
  check_rows(k, "k", d);
  check_rows(qo, "q_out", d);
  check_rows(ko, "k_out", d);
  TVM_FFI_CHECK(k.size(0) == q.size(0) && qo.size(0) == q.size(0) && ko.size(0) == q.size(0) &&
                    qo.size(1) == q.size(1) && ko.size(1) == k.size(1),
                ValueError)
      << "q, k and the outputs must agree in tokens and heads";
  for (const TensorView* t : {&qw, &kw}) {
    check_contiguous(*t, "weight");
    TVM_FFI_CHECK(t->numel() == d, ValueError) << "the norm weights must hold D = " << d << " elements";
  }
  for (const TensorView* t : {&cos, &sin}) {
    check_contiguous(*t, "cos / sin");
    TVM_FFI_CHECK(t->numel() == q.size(0) * rotary_dim, ValueError) << "cos and sin must be [N, rotary_dim]";
  }
  const Fp fp = fp_of(q, "q");
  for (const TensorView* t : {&k, &qw, &kw, &cos, &sin, &qo, &ko})
    TVM_FFI_CHECK(fp_of(*t, "operand") == fp, TypeError) << "every operand must have q's dtype";
  if (q.size(0) == 0) return;
  const int rot = static_cast<int>(rotary_dim);
  switch (fp) {
    case Fp::f32: launch_rows<f32_t>(q, k, qw, kw, cos, sin, qo, ko, static_cast<float>(eps), rot, c); break;
    case Fp::f16: launch_rows<f16_t>(q, k, qw, kw, cos, sin, qo, ko, static_cast<float>(eps), rot, c); break;
    case Fp::bf16: launch_rows<bf16_t>(q, k, qw, kw, cos, sin, qo, ko, static_cast<float>(eps), rot, c); break;
  }
}

// [rows, width] with contiguous rows, of q's dtype.
void check_cache_rows(const TensorView& t, const TensorView& q, const char* name) {
  TVM_FFI_CHECK(t.ndim() == 2 && (t.size(1) <= 1 || t.stride(1) == 1) && t.stride(0) >= t.size(1), ValueError)
      << name << " must be 2-D with contiguous rows";
  TVM_FFI_CHECK(fp_of(t, name) == fp_of(q, "q"), TypeError) << name << " must have q's dtype";
}

}  // namespace

// q [N, Hq, D], k [N, Hk, D] (token stride free), weights [D], cos / sin [N, R] (R = rotary_dim,
// even, in [2, D]), outputs contiguous [N, Hq, D] / [N, Hk, D]; all of q's dtype.
void qk_norm_rope(TensorView q, TensorView k, TensorView qw, TensorView kw, TensorView cos, TensorView sin,
                  TensorView qo, TensorView ko, double eps, int64_t rotary_dim) {
  run(q, k, qw, kw, cos, sin, qo, ko, eps, rotary_dim, CacheArgs{});
}

// The same, also writing the KV cache: k_cache [S, Hk * D] and v_cache [S, W] (contiguous rows),
// slots [N] int32 / int64, v [N, W] (contiguous rows): k_cache[slots[n]] = k_out[n],
// v_cache[slots[n]] = v[n]; a slot of -1 or outside [0, S) writes nothing.
void qk_norm_rope_cache(TensorView q, TensorView k, TensorView qw, TensorView kw, TensorView cos, TensorView sin,
                        TensorView qo, TensorView ko, double eps, int64_t rotary_dim, TensorView k_cache,
                        TensorView v_cache, TensorView slots, TensorView v) {
  check_cache_rows(k_cache, q, "k_cache");
  check_cache_rows(v_cache, q, "v_cache");
  check_cache_rows(v, q, "v");
  TVM_FFI_CHECK(k.ndim() == 3 && k_cache.size(1) == k.size(1) * k.size(2), ValueError)
      << "k_cache must be [S, Hk * D]";
  TVM_FFI_CHECK(v_cache.size(0) == k_cache.size(0) && v_cache.size(1) == v.size(1) && v.size(0) == q.size(0),
                ValueError)
      << "v_cache must be [S, W] like k_cache's S and v [N, W]";
  TVM_FFI_CHECK(slots.ndim() == 1 && slots.size(0) == q.size(0) && (slots.size(0) <= 1 || slots.stride(0) == 1),
                ValueError)
      << "slots must be a dense [N] vector";
  TVM_FFI_CHECK(slots.dtype().code == kDLInt && (slots.dtype().bits == 32 || slots.dtype().bits == 64), TypeError)
      << "slots must be int32 or int64";
  CacheArgs c;
  c.kc = base_of(k_cache);
  c.kc_row = k_cache.stride(0);
  c.vc = base_of(v_cache);
  c.vc_row = v_cache.stride(0);
  c.slots = base_of(slots);
  c.slots64 = slots.dtype().bits == 64;
  c.num_slots = k_cache.size(0);
  c.v = base_of(v);
  c.v_row = v.stride(0);
  c.vw = static_cast<int>(v.size(1));
  run(q, k, qw, kw, cos, sin, qo, ko, eps, rotary_dim, c);
}

}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(qk_norm_rope, ftlab::qk_norm_rope);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(qk_norm_rope_cache, ftlab::qk_norm_rope_cache);

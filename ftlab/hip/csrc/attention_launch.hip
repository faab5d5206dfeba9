// attention_launch.hip — host glue for attention.hip (tvm-ffi entries, torch's current stream).
// ftlab.ops checked the layouts; the checks here keep a direct caller in bounds.
#include <initializer_list>

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include "attention.hip"
#include "attention_tiles.hip"
#include "launch_common.h"

namespace ftlab {

using tvm::ffi::TensorView;
using namespace launch;

namespace {

struct AttnArgs {
  int64_t b, h, d, s, kvh;
  int chunk, splits;
  float scale;
};

// The one-launch kernel's optional Q8_1 of its output (all null: not written).
struct Q8Out {
  int8_t* q = nullptr;
  float* d = nullptr;
  float* s = nullptr;
};

template <typename T, bool VEC, bool D256>
void launch_partial(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lengths,
                    const TensorView& ml, const TensorView& acc, const TensorView& out, const AttnArgs& a) {
  using S = typename T::storage;
  const dim3 grid(a.splits, static_cast<unsigned>(a.kvh), static_cast<unsigned>(a.b));
  decode_attention_partial_kernel<T, VEC, D256><<<grid, kAttnThreads, 0, stream_of(out)>>>(
      static_cast<const S*>(base_of(q)), static_cast<const S*>(base_of(k)), static_cast<const S*>(base_of(v)),
      static_cast<const int32_t*>(base_of(lengths)), static_cast<float*>(base_of(ml)), static_cast<float*>(base_of(acc)),
      static_cast<S*>(base_of(out)), k.stride(0), k.stride(1), v.stride(0), v.stride(1), static_cast<int>(a.s),
      a.chunk, a.scale, static_cast<int>(a.h), static_cast<int>(a.kvh), static_cast<int>(a.d));
  check_launch("decode_attention_partial_kernel");
  if (a.splits > 1) {
    decode_attention_combine_kernel<T><<<dim3(static_cast<unsigned>(a.b), static_cast<unsigned>(a.h)), kAttnThreads,
                                         0, stream_of(out)>>>(
        static_cast<const float*>(base_of(ml)), static_cast<const float*>(base_of(acc)), static_cast<S*>(base_of(out)),
        static_cast<int>(a.h), static_cast<int>(a.kvh), static_cast<int>(a.d), a.splits);
    check_launch("decode_attention_combine_kernel");
  }
}

template <typename T>
void dispatch(bool vec, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lengths,
              const TensorView& ml, const TensorView& acc, const TensorView& out, const AttnArgs& a) {
  const bool d256 = a.d > kAttnThreads * AttnShape<false>::kDPer;
  if (vec && d256) launch_partial<T, true, true>(q, k, v, lengths, ml, acc, out, a);
  if (vec && !d256) launch_partial<T, true, false>(q, k, v, lengths, ml, acc, out, a);
  if (!vec && d256) launch_partial<T, false, true>(q, k, v, lengths, ml, acc, out, a);
  if (!vec && !d256) launch_partial<T, false, false>(q, k, v, lengths, ml, acc, out, a);
}

bool same_device(const TensorView& a, const TensorView& b) {
  return a.device().device_type == b.device().device_type && a.device().device_id == b.device().device_id;
}

// The launch's sizes as the kernels take them (int): positions, chunk and splits past INT_MAX refused.
void check_int_sizes(int64_t s, int64_t chunk, int64_t splits) {
  constexpr int64_t kMax = 2147483647;
  TVM_FFI_CHECK(s <= kMax && chunk <= kMax && splits <= kMax, ValueError)
      << "positions, chunk and splits must each be at most " << kMax << ", got " << s << ", " << chunk << ", "
      << splits;
}

// Every tensor on q's device; lengths, the workspaces (and counters) contiguous; the workspaces fp32.
void check_side_tensors(const TensorView& q, std::initializer_list<const TensorView*> all,
                        std::initializer_list<const TensorView*> dense, const TensorView& ml, const TensorView& acc) {
  for (const TensorView* t : all) TVM_FFI_CHECK(same_device(*t, q), ValueError) << "every tensor must be on q's device";
  for (const TensorView* t : dense) check_contiguous(*t, "lengths and the workspaces");
  TVM_FFI_CHECK(ml.dtype().code == kDLFloat && ml.dtype().bits == 32 && acc.dtype().code == kDLFloat &&
                    acc.dtype().bits == 32,
                TypeError)
      << "ml and acc must be float32";
}

bool aligned16(const TensorView& t, int64_t elem) {
  return reinterpret_cast<uintptr_t>(base_of(t)) % 16 == 0 && (t.stride(0) * elem) % 16 == 0 &&
         (t.stride(1) * elem) % 16 == 0;
}

}  // namespace

// q [B, H, D] contiguous; k, v [B, S, KVH, D] (heads contiguous, unit element stride; sequence
// and position strides free), q's dtype; lengths [B] int32; out [B, H, D] contiguous.
// ml [B, KVH, splits, G, 2] and acc [B, KVH, splits, G, D] fp32 workspaces when splits > 1
// (any size-1 tensors otherwise); each split holds `chunk` positions (splits * chunk >= S).
void decode_attention(TensorView q, TensorView k, TensorView v, TensorView lengths, TensorView ml, TensorView acc,
                      TensorView out, int64_t chunk, int64_t splits, double scale) {
  TVM_FFI_CHECK(q.ndim() == 3 && k.ndim() == 4 && v.ndim() == 4, ValueError) << "q must be [B, H, D], k and v [B, S, KVH, D]";
  check_int_sizes(k.size(1), chunk, splits);
  AttnArgs a{q.size(0), q.size(1), q.size(2), k.size(1), k.size(2), static_cast<int>(chunk),
             static_cast<int>(splits), static_cast<float>(scale)};
  check_contiguous(q, "q");
  check_contiguous(out, "out");
  check_side_tensors(q, {&k, &v, &lengths, &ml, &acc, &out}, {&lengths, &ml, &acc}, ml, acc);
  for (const TensorView* t : {&k, &v})
    TVM_FFI_CHECK(t->size(0) == a.b && t->size(1) == a.s && t->size(2) == a.kvh && t->size(3) == a.d &&
                      (a.d <= 1 || t->stride(3) == 1) && (a.kvh <= 1 || t->stride(2) == a.d),
                  ValueError)
        << "k and v must be [B, S, KVH, D] with contiguous heads";
  TVM_FFI_CHECK(a.kvh > 0 && a.h % a.kvh == 0 && a.h / a.kvh <= kAttnMaxG, ValueError)
      << "the query heads must be a multiple of the key heads, at most " << kAttnMaxG << " a key head";
  TVM_FFI_CHECK(a.d <= kAttnMaxD, ValueError) << "the head dim must be at most " << kAttnMaxD << ", got " << a.d;
  TVM_FFI_CHECK(out.ndim() == 3 && out.size(0) == a.b && out.size(1) == a.h && out.size(2) == a.d, ValueError)
      << "out must be [B, H, D]";
  TVM_FFI_CHECK(lengths.ndim() == 1 && lengths.size(0) == a.b && lengths.dtype().code == kDLInt &&
                    lengths.dtype().bits == 32,
                ValueError)
      << "lengths must be [B] int32";
  TVM_FFI_CHECK(chunk >= 1 && splits >= 1 && splits <= 65535 && chunk * splits >= a.s, ValueError)
      << "chunk * splits must cover the positions";
  const int64_t g = a.h / a.kvh;
  if (splits > 1)
    TVM_FFI_CHECK(ml.numel() >= a.b * a.kvh * splits * g * 2 && acc.numel() >= a.b * a.kvh * splits * g * a.d,
                  ValueError)
        << "ml and acc must hold the splits' partial results";
  const Fp fp = fp_of(q, "q");
  TVM_FFI_CHECK(fp_of(k, "k") == fp && fp_of(v, "v") == fp && fp_of(out, "out") == fp, TypeError)
      << "k, v and out must have q's dtype";
  if (a.b == 0) return;
  const int64_t elem = fp == Fp::f32 ? 4 : 2;
  const bool vec = a.d % 8 == 0 && aligned16(k, elem) && aligned16(v, elem) && (a.d * elem) % 16 == 0;
  switch (fp) {
    case Fp::f32: dispatch<f32_t>(vec, q, k, v, lengths, ml, acc, out, a); break;
    case Fp::f16: dispatch<f16_t>(vec, q, k, v, lengths, ml, acc, out, a); break;
    case Fp::bf16: dispatch<bf16_t>(vec, q, k, v, lengths, ml, acc, out, a); break;
  }
}

namespace {

template <typename T, int D, int TP>
void launch_tiles(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lengths,
                  const TensorView& ml, const TensorView& acc, const TensorView& counters, const TensorView& out,
                  const AttnArgs& a, int want, const Q8Out& q8) {
  using S = typename T::storage;
  const dim3 grid(static_cast<unsigned>(a.kvh), static_cast<unsigned>(a.b), a.splits);  // live splits first
  launch_pdl(decode_attention_tiles_kernel<T, D, TP>, grid, dim3(kTileThreads), stream_of(out),
             static_cast<const S*>(base_of(q)), static_cast<const S*>(base_of(k)), static_cast<const S*>(base_of(v)),
             static_cast<const int32_t*>(base_of(lengths)), static_cast<float*>(base_of(ml)),
             static_cast<float*>(base_of(acc)), static_cast<uint32_t*>(base_of(counters)), static_cast<S*>(base_of(out)),
             k.stride(0), k.stride(1), v.stride(0), v.stride(1), static_cast<int>(a.s), a.chunk, want, a.scale,
             static_cast<int>(a.h), static_cast<int>(a.kvh), q8.q, q8.d, q8.s);
  check_launch("decode_attention_tiles_kernel");
}

template <typename T>
void dispatch_tiles(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lengths,
                    const TensorView& ml, const TensorView& acc, const TensorView& counters, const TensorView& out,
                    const AttnArgs& a, int rows, int want, const Q8Out& q8) {
  if (a.d == 128 && rows == 4) launch_tiles<T, 128, tile_rows(128, 4)>(q, k, v, lengths, ml, acc, counters, out, a, want, q8);
  if (a.d == 256 && rows == 4) launch_tiles<T, 256, tile_rows(256, 4)>(q, k, v, lengths, ml, acc, counters, out, a, want, q8);
  if (a.d == 128 && rows == 2) launch_tiles<T, 128, tile_rows(128, 2)>(q, k, v, lengths, ml, acc, counters, out, a, want, q8);
  if (a.d == 256 && rows == 2) launch_tiles<T, 256, tile_rows(256, 2)>(q, k, v, lengths, ml, acc, counters, out, a, want, q8);
}

// out's Q8_1 (oq [B, H * D] int8, od / os [B, H * D / 32] fp32, contiguous, on q's device), or none.
Q8Out q8_out_of(const TensorView& q, const TensorView& oq, const TensorView& od, const TensorView& os) {
  const int64_t n = q.size(0) * q.size(1) * q.size(2);
  TVM_FFI_CHECK(oq.dtype().code == kDLInt && oq.dtype().bits == 8 && oq.numel() == n, TypeError)
      << "oq must be int8 with B * H * D = " << n << " elements, got " << oq.numel();
  for (const TensorView* t : {&od, &os})
    TVM_FFI_CHECK(t->dtype().code == kDLFloat && t->dtype().bits == 32 && t->numel() == n / kQK, TypeError)
        << "od and os must be float32 with B * H * D / 32 = " << n / kQK << " elements, got " << t->numel();
  for (const TensorView* t : {&oq, &od, &os}) {
    check_contiguous(*t, "oq, od and os");
    TVM_FFI_CHECK(same_device(*t, q), ValueError) << "oq, od and os must be on q's device";
  }
  return {static_cast<int8_t*>(base_of(oq)), static_cast<float*>(base_of(od)), static_cast<float*>(base_of(os))};
}

// decode_attention in one launch (attention_tiles.hip): q, k, v fp16 / bf16 with head dim 128 or
// 256, q contiguous and 16-byte aligned, k and v [B, S, KVH, D] with 16-byte aligned rows.
// `rows` (2 or 4) sets the tile, tile_rows(D, rows) positions (a thread holds a quarter of them:
// four row groups of 32 lanes); each split holds `chunk` positions, a multiple of
// tile_rows(D, rows) (splits * chunk >= S, splits <= kTileMaxSplits), or more whole tiles where a
// sequence's live positions would make more than `want` (>= 1) splits of `chunk`; ml [B, KVH,
// splits, G, 2] and acc [B, KVH, splits, G, D] fp32 workspaces;
// counters [B * KVH] uint32 zeros, left zeros.
void tiles(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lengths,
           const TensorView& ml, const TensorView& acc, const TensorView& counters, const TensorView& out,
           int64_t chunk, int64_t splits, int64_t want, int64_t rows, double scale, const Q8Out& q8) {
  TVM_FFI_CHECK(q.ndim() == 3 && k.ndim() == 4 && v.ndim() == 4 && out.ndim() == 3, ValueError)
      << "q and out must be [B, H, D], k and v [B, S, KVH, D]";
  check_int_sizes(k.size(1), chunk, splits);
  AttnArgs a{q.size(0), q.size(1), q.size(2), k.size(1), k.size(2), static_cast<int>(chunk),
             static_cast<int>(splits), static_cast<float>(scale)};
  check_contiguous(q, "q");
  check_contiguous(out, "out");
  check_side_tensors(q, {&k, &v, &lengths, &ml, &acc, &counters, &out}, {&lengths, &ml, &acc, &counters}, ml, acc);
  TVM_FFI_CHECK(a.d == 128 || a.d == 256, ValueError) << "the head dim must be 128 or 256, got " << a.d;
  for (const TensorView* t : {&k, &v})
    TVM_FFI_CHECK(t->size(0) == a.b && t->size(1) == a.s && t->size(2) == a.kvh && t->size(3) == a.d &&
                      t->stride(3) == 1 && (a.kvh <= 1 || t->stride(2) == a.d),
                  ValueError)
        << "k and v must be [B, S, KVH, D] with contiguous heads";
  TVM_FFI_CHECK(a.kvh > 0 && a.h % a.kvh == 0 && a.h / a.kvh <= kTileMaxG, ValueError)
      << "the query heads must be a multiple of the key heads, at most " << kTileMaxG << " a key head";
  TVM_FFI_CHECK(out.size(0) == a.b && out.size(1) == a.h && out.size(2) == a.d, ValueError) << "out must be [B, H, D]";
  TVM_FFI_CHECK(lengths.ndim() == 1 && lengths.size(0) == a.b && lengths.dtype().code == kDLInt &&
                    lengths.dtype().bits == 32,
                ValueError)
      << "lengths must be [B] int32";
  TVM_FFI_CHECK(rows == 2 || rows == 4, ValueError) << "rows (the tile: tile_rows(D, rows) positions) must be 2 or 4, got " << rows;
  const int tile = tile_rows(static_cast<int>(a.d), static_cast<int>(rows));
  TVM_FFI_CHECK(chunk >= 1 && chunk % tile == 0 && splits >= 1 && splits <= kTileMaxSplits && chunk * splits >= a.s,
                ValueError)
      << "chunk must be a multiple of " << tile << " and chunk * splits (splits <= "
      << kTileMaxSplits << ") must cover the positions";
  TVM_FFI_CHECK(want >= 1 && want <= kTileMaxSplits, ValueError)
      << "want (the most live splits a sequence) must be 1 to " << kTileMaxSplits << ", got " << want;
  const int64_t g = a.h / a.kvh;
  if (splits > 1)
    TVM_FFI_CHECK(ml.numel() >= a.b * a.kvh * splits * g * 2 && acc.numel() >= a.b * a.kvh * splits * g * a.d,
                  ValueError)
        << "ml and acc must hold the splits' partial results";
  TVM_FFI_CHECK(counters.numel() >= a.b * a.kvh && counters.dtype().code == kDLInt && counters.dtype().bits == 32,
                ValueError)
      << "counters must be [B * KVH] int32";
  const Fp fp = fp_of(q, "q");
  TVM_FFI_CHECK(fp != Fp::f32 && fp_of(k, "k") == fp && fp_of(v, "v") == fp && fp_of(out, "out") == fp, TypeError)
      << "q, k, v and out must be one 16-bit dtype";
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(base_of(q)) % 16 == 0 && aligned16(k, 2) && aligned16(v, 2), ValueError)
      << "q, k and v must be 16-byte aligned (bases and strides)";
  if (a.b == 0) return;
  const int w = static_cast<int>(want), r = static_cast<int>(rows);
  if (fp == Fp::f16) dispatch_tiles<f16_t>(q, k, v, lengths, ml, acc, counters, out, a, r, w, q8);
  else dispatch_tiles<bf16_t>(q, k, v, lengths, ml, acc, counters, out, a, r, w, q8);
}

}  // namespace

void decode_attention_tiles(TensorView q, TensorView k, TensorView v, TensorView lengths, TensorView ml,
                            TensorView acc, TensorView counters, TensorView out, int64_t chunk, int64_t splits,
                            int64_t want, int64_t rows, double scale) {
  tiles(q, k, v, lengths, ml, acc, counters, out, chunk, splits, want, rows, scale, Q8Out{});
}

// The same, also writing out's Q8_1 (out viewed [B, H * D]): oq [B, H * D] int8, od and os
// [B, H * D / 32] fp32, contiguous; the arithmetic of quantize_q8_1 on the rounded output.
void decode_attention_tiles_q8(TensorView q, TensorView k, TensorView v, TensorView lengths, TensorView ml,
                               TensorView acc, TensorView counters, TensorView out, TensorView oq, TensorView od,
                               TensorView os, int64_t chunk, int64_t splits, int64_t want, int64_t rows,
                               double scale) {
  TVM_FFI_CHECK(q.ndim() == 3, ValueError) << "q must be [B, H, D]";
  tiles(q, k, v, lengths, ml, acc, counters, out, chunk, splits, want, rows, scale, q8_out_of(q, oq, od, os));
}

}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(decode_attention, ftlab::decode_attention);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(decode_attention_tiles, ftlab::decode_attention_tiles);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(decode_attention_tiles_q8, ftlab::decode_attention_tiles_q8);

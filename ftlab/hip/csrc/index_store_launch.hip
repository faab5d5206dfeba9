// index_store_launch.hip — host glue for index_store.hip: tvm-ffi entry points that take
// torch tensors (via DLPack), pick the copy width and launch on torch's current stream.
//
// ftlab.ops validates arguments (dtypes, shapes, devices, index ranges) before it calls
// in here; the checks below only keep a direct caller from corrupting memory.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include "index_store.hip"
#include "launch_common.h"

namespace ftlab {

using tvm::ffi::TensorView;

namespace {

char* base_of(const TensorView& t) {
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}

int64_t elem_bytes(const TensorView& t) { return (t.dtype().bits * t.dtype().lanes + 7) / 8; }

void check_rows(const TensorView& t, const char* name) {
  TVM_FFI_CHECK(t.ndim() == 2, ValueError) << name << " must be 2-D, got " << t.ndim() << "-D";
  TVM_FFI_CHECK(t.size(1) <= 1 || t.stride(1) == 1, ValueError)
      << name << " must have contiguous rows (stride(1) == 1), got stride(1) = " << t.stride(1);
}

// Widest of 16/8/4/2/1 bytes dividing every quantity (row sizes, row strides, addresses).
int vec_width(std::initializer_list<uint64_t> quantities) {
  for (int w : {16, 8, 4, 2}) {
    bool ok = true;
    for (uint64_t q : quantities) ok = ok && (q % w == 0);
    if (ok) return w;
  }
  return 1;
}

struct CopyShape {
  dim3 grid, block;
  bool one_vector;  // small, and blockDim.x covers a row: one vector per thread, no loop
};

// blockDim.x threads per row (power of two), blockDim.y rows per block.
// Large copies: kCopyUnroll vectors per thread in 256-thread blocks, for bytes in flight.
// Small ones (under 1 MiB, a decode step): one vector per thread and, for wide rows, one row
// per block, so the few rows spread over as many SMs as possible.
CopyShape copy_shape(int64_t rows, int64_t row_vecs) {
  const bool small = rows * row_vecs < (int64_t{1} << 16);
  const int per_thread = small ? 1 : kCopyUnroll;
  int tpr = 1;
  while (tpr * per_thread < row_vecs && tpr < kCopyThreads) tpr <<= 1;
  const int rpb = small && tpr >= 64 ? 1 : kCopyThreads / tpr;
  return {dim3(static_cast<unsigned>((rows + rpb - 1) / rpb)), dim3(tpr, rpb), small && row_vecs <= tpr};
}

port_stream_t stream_of(const TensorView& t) {
  return static_cast<port_stream_t>(TVMFFIEnvGetStream(t.device().device_type, t.device().device_id));
}

void check_launch(const char* what) {
  port_error_t err = port_get_last_error();
  TVM_FFI_CHECK(err == port_success, RuntimeError) << what << " launch failed: " << port_error_string(err);
}

template <typename Vec, typename Idx>
void launch_index(const TensorView& weights, const TensorView& indices, const TensorView& out,
                  int64_t mask_start, int64_t mask_len, int64_t eb) {
  const int64_t L = indices.size(0);
  const int64_t row_vecs = weights.size(1) * eb / static_cast<int64_t>(sizeof(Vec));
  const CopyShape s = copy_shape(L, row_vecs);
  if (s.one_vector) {
    index_rows_small_kernel<Vec, Idx><<<s.grid, s.block, 0, stream_of(out)>>>(
        reinterpret_cast<const Vec*>(base_of(weights)), weights.stride(0) * eb / sizeof(Vec),
        reinterpret_cast<const Idx*>(base_of(indices)), reinterpret_cast<Vec*>(base_of(out)),
        out.stride(0) * eb / sizeof(Vec), static_cast<int>(L), static_cast<int>(row_vecs),
        weights.size(0), mask_start, mask_len);
    check_launch("index_rows_small_kernel");
    return;
  }
  index_rows_kernel<Vec, Idx><<<s.grid, s.block, 0, stream_of(out)>>>(
      reinterpret_cast<const Vec*>(base_of(weights)), weights.stride(0) * eb / sizeof(Vec),
      reinterpret_cast<const Idx*>(base_of(indices)), reinterpret_cast<Vec*>(base_of(out)),
      out.stride(0) * eb / sizeof(Vec), L, row_vecs, weights.size(0), mask_start, mask_len);
  check_launch("index_rows_kernel");
}

template <typename Vec, typename Idx>
void launch_store(const TensorView& k_cache, const TensorView& v_cache, const TensorView& indices,
                  const TensorView& k, const TensorView& v, int64_t eb) {
  const int64_t L = indices.size(0);
  const int64_t k_vecs = k.size(1) * eb / static_cast<int64_t>(sizeof(Vec));
  const int64_t v_vecs = v.size(1) * eb / static_cast<int64_t>(sizeof(Vec));
  const CopyShape s = copy_shape(L, k_vecs > v_vecs ? k_vecs : v_vecs);
  const int64_t w = sizeof(Vec);
  launch::launch_pdl(store_rows_kernel<Vec, Idx>, s.grid, s.block, stream_of(k_cache),
      reinterpret_cast<Vec*>(base_of(k_cache)), k_cache.stride(0) * eb / w,
      reinterpret_cast<Vec*>(base_of(v_cache)), v_cache.stride(0) * eb / w,
      reinterpret_cast<const Idx*>(base_of(indices)), reinterpret_cast<const Vec*>(base_of(k)),
      k.stride(0) * eb / w, reinterpret_cast<const Vec*>(base_of(v)), v.stride(0) * eb / w, L,
      k_vecs, v_vecs, k_cache.size(0));
  check_launch("store_rows_kernel");
}

bool index_is_int64(const TensorView& indices) {
  const bool i64 = indices.dtype().bits == 64;
  TVM_FFI_CHECK(indices.dtype().code == kDLInt && (i64 || indices.dtype().bits == 32), TypeError)
      << "indices must be int32 or int64";
  return i64;
}

// LAUNCH<Vec, Idx>(args...) for the runtime copy width and index dtype.
#define FTLAB_DISPATCH_COPY(width, i64, LAUNCH, ...)                                   \
  switch (width) {                                                                     \
    case 16:                                                                           \
      i64 ? LAUNCH<bytes16, int64_t>(__VA_ARGS__) : LAUNCH<bytes16, int32_t>(__VA_ARGS__); \
      break;                                                                           \
    case 8:                                                                            \
      i64 ? LAUNCH<bytes8, int64_t>(__VA_ARGS__) : LAUNCH<bytes8, int32_t>(__VA_ARGS__); \
      break;                                                                           \
    case 4:                                                                            \
      i64 ? LAUNCH<bytes4, int64_t>(__VA_ARGS__) : LAUNCH<bytes4, int32_t>(__VA_ARGS__); \
      break;                                                                           \
    case 2:                                                                            \
      i64 ? LAUNCH<bytes2, int64_t>(__VA_ARGS__) : LAUNCH<bytes2, int32_t>(__VA_ARGS__); \
      break;                                                                           \
    default:                                                                           \
      i64 ? LAUNCH<bytes1, int64_t>(__VA_ARGS__) : LAUNCH<bytes1, int32_t>(__VA_ARGS__); \
  }

}  // namespace

void index_rows(TensorView weights, TensorView indices, TensorView out, int64_t mask_start,
                int64_t mask_len) {
  check_rows(weights, "weights");
  check_rows(out, "out");
  TVM_FFI_CHECK(indices.ndim() == 1 && out.size(0) == indices.size(0), ValueError)
      << "out must have one row per index";
  TVM_FFI_CHECK(out.size(1) == weights.size(1), ValueError) << "out and weights row sizes differ";
  TVM_FFI_CHECK(mask_len <= weights.size(0), ValueError) << "mask length exceeds weights rows";
  const int64_t eb = elem_bytes(weights);
  TVM_FFI_CHECK(elem_bytes(out) == eb, TypeError) << "out and weights dtypes differ";
  const int64_t L = indices.size(0);
  if (L == 0 || weights.size(1) == 0) return;
  const int width = vec_width({static_cast<uint64_t>(weights.size(1) * eb),
                               static_cast<uint64_t>(weights.stride(0) * eb),
                               static_cast<uint64_t>(out.stride(0) * eb),
                               reinterpret_cast<uint64_t>(base_of(weights)),
                               reinterpret_cast<uint64_t>(base_of(out))});
  FTLAB_DISPATCH_COPY(width, index_is_int64(indices), launch_index, weights, indices, out,
                      mask_start, mask_len, eb);
}

void store_rows(TensorView k_cache, TensorView v_cache, TensorView indices, TensorView k,
                TensorView v) {
  check_rows(k_cache, "k_cache");
  check_rows(v_cache, "v_cache");
  check_rows(k, "k");
  check_rows(v, "v");
  TVM_FFI_CHECK(indices.ndim() == 1 && k.size(0) == indices.size(0) && v.size(0) == indices.size(0),
                ValueError)
      << "k and v must have one row per index";
  TVM_FFI_CHECK(k.size(1) == k_cache.size(1) && v.size(1) == v_cache.size(1), ValueError)
      << "row sizes of k/v and their caches differ";
  TVM_FFI_CHECK(k_cache.size(0) == v_cache.size(0), ValueError) << "caches have different slot counts";
  const int64_t eb = elem_bytes(k_cache);
  TVM_FFI_CHECK(elem_bytes(v_cache) == eb && elem_bytes(k) == eb && elem_bytes(v) == eb, TypeError)
      << "k, v and the caches must share one dtype";
  if (indices.size(0) == 0) return;
  const int width = vec_width({static_cast<uint64_t>(k.size(1) * eb),
                               static_cast<uint64_t>(v.size(1) * eb),
                               static_cast<uint64_t>(k_cache.stride(0) * eb),
                               static_cast<uint64_t>(v_cache.stride(0) * eb),
                               static_cast<uint64_t>(k.stride(0) * eb),
                               static_cast<uint64_t>(v.stride(0) * eb),
                               reinterpret_cast<uint64_t>(base_of(k_cache)),
                               reinterpret_cast<uint64_t>(base_of(v_cache)),
                               reinterpret_cast<uint64_t>(base_of(k)),
                               reinterpret_cast<uint64_t>(base_of(v))});
  FTLAB_DISPATCH_COPY(width, index_is_int64(indices), launch_store, k_cache, v_cache, indices, k,
                      v, eb);
}

}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(index_rows, ftlab::index_rows);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(store_rows, ftlab::store_rows);

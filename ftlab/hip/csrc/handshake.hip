// handshake.hip — device side of the hybrid MoE handshakes (docs/OPS.md section 4).
//
// One decode step of a hybrid layer, in stream order (handshake_launch.hip issues it):
//   pack     one block: seq := seq + 1 (a device counter, one per channel); the router ids are
//            split through the live `expert -> slot | -1` table into GPU slot ids (a device
//            tensor, -1 where the CPU or nobody takes the route) and CPU expert ids, and the
//            CPU's inputs are staged as one int32 word array:
//              [seq, tokens, top_k, hidden | cpu ids (P) | weights (P, fp32 bits) | x (T*H fp32) | seq]
//   D2H copy of the staging words into pinned host memory, then the handshake's signal:
//   signal   (stream memory operations) the new seq into the mapped `ready` word, after a
//            system fence, so a CPU thread polling it sees the counter, never a boolean;
//   ...      the GPU experts on the resident slots; the handshake's wait; H2D copy of the CPU's
//            output words [seq, status, 0, 0 | y (T*H fp32) | seq] back to the device;
//   combine  checks that the CPU answered this step (both seq words == seq, status 0, and for
//            stream memory operations the counter in the `done` word) and writes
//            y = y_gpu + y_cpu in x's dtype (y_cpu rounded to it first, as the eager path adds);
//            on any mismatch it writes NaN everywhere and records the step in the mapped error
//            words, which the host turns into an exception: never a result from stale memory.
#pragma once
#include "q4_0_common.h"

namespace ftlab {

constexpr int kHandshakeThreads = 256;
constexpr int kInHeader = 4;   // seq, tokens, top_k, hidden
constexpr int kOutHeader = 4;  // seq, status, 0, 0
constexpr uint32_t kDoneBit = 0x80000000u;

__device__ __forceinline__ void port_fence_system() {
#if defined(PORT_BARE_CLANG)
  __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "");
#else
  __threadfence_system();
#endif
}

template <typename T>
__global__ void __launch_bounds__(kHandshakeThreads)
    hs_pack_kernel(const typename T::storage* __restrict__ x, const int32_t* __restrict__ ids,
                   const float* __restrict__ w, const int32_t* __restrict__ table, int experts, int tokens,
                   int top_k, int hidden, int32_t* __restrict__ seq, int32_t* __restrict__ gpu_ids,
                   int32_t* __restrict__ staging) {
  const int s = seq[0] + 1;  // every thread reads the old value before thread 0 writes
  __syncthreads();
  const int pairs = tokens * top_k;
  int32_t* cpu_ids = staging + kInHeader;
  float* wf = reinterpret_cast<float*>(staging + kInHeader + pairs);
  float* xf = reinterpret_cast<float*>(staging + kInHeader + 2 * pairs);
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = ids[p];
    const int slot = (e >= 0 && e < experts) ? table[e] : -1;
    gpu_ids[p] = slot;
    cpu_ids[p] = (e >= 0 && e < experts && slot < 0) ? e : -1;
    wf[p] = w[p];
  }
  for (int i = threadIdx.x; i < tokens * hidden; i += blockDim.x) xf[i] = T::load(x + i);
  if (threadIdx.x == 0) {
    seq[0] = s;
    staging[0] = s;
    staging[1] = tokens;
    staging[2] = top_k;
    staging[3] = hidden;
    staging[kInHeader + 2 * pairs + tokens * hidden] = s;
  }
}

// The stream-memory-operations signal: the step counter into the mapped `ready` word.
__global__ void hs_signal_kernel(const int32_t* __restrict__ seq, volatile int32_t* ready) {
  if (threadIdx.x == 0) {
    port_fence_system();
    *ready = seq[0];
    port_fence_system();
  }
}

// On a mismatch errors[1] := the step and errors[0] := what failed (nonzero; bit 0: output words
// of another step, bit 1: a CPU status, bit 2: a done word of another step).
template <typename T>
__global__ void __launch_bounds__(kHandshakeThreads)
    hs_combine_kernel(const typename T::storage* __restrict__ y_gpu, const int32_t* __restrict__ out,
                      const int32_t* __restrict__ seq, const volatile uint32_t* done,
                      const volatile int32_t* unchecked, volatile int32_t* errors,
                      int tokens, int hidden, typename T::storage* __restrict__ y) {
  // the host-mapped words are read once a block (a PCIe round trip each), then shared
  __shared__ int bad_shared;
  const int s = seq[0];
  const int n = tokens * hidden;
  if (threadIdx.x == 0) {
    int bad = 0;
    if (out[0] != s || out[kOutHeader + n] != s) bad |= 1;
    if (out[1] != 0) bad |= 2;
    if (done != nullptr && *done != (kDoneBit | (static_cast<uint32_t>(s) & ~kDoneBit))) bad |= 4;
    if (*unchecked) bad = 0;  // a deliberately broken handshake (fault 2): no check
    bad_shared = bad;
  }
  __syncthreads();
  const int bad = bad_shared;
  const float* yc = reinterpret_cast<const float*>(out + kOutHeader);
  const int i0 = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
  if (bad) {
    for (int i = i0; i < n; i += stride) y[i] = T::from_float(port_bits_to_float(0x7fc00000u));
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      errors[1] = s;
      errors[0] = bad;
      port_fence_system();
    }
    return;
  }
  for (int i = i0; i < n; i += stride) {
    const typename T::storage c = T::from_float(yc[i]);
    y[i] = T::from_float(port_add_rn(T::load(y_gpu + i), T::load(&c)));
  }
}

#define FTLAB_HANDSHAKE_INSTANTIATE(T)                                                                       \
  template __global__ void hs_pack_kernel<T>(const T::storage*, const int32_t*, const float*, const int32_t*, int, \
                                             int, int, int, int32_t*, int32_t*, int32_t*);                       \
  template __global__ void hs_combine_kernel<T>(const T::storage*, const int32_t*, const int32_t*,              \
                                                const volatile uint32_t*, const volatile int32_t*,              \
                                                volatile int32_t*, int, int, T::storage*);
FTLAB_HANDSHAKE_INSTANTIATE(f32_t)
FTLAB_HANDSHAKE_INSTANTIATE(f16_t)
FTLAB_HANDSHAKE_INSTANTIATE(bf16_t)

}  // namespace ftlab

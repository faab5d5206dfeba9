// Host stand-ins for the device helpers quant_matmul.hip uses, so its unit structs and kernels
// compile with a host C++20 compiler and run on the CPU: one std::thread per GPU thread of a
// block (blocks run one after another), __syncthreads a barrier, __shared__ arrays function
// statics, port_shfl_xor an exchange through a per-block array between two barriers. A thread
// that returns leaves the barrier (arrive_and_drop), as a finished GPU thread stops counting.
#pragma once
#include <barrier>
#include <cstdint>
#include <cstring>
#define __device__
#define __forceinline__ inline
#define __global__
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static
struct HostIdx {
  int x, y;
};
inline thread_local HostIdx threadIdx, blockIdx;
inline HostIdx gridDim;
inline thread_local int host_lane_base;  // 32 * threadIdx.y: the lanes of one group
inline std::barrier<>* host_barrier;
inline float host_lanes[1024];
inline void __syncthreads() { host_barrier->arrive_and_wait(); }
inline void port_sync_group() { host_barrier->arrive_and_wait(); }  // every group of a block calls it alike
typedef uint32_t bytes16 __attribute__((vector_size(16)));
inline void words_of(const bytes16& v, uint32_t out[4]) {
  for (int i = 0; i < 4; ++i) out[i] = v[i];
}
inline float port_shfl_xor(float v, int lane_mask) {
  const int me = host_lane_base + threadIdx.x;
  host_lanes[me] = v;
  host_barrier->arrive_and_wait();
  const float other = host_lanes[host_lane_base + (threadIdx.x ^ lane_mask)];
  host_barrier->arrive_and_wait();
  return other;
}
inline int port_dp4a(int a, int b, int c) {
  const int8_t* pa = reinterpret_cast<const int8_t*>(&a);
  const int8_t* pb = reinterpret_cast<const int8_t*>(&b);
  return c + pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2] + pa[3] * pb[3];
}
inline float port_half_to_float(uint16_t h) {
  _Float16 f;
  std::memcpy(&f, &h, 2);
  return static_cast<float>(f);
}

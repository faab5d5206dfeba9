// Host stand-ins for the device helpers deltanet.hip uses, so its kernels compile with a host
// C++20 compiler and run on the CPU: one std::thread per GPU thread of a block (blocks run one
// after another), __syncthreads a barrier, __shared__ variables function statics. A thread that
// returns leaves the barrier (arrive_and_drop), as a finished GPU thread stops counting.
#pragma once
#include <barrier>
#include <cassert>
#include <cmath>
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
inline std::barrier<>* host_barrier;
inline void __syncthreads() { host_barrier->arrive_and_wait(); }
inline float port_sqrtf(float x) { return std::sqrt(x); }
// A lane exchange through a block-wide table: every thread of the block takes part in each call,
// as the kernels call it (uniformly).
inline float port_shfl_xor(float v, int lane_mask) {
  assert(lane_mask > 0 && lane_mask < 32);  // a device exchange stays within 32 lanes
  static float table[1024];
  table[threadIdx.x] = v;
  __syncthreads();
  const float got = table[threadIdx.x ^ lane_mask];
  __syncthreads();
  return got;
}
inline void load4f(const float* p, float out[4]) { std::memcpy(out, p, 16); }
inline void store4f(float* p, const float in[4]) { std::memcpy(p, in, 16); }
inline float port_expf(float x) { return std::exp(x); }
inline float port_logf(float x) { return std::log(x); }
struct f32_t {
  using storage = float;
  static float load(const storage* p) { return *p; }
  static storage from_float(float f) { return f; }
};
struct f16_t {
  using storage = uint16_t;
  static float load(const storage* p) {
    _Float16 h;
    std::memcpy(&h, p, 2);
    return static_cast<float>(h);
  }
  static storage from_float(float f) {
    const _Float16 h = static_cast<_Float16>(f);
    storage s;
    std::memcpy(&s, &h, 2);
    return s;
  }
};
struct bf16_t {
  using storage = uint16_t;
  static float load(const storage* p) {
    const uint32_t u = static_cast<uint32_t>(*p) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static storage from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<storage>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

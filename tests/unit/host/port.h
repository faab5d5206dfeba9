// Host stand-in for ftlab/hip/csrc/port.h, so that the real device sources (q4_0_common.h and
// what includes it: the K-quant matvecs and experts, the gated delta rule, the norms) compile with
// a host C++20 compiler and run on the CPU: one std::thread per GPU thread of a block (HostPool
// below; blocks run one after another), __syncthreads a block barrier, port_shfl_xor an exchange
// through a table between two barriers of the thread's group (PORT_WARP_SIZE lanes),
// port_sync_group that group's barrier, __shared__ variables function statics. A thread that
// returns leaves its barriers (arrive_and_drop), as a finished GPU thread stops counting. PORT_CUDA
// is defined for the 16-byte types' CUDA spelling (uint4, float4).
#pragma once
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
#define PORT_CUDA 1
#define PORT_HAS_L2_PREFETCH 0
// A harness may build a kernel's wave64 (gfx9) layout with -DPORT_WARP_SIZE=64: the groups,
// their exchanges and barriers, are then 64 threads wide.
#ifndef PORT_WARP_SIZE
#define PORT_WARP_SIZE 32
#endif
#define __host__
#define __device__
#define __forceinline__ inline
#define __global__
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static
struct HostIdx {
  int x, y, z;
};
// Internal linkage (static): each harness library keeps its own, where inline variables would be
// bound once per process (GNU unique symbols) across the libraries the tests load side by side.
static thread_local HostIdx threadIdx, blockIdx;
static thread_local int host_tid;  // the thread's linear index in its block (x fastest)
static HostIdx gridDim;
static std::barrier<>* host_block_barrier;
static thread_local std::barrier<>* host_group_barrier;
// A stress mode (a harness sets it): threads below this index of their block sleep 2 ms after every
// block barrier, so that the others run ahead of them -- a reader of LDS that the barrier was to
// protect from the next writes then reads too late, where an ordinary run hardly ever does.
static int host_late_below = 0;
inline void __syncthreads() {
  host_block_barrier->arrive_and_wait();
  if (host_tid < host_late_below) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}
inline void port_sync_group() { host_group_barrier->arrive_and_wait(); }
// Dynamic shared memory: a function static of 227 KiB (the most any target grants: an H100's), one
// per kernel instantiation, shared by the block's threads like the other __shared__ variables.
#define PORT_DYNAMIC_LDS(T, name) alignas(16) static T name[227 * 1024 / sizeof(T)]
struct bytes16 {
  uint32_t x, y, z, w;
};
struct bytes8 {
  uint32_t x, y;
};
typedef uint32_t bytes4;
typedef uint16_t bytes2;
struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
template <typename V>
static V port_shfl_xor(V v, int lane_mask) {
  static V table[1024];
  table[host_tid] = v;
  host_group_barrier->arrive_and_wait();
  const V other = table[host_tid ^ lane_mask];
  host_group_barrier->arrive_and_wait();
  return other;
}
inline int port_dp4a(int a, int b, int c) {
  const int8_t* pa = reinterpret_cast<const int8_t*>(&a);
  const int8_t* pb = reinterpret_cast<const int8_t*>(&b);
  return c + pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2] + pa[3] * pb[3];
}
inline float port_expf(float x) { return std::exp(x); }
inline float port_logf(float x) { return std::log(x); }
inline float port_sqrtf(float x) { return std::sqrt(x); }
inline float port_div_rn(float a, float b) { return a / b; }
inline float port_bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t port_float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float port_half_to_float(uint16_t h) {
  _Float16 f;
  std::memcpy(&f, &h, 2);
  return static_cast<float>(f);
}
inline uint16_t port_float_to_half(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
inline float port_bf16_to_float(uint16_t b) { return port_bits_to_float(static_cast<uint32_t>(b) << 16); }
inline uint16_t port_float_to_bf16(float f) {  // round to nearest even (no NaN inputs here)
  const uint32_t u = port_float_to_bits(f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// Blocks run one after another here: what a block wrote is seen by the blocks after it.
inline void port_fence_device() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline uint32_t port_atomic_add(uint32_t* p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void port_pdl_wait() {}
inline void port_pdl_trigger() {}
inline void port_prefetch_l2(const void*) {}
// Asynchronous copies at their latest: a copy lands only at the port_copy_wait that retires its
// commit group (cp.async may land any time before), so a kernel that reads a slot before its wait,
// waits for too few groups, or skips the barrier after the wait reads stale bytes here.
#define PORT_HAS_ASYNC_COPY 1
struct HostCopy {
  void* dst;
  const void* src;
};
static thread_local std::vector<HostCopy> host_open_copies;
static thread_local std::deque<std::vector<HostCopy>> host_copy_groups;
inline void port_copy16_async(void* dst, const void* src) { host_open_copies.push_back({dst, src}); }
inline void port_copy_commit() {
  host_copy_groups.push_back(std::move(host_open_copies));
  host_open_copies.clear();
}
template <int N>
inline void port_copy_wait() {
  while (static_cast<int>(host_copy_groups.size()) > N) {
    for (const HostCopy& c : host_copy_groups.front()) std::memcpy(c.dst, c.src, 16);
    host_copy_groups.pop_front();
  }
}

// `threads` host threads that run the blocks handed to them one after another, thread t as GPU
// thread (t % width, t / width): per block fresh barriers (the block's and each wave-sized
// group's), released by `start`, joined by `done`.
struct HostPool {
  int threads, width;
  std::barrier<> start, done;
  std::function<void()> kernel;
  int bx = 0, by = 0;
  bool quit = false;
  std::barrier<>* block = nullptr;
  std::vector<std::barrier<>*> groups;
  std::vector<std::thread> pool;
  explicit HostPool(int n, int w = 0) : threads(n), width(w > 0 ? w : n), start(n + 1), done(n + 1), groups((n + PORT_WARP_SIZE - 1) / PORT_WARP_SIZE) {
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([this, t] {
        for (;;) {
          start.arrive_and_wait();
          if (quit) return;
          blockIdx = {bx, by, 0};
          threadIdx = {t % width, t / width, 0};
          host_tid = t;
          host_block_barrier = block;
          host_group_barrier = groups[t / PORT_WARP_SIZE];
          kernel();
          host_group_barrier->arrive_and_drop();
          host_block_barrier->arrive_and_drop();
          done.arrive_and_wait();
        }
      });
  }
  template <typename F>
  void run(int x, int y, F f) {
    std::barrier<> b(threads);
    std::vector<std::unique_ptr<std::barrier<>>> gs;
    for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
      gs.push_back(std::make_unique<std::barrier<>>(std::min(PORT_WARP_SIZE, threads - PORT_WARP_SIZE * g)));
      groups[g] = gs.back().get();
    }
    block = &b;
    bx = x;
    by = y;
    kernel = f;
    start.arrive_and_wait();
    done.arrive_and_wait();
  }
  ~HostPool() {
    quit = true;
    start.arrive_and_wait();
    for (auto& th : pool) th.join();
  }
};

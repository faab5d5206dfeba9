// port.h — the one portability header of ftlab's HIP kernels.
//
// Three branches, picked by the compiler that reads this file:
//   1. HIP with ROCm headers (hipcc / amdclang++): the real HIP runtime.
//   2. CUDA (nvcc): the few HIP names ftlab uses, mapped onto CUDA.
//   3. bare clang (`clang -x hip -nogpuinc -nogpulib`): no runtime headers at all; just
//      enough declarations to compile device code for gfx targets in the compile check.
//
// Kernels use only the portable names below (PORT_WARP_SIZE, port_shfl_xor, port_dp4a,
// port_stream_t, ...), never warpSize: ROCm 7 made warpSize non-constexpr, so the wave
// size is derived from the arch macros instead (gfx9 = CDNA = wave64; RDNA and NVIDIA 32).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__) && !defined(__HIP__)
// ---------------------------------------------------------------- 2. CUDA (nvcc)
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define PORT_CUDA 1
#define PORT_WARP_SIZE 32
typedef cudaStream_t port_stream_t;
typedef cudaError_t port_error_t;
#define port_success cudaSuccess
#define port_get_last_error cudaGetLastError
#define port_error_string cudaGetErrorString
#define port_get_device cudaGetDevice
inline void port_sm_count(int* count, int device) {
  cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
}
template <typename K>
inline void port_occupancy(int* blocks_per_sm, K kernel, int threads) {
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, threads, 0);
}
// Lets kernel take up to bytes of dynamic shared memory (above 48 KB needs it) on the current device.
template <typename K>
inline port_error_t port_max_dynamic_lds(K kernel, int bytes) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
__device__ __forceinline__ int port_shfl_xor(int v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
// Host runtime of the hybrid handshakes (handshake_launch.hip): host-function nodes, mapped
// pinned memory, and the stream memory operations, which CUDA has in the driver API only; they
// are resolved from libcuda at run time (the v2 entry points, on by default since CUDA 11.7),
// so nothing links against the driver.
typedef cudaHostFn_t port_host_fn_t;
#define port_launch_host_func cudaLaunchHostFunc
#define port_memcpy_async cudaMemcpyAsync
#define port_memcpy_d2h cudaMemcpyDeviceToHost
#define port_memcpy_h2d cudaMemcpyHostToDevice
#define port_malloc cudaMalloc
#define port_free cudaFree
#define port_memset cudaMemset
#define port_host_free cudaFreeHost
#define port_set_device cudaSetDevice
inline port_error_t port_host_alloc_mapped(void** p, size_t n) {
  return cudaHostAlloc(p, n, cudaHostAllocMapped | cudaHostAllocPortable);
}
inline port_error_t port_host_device_pointer(void** dev, void* host) { return cudaHostGetDevicePointer(dev, host, 0); }
#include <dlfcn.h>
typedef int (*port_cu_stream_value32_fn)(cudaStream_t, unsigned long long, uint32_t, unsigned int);
inline port_cu_stream_value32_fn port_cu_entry(const char* name) {
  static void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return lib ? reinterpret_cast<port_cu_stream_value32_fn>(dlsym(lib, name)) : nullptr;
}
// 0 on success; -1 when the driver lacks the entry point; else the CUresult.
inline int port_stream_write_value32(port_stream_t s, void* dev_addr, uint32_t v) {
  static port_cu_stream_value32_fn fn = port_cu_entry("cuStreamWriteValue32_v2");
  return fn ? fn(s, reinterpret_cast<unsigned long long>(dev_addr), v, 0 /* CU_STREAM_WRITE_VALUE_DEFAULT */) : -1;
}
// Waits until (*dev_addr & mask) != 0.
inline int port_stream_wait_value32_and(port_stream_t s, void* dev_addr, uint32_t mask) {
  static port_cu_stream_value32_fn fn = port_cu_entry("cuStreamWaitValue32_v2");
  return fn ? fn(s, reinterpret_cast<unsigned long long>(dev_addr), mask, 0x2 /* CU_STREAM_WAIT_VALUE_AND */) : -1;
}
__device__ __forceinline__ float port_shfl_xor(float v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

#elif defined(__HIP__) && (defined(__has_include) && __has_include(<hip/hip_runtime.h>)) && \
    !defined(PORT_BARE_CLANG)
// ---------------------------------------------------------------- 1. HIP (ROCm headers)
#include <hip/hip_runtime.h>
#define PORT_HIP 1
typedef hipStream_t port_stream_t;
typedef hipError_t port_error_t;
#define port_success hipSuccess
#define port_get_last_error hipGetLastError
#define port_error_string hipGetErrorString
#define port_get_device hipGetDevice
inline void port_sm_count(int* count, int device) {
  hipDeviceGetAttribute(count, hipDeviceAttributeMultiprocessorCount, device);
}
template <typename K>
inline void port_occupancy(int* blocks_per_sm, K kernel, int threads) {
  hipOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, threads, 0);
}
template <typename K>
inline port_error_t port_max_dynamic_lds(K kernel, int bytes) {
  return hipFuncSetAttribute(reinterpret_cast<const void*>(kernel), hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
__device__ __forceinline__ int port_shfl_xor(int v, int lane_mask) { return __shfl_xor(v, lane_mask); }
// Host runtime of the hybrid handshakes (handshake_launch.hip).
typedef hipHostFn_t port_host_fn_t;
#define port_launch_host_func hipLaunchHostFunc
#define port_memcpy_async hipMemcpyAsync
#define port_memcpy_d2h hipMemcpyDeviceToHost
#define port_memcpy_h2d hipMemcpyHostToDevice
#define port_malloc hipMalloc
#define port_free hipFree
#define port_memset hipMemset
#define port_host_free hipHostFree
#define port_set_device hipSetDevice
inline port_error_t port_host_alloc_mapped(void** p, size_t n) {
  return hipHostMalloc(p, n, hipHostMallocMapped | hipHostMallocPortable);
}
inline port_error_t port_host_device_pointer(void** dev, void* host) { return hipHostGetDevicePointer(dev, host, 0); }
inline int port_stream_write_value32(port_stream_t s, void* dev_addr, uint32_t v) {
  return static_cast<int>(hipStreamWriteValue32(s, dev_addr, v, 0));
}
inline int port_stream_wait_value32_and(port_stream_t s, void* dev_addr, uint32_t mask) {
  return static_cast<int>(hipStreamWaitValue32(s, dev_addr, mask, hipStreamWaitValueAnd, 0xffffffffu));
}
__device__ __forceinline__ float port_shfl_xor(float v, int lane_mask) {
  return __shfl_xor(v, lane_mask);
}

#elif defined(__HIP__)
// ---------------------------------------------------------------- 3. bare clang, device only
#define PORT_HIP 1
#define PORT_BARE_CLANG 1
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...) __attribute__((amdgpu_flat_work_group_size(1, __VA_ARGS__)))
struct port_dim3 {
  uint32_t x, y, z;
};
// The builtins behind threadIdx/blockIdx/blockDim, as ROCm's headers define them.
struct port_thread_idx {
  __device__ uint32_t get_x() const { return __builtin_amdgcn_workitem_id_x(); }
  __device__ uint32_t get_y() const { return __builtin_amdgcn_workitem_id_y(); }
  __device__ uint32_t get_z() const { return __builtin_amdgcn_workitem_id_z(); }
  __declspec(property(get = get_x)) uint32_t x;
  __declspec(property(get = get_y)) uint32_t y;
  __declspec(property(get = get_z)) uint32_t z;
};
struct port_block_idx {
  __device__ uint32_t get_x() const { return __builtin_amdgcn_workgroup_id_x(); }
  __device__ uint32_t get_y() const { return __builtin_amdgcn_workgroup_id_y(); }
  __device__ uint32_t get_z() const { return __builtin_amdgcn_workgroup_id_z(); }
  __declspec(property(get = get_x)) uint32_t x;
  __declspec(property(get = get_y)) uint32_t y;
  __declspec(property(get = get_z)) uint32_t z;
};
struct port_block_dim {
  __device__ uint32_t get_x() const { return __builtin_amdgcn_workgroup_size_x(); }
  __device__ uint32_t get_y() const { return __builtin_amdgcn_workgroup_size_y(); }
  __device__ uint32_t get_z() const { return __builtin_amdgcn_workgroup_size_z(); }
  __declspec(property(get = get_x)) uint32_t x;
  __declspec(property(get = get_y)) uint32_t y;
  __declspec(property(get = get_z)) uint32_t z;
};
// gridDim in workgroups: the dispatch's grid size in work-items over the workgroup size
struct port_grid_dim {
  __device__ uint32_t get_x() const {
    return __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x();
  }
  __device__ uint32_t get_y() const {
    return __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y();
  }
  __device__ uint32_t get_z() const {
    return __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z();
  }
  __declspec(property(get = get_x)) uint32_t x;
  __declspec(property(get = get_y)) uint32_t y;
  __declspec(property(get = get_z)) uint32_t z;
};
static constexpr __device__ port_grid_dim gridDim{};
static constexpr __device__ port_thread_idx threadIdx{};
static constexpr __device__ port_block_idx blockIdx{};
static constexpr __device__ port_block_dim blockDim{};
__device__ inline void __syncthreads() { __builtin_amdgcn_s_barrier(); }
__device__ __forceinline__ int port_shfl_xor(int v, int lane_mask) {
  const int lane = __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
  return __builtin_amdgcn_ds_bpermute((lane ^ lane_mask) << 2, v);
}
__device__ __forceinline__ float port_shfl_xor(float v, int lane_mask) {
  return __builtin_bit_cast(float, port_shfl_xor(__builtin_bit_cast(int, v), lane_mask));
}
#else
#error "port.h: compile with nvcc, hipcc, or clang -x hip"
#endif

// ---------------------------------------------------------------- dynamic LDS
// The block's dynamic shared memory (the launch's third argument) as a 16-byte aligned array of T
// named name; on NVIDIA more than 48 KB needs port_max_dynamic_lds first.
#define PORT_DYNAMIC_LDS(T, name) extern __shared__ __attribute__((aligned(16))) T name[]

// ---------------------------------------------------------------- exp
#if defined(PORT_BARE_CLANG)
__device__ __forceinline__ float port_expf(float x) { return __builtin_expf(x); }
__device__ __forceinline__ float port_logf(float x) { return __builtin_logf(x); }
__device__ __forceinline__ float port_sqrtf(float x) { return __builtin_sqrtf(x); }
#else
__device__ __forceinline__ float port_expf(float x) { return expf(x); }
__device__ __forceinline__ float port_logf(float x) { return logf(x); }
__device__ __forceinline__ float port_sqrtf(float x) { return sqrtf(x); }
#endif

// ---------------------------------------------------------------- scalar helpers
// Exact float arithmetic where results must match the PyTorch reference bit for bit.
// nvcc and clang contract a * b + c into an FMA by default; the *_rn helpers never do.
#if defined(PORT_CUDA)
__device__ __forceinline__ float port_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float port_add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float port_div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float port_bits_to_float(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint32_t port_float_to_bits(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float port_half_to_float(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ uint16_t port_float_to_half(float f) {
  return __half_as_ushort(__float2half_rn(f));
}
#else
__device__ __forceinline__ float port_mul_rn(float a, float b) {
#pragma clang fp contract(off)
  return a * b;
}
__device__ __forceinline__ float port_add_rn(float a, float b) {
#pragma clang fp contract(off)
  return a + b;
}
// HIP-clang divides fp32 correctly rounded unless told otherwise.
__device__ __forceinline__ float port_div_rn(float a, float b) { return a / b; }
__device__ __forceinline__ float port_bits_to_float(uint32_t u) { return __builtin_bit_cast(float, u); }
__device__ __forceinline__ uint32_t port_float_to_bits(float f) {
  return __builtin_bit_cast(uint32_t, f);
}
__device__ __forceinline__ float port_half_to_float(uint16_t h) {
  return static_cast<float>(__builtin_bit_cast(_Float16, h));
}
__device__ __forceinline__ uint16_t port_float_to_half(float f) {
  return __builtin_bit_cast(uint16_t, static_cast<_Float16>(f));
}
#endif
__device__ __forceinline__ float port_bf16_to_float(uint16_t b) {
  return port_bits_to_float(static_cast<uint32_t>(b) << 16);
}
// fp32 -> bf16, round to nearest even (NaN stays NaN), as torch converts.
__device__ __forceinline__ uint16_t port_float_to_bf16(float f) {
  const uint32_t u = port_float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Wave size from the arch macros (device pass); the host pass sees 32 and must not use it
// for anything but sizing that is valid for both.
#if !defined(PORT_WARP_SIZE)
#if defined(__GFX9__)
#define PORT_WARP_SIZE 64
#else
#define PORT_WARP_SIZE 32
#endif
#endif

// int8 dot of four packed bytes plus an accumulator: dp4a (NVIDIA), sudot4 (RDNA3/4,
// v_dot4_i32_iu8), sdot4 (CDNA, v_dot4c_i32_i8), else a scalar fallback.
__device__ __forceinline__ int port_dp4a(int a, int b, int c) {
#if defined(PORT_CUDA)
  return __dp4a(a, b, c);
#elif defined(__has_builtin) && __has_builtin(__builtin_amdgcn_sudot4) && \
    (defined(__GFX11__) || defined(__GFX12__))
  return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#elif defined(__has_builtin) && __has_builtin(__builtin_amdgcn_sdot4) && defined(__GFX9__)
  return __builtin_amdgcn_sdot4(a, b, c, false);
#else
  const int8_t* pa = reinterpret_cast<const int8_t*>(&a);
  const int8_t* pb = reinterpret_cast<const int8_t*>(&b);
  return c + pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2] + pa[3] * pb[3];
#endif
}

// Orders LDS traffic among the 32 threads of one warp-sized group (threads 32g..32g+31 of a
// block): a warp on NVIDIA and RDNA, half a wave on CDNA, which runs in lockstep anyway.
__device__ __forceinline__ void port_sync_group() {
#if defined(PORT_CUDA)
  __syncwarp();
#else
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
#endif
}

// Device-wide ordering and a counter for "the last block to finish does the rest": a fence
// that orders this thread's global writes before its later ones for every block of the grid
// (__threadfence), and a relaxed atomic add on a global uint32 returning the old value.
__device__ __forceinline__ void port_fence_device() {
#if defined(PORT_CUDA)
  __threadfence();
#else
  __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent");
#endif
}
__device__ __forceinline__ uint32_t port_atomic_add(uint32_t* p, uint32_t v) {
#if defined(PORT_CUDA)
  return atomicAdd(p, v);
#else
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#endif
}

// A load of what other blocks wrote, after port_fence_device(): from the L2 (CUDA's L1 is not
// coherent); on AMD the agent-scope fence invalidated the L1, so a plain load reads what is new.
__device__ __forceinline__ float port_load_l2(const float* p) {
#if defined(PORT_CUDA)
  return __ldcg(p);
#else
  return *p;
#endif
}

// Asks the L2 for the cache line holding p, without a register or a wait (a load that lands
// later finds it there). PORT_HAS_L2_PREFETCH says whether the target has the hint; without
// it this is a no-op and kernels keep their own register prefetch.
#if defined(PORT_CUDA)
#define PORT_HAS_L2_PREFETCH 1
#else
#define PORT_HAS_L2_PREFETCH 0
#endif
__device__ __forceinline__ void port_prefetch_l2(const void* p) {
#if defined(PORT_CUDA)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// Programmatic dependent launch (CUDA, sm_90 and later): a kernel that the host launches with
// launch::launch_pdl may start while the kernel before it on the stream still runs. It must call
// port_pdl_wait() in every thread before any load or store of global memory: before the wait it
// may only ask the L2 for lines (port_prefetch_l2: a hint, which cannot return data, so nothing
// read can be stale whatever the kernel before wrote), e.g. its weights. port_pdl_trigger() lets
// the next kernel start: called right after the wait, the next kernel's prefetches overlap this
// one. No-ops elsewhere: AMD and older NVIDIA GPUs launch such kernels in stream order.
__device__ __forceinline__ void port_pdl_wait() {
#if defined(PORT_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void port_pdl_trigger() {
#if defined(PORT_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Raw byte vectors for copies: a row is moved in the widest of these that its size,
// strides and addresses allow, so a copy never depends on the element type.
// Register vector types rather than structs holding arrays: arrays inside structs can keep
// LLVM from splitting a Vec[] into registers, and it then lands in scratch.
namespace ftlab {
#if defined(PORT_CUDA)
typedef uint4 bytes16;
typedef uint2 bytes8;
#else
typedef uint32_t bytes16 __attribute__((ext_vector_type(4)));
typedef uint32_t bytes8 __attribute__((ext_vector_type(2)));
#endif
typedef uint32_t bytes4;
typedef uint16_t bytes2;
typedef uint8_t bytes1;
}  // namespace ftlab

// Copies of 16 bytes from global memory into LDS that need no register while in flight: on
// sm_80 and later cp.async (the copy lands later; port_copy_commit() closes a group of copies,
// port_copy_wait<N>() returns once at most N of this thread's groups are still in flight).
// Elsewhere a plain copy through registers, done when it returns (commit and wait are no-ops),
// so a kernel written for the first is correct on every target, only without the overlap.
// Other threads see a copy after the wait and a barrier (port_sync_group, __syncthreads).
// dst and src 16-byte aligned.
#if defined(PORT_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PORT_HAS_ASYNC_COPY 1
#else
#define PORT_HAS_ASYNC_COPY 0
#endif
namespace ftlab {
__device__ __forceinline__ void port_copy16_async(void* dst, const void* src) {
#if PORT_HAS_ASYNC_COPY
  const unsigned lds = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(lds), "l"(src) : "memory");
#else
  *static_cast<bytes16*>(dst) = *static_cast<const bytes16*>(src);
#endif
}
__device__ __forceinline__ void port_copy_commit() {
#if PORT_HAS_ASYNC_COPY
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void port_copy_wait() {
#if PORT_HAS_ASYNC_COPY
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
}  // namespace ftlab

// Runs the HIP kernels that compute an RMSNorm on the CPU with the host port.h of tests/unit/host
// beside the real device headers: gated_rmsnorm_kernel, qk_norm_rope_kernel, add_rmsnorm_kernel,
// and the two kernels that repeat add_rmsnorm's bits -- the fused Q4_0 matvec's norm prologue and
// moe_norm_router_topk_kernel -- launched as their launchers launch them. T: 0 fp32, 1 bf16.
#include "port.h"
#include "gated_norm.hip"
#include "moe_route.hip"
#include "norm.hip"
#include "q4_0_matvec.hip"
#include "qk_norm_rope.hip"

using namespace ftlab;

template <typename T>
void gated(const void* x, int64_t x_row, const void* z, int64_t z_row, const float* w, void* y, float eps, int n,
           int h, int d) {
  typedef typename T::storage S;
  const int64_t rows = static_cast<int64_t>(n) * h;
  HostPool pool(kGatedNormWaves * PORT_WARP_SIZE);
  for (int bx = 0; bx < (rows + kGatedNormWaves - 1) / kGatedNormWaves; ++bx)
    pool.run(bx, 0, [=] {
      gated_rmsnorm_kernel<T, T>(static_cast<const S*>(x), x_row, static_cast<const S*>(z), z_row, w,
                                 static_cast<S*>(y), eps, n, h, d);
    });
}

extern "C" void run_gated(int t, const void* x, int64_t x_row, const void* z, int64_t z_row, const float* w, void* y,
                          float eps, int n, int h, int d) {
  if (t == 0) gated<f32_t>(x, x_row, z, z_row, w, y, eps, n, h, d);
  else gated<bf16_t>(x, x_row, z, z_row, w, y, eps, n, h, d);
}

template <typename T>
void qk(const void* q, const void* k, const void* qw, const void* kw, const void* cos, const void* sin, void* qo,
        void* ko, float eps, int n, int hq, int hk, int d, int rot) {
  typedef typename T::storage S;
  const int64_t rows = static_cast<int64_t>(n) * (hq + hk);
  HostPool pool(kNormRopeWaves * PORT_WARP_SIZE);
  for (int bx = 0; bx < (rows + kNormRopeWaves - 1) / kNormRopeWaves; ++bx)
    pool.run(bx, 0, [=] {
      qk_norm_rope_kernel<T, T>(static_cast<const S*>(q), int64_t{hq} * d, static_cast<const S*>(k), int64_t{hk} * d,
                                static_cast<const S*>(qw), static_cast<const S*>(kw), static_cast<const S*>(cos),
                                static_cast<const S*>(sin), static_cast<S*>(qo), static_cast<S*>(ko), eps, n, hq, hk,
                                d, rot, nullptr, 0, nullptr, 0, nullptr, false, 0, nullptr, 0, 0);
    });
}

extern "C" void run_qk(int t, const void* q, const void* k, const void* qw, const void* kw, const void* cos,
                       const void* sin, void* qo, void* ko, float eps, int n, int hq, int hk, int d, int rot) {
  if (t == 0) qk<f32_t>(q, k, qw, kw, cos, sin, qo, ko, eps, n, hq, hk, d, rot);
  else qk<bf16_t>(q, k, qw, kw, cos, sin, qo, ko, eps, n, hq, hk, d, rot);
}

// res null: none; vec: the 16-byte pieces (V = 16 / element bytes), else V = 1.
template <typename T, int V>
void add(const void* x, const void* res, const void* w, void* s, void* y, float eps, int n, int h) {
  typedef typename T::storage S;
  HostPool pool(kNormThreads);
  for (int bx = 0; bx < n; ++bx)
    pool.run(bx, 0, [=] {
      add_rmsnorm_kernel<T, T, V>(static_cast<const S*>(x), h, static_cast<const S*>(res), h,
                                  static_cast<const S*>(w), static_cast<S*>(s), static_cast<S*>(y), eps, h);
    });
}

extern "C" void run_add(int t, int vec, const void* x, const void* res, const void* w, void* s, void* y, float eps,
                        int n, int h) {
  if (t == 0 && vec) add<f32_t, 4>(x, res, w, s, y, eps, n, h);
  else if (t == 0) add<f32_t, 1>(x, res, w, s, y, eps, n, h);
  else if (vec) add<bf16_t, 8>(x, res, w, s, y, eps, n, h);
  else add<bf16_t, 1>(x, res, w, s, y, eps, n, h);
}

// The fused Q4_0 matvec's norm form, bf16, one row x [K] (res null: none), w [N, K] Q4_0 blocks: out [N],
// s_out and y_out [K] (block 0's), one block.
extern "C" void run_q4_0_norm(const void* x, const void* res, const void* norm_w, void* s_out, void* y_out, float eps,
                              const uint8_t* w, int64_t row_bytes, void* out, int64_t n, int64_t k) {
  typedef bf16_t::storage S;
  const int supers = static_cast<int>(k / kQK / kSuperBlocks);
  int g_lanes = 1;
  while (g_lanes < kGroup && g_lanes < supers) g_lanes *= 2;
  gridDim = {1, 1, 1};
  HostPool pool(kGroup * kFusedGroups, kGroup);
  pool.run(0, 0, [=] {
    q4_0_mv_fused_kernel<bf16_t, 1, kFusedNorm>(static_cast<const S*>(x), k, nullptr, nullptr, nullptr, w, row_bytes,
                                                 static_cast<S*>(out), n, k, g_lanes, static_cast<const S*>(res), k,
                                                 static_cast<const S*>(norm_w), static_cast<S*>(s_out),
                                                 static_cast<S*>(y_out), eps);
  });
}

// add_rmsnorm then the router, bf16: x, res [T, H], w [E, H], counters [T] zeroed; s, y [T, H], logits [T, E],
// weights and ids [T, top_k].
extern "C" void run_norm_router(const void* x, const void* res, const void* norm_w, void* s, void* y, float eps,
                                const void* w, void* logits, float* wts, int32_t* ids, uint32_t* counters, int t,
                                int h, int e, int top_k) {
  typedef bf16_t::storage S;
  const int blocks = (e + kRouterRows - 1) / kRouterRows;
  gridDim = {blocks, t, 1};
  HostPool pool(kMoeThreads);
  for (int by = 0; by < t; ++by)
    for (int bx = 0; bx < blocks; ++bx)
      pool.run(bx, by, [=] {
        moe_norm_router_topk_kernel<bf16_t, 8, 4>(static_cast<const S*>(x), h, static_cast<const S*>(res), h,
                                                  static_cast<const S*>(norm_w), static_cast<S*>(s),
                                                  static_cast<S*>(y), eps, static_cast<const S*>(w), h, h,
                                                  static_cast<S*>(logits), wts, ids, counters, e, top_k, 1, true);
      });
}

// Runs moe_kquant.hip's vec decode kernels (moe_gate_up_kq_vec_kernel, moe_down_kq_vec_kernel) and
// quant_matmul_mv1.hip's one-row matvecs (quant_mv1_fused_kernel, quant_mv1_staged_kernel) on
// the CPU with the host port.h beside them (its HostPool: 256 std::threads run each block, blocks in turn); the two
// launches chained as moe_kquant_launch.hip chains them.
#include "port.h"
#include "moe_kquant.hip"
#include "quant_matmul_mv1.hip"

using namespace ftlab;
using namespace ftlab::qmm;

template <typename T, typename QG, typename QD>
void run(const void* x, const uint8_t* gu, int64_t gs, int64_t gr, const uint8_t* dn, int64_t ds, int64_t dr,
         const int32_t* ids, const float* wts, int8_t* hq, float* hd, float* hs, void* y, int experts, int hidden,
         int inter, int tokens, int k) {
  const auto* xp = static_cast<const typename T::storage*>(x);
  auto* yp = static_cast<typename T::storage*>(y);
  HostPool pool(kMoeThreads);
  gridDim = {tokens * k, inter / kQK, 1};
  for (int p = 0; p < tokens * k; ++p)
    for (int by = 0; by < inter / kQK; ++by)
      pool.run(p, by, [=] {
        moe_gate_up_kq_vec_kernel<T, QG>(xp, hidden, gu, gs, gr, ids, hq, hd, hs, experts, hidden, inter, k);
      });
  gridDim = {tokens, (hidden + kDownRows - 1) / kDownRows, 1};
  for (int t = 0; t < tokens; ++t)
    for (int by = 0; by < (hidden + kDownRows - 1) / kDownRows; ++by)
      pool.run(t, by, [=] {
        moe_down_kq_vec_kernel<T, QD>(hq, hd, hs, dn, ds, dr, ids, wts, yp, hidden, experts, hidden, inter, k);
      });
}

template <typename T, typename QG>
void by_down(int dn_code, const void* x, const uint8_t* gu, int64_t gs, int64_t gr, const uint8_t* dn, int64_t ds,
             int64_t dr, const int32_t* ids, const float* wts, int8_t* hq, float* hd, float* hs, void* y, int experts,
             int hidden, int inter, int tokens, int k) {
  switch (dn_code) {
    case 1: run<T, QG, QK4<false>>(x, gu, gs, gr, dn, ds, dr, ids, wts, hq, hd, hs, y, experts, hidden, inter, tokens, k); break;
    case 2: run<T, QG, QK4<true>>(x, gu, gs, gr, dn, ds, dr, ids, wts, hq, hd, hs, y, experts, hidden, inter, tokens, k); break;
    default: run<T, QG, Q6_K>(x, gu, gs, gr, dn, ds, dr, ids, wts, hq, hd, hs, y, experts, hidden, inter, tokens, k); break;
  }
}

template <typename T>
void by_gate(int gu_code, int dn_code, const void* x, const uint8_t* gu, int64_t gs, int64_t gr, const uint8_t* dn,
             int64_t ds, int64_t dr, const int32_t* ids, const float* wts, int8_t* hq, float* hd, float* hs, void* y,
             int experts, int hidden, int inter, int tokens, int k) {
  switch (gu_code) {
    case 1: by_down<T, QK4<false>>(dn_code, x, gu, gs, gr, dn, ds, dr, ids, wts, hq, hd, hs, y, experts, hidden, inter, tokens, k); break;
    case 2: by_down<T, QK4<true>>(dn_code, x, gu, gs, gr, dn, ds, dr, ids, wts, hq, hd, hs, y, experts, hidden, inter, tokens, k); break;
    default: by_down<T, Q6_K>(dn_code, x, gu, gs, gr, dn, ds, dr, ids, wts, hq, hd, hs, y, experts, hidden, inter, tokens, k); break;
  }
}

// fp: 0 fp32, 1 fp16, 2 bf16 (x and y); codes: 1 Q4_K, 2 Q5_K, 3 Q6_K; banks packed [E, rows, bytes].
extern "C" void run_vec(int fp, int gu_code, int dn_code, const void* x, const uint8_t* gu, int64_t gs, int64_t gr,
                        const uint8_t* dn, int64_t ds, int64_t dr, const int32_t* ids, const float* wts, int8_t* hq,
                        float* hd, float* hs, void* y, int experts, int hidden, int inter, int tokens, int k) {
  switch (fp) {
    case 0: by_gate<f32_t>(gu_code, dn_code, x, gu, gs, gr, dn, ds, dr, ids, wts, hq, hd, hs, y, experts, hidden, inter, tokens, k); break;
    case 1: by_gate<f16_t>(gu_code, dn_code, x, gu, gs, gr, dn, ds, dr, ids, wts, hq, hd, hs, y, experts, hidden, inter, tokens, k); break;
    default: by_gate<bf16_t>(gu_code, dn_code, x, gu, gs, gr, dn, ds, dr, ids, wts, hq, hd, hs, y, experts, hidden, inter, tokens, k); break;
  }
}

template <typename T, typename Q>
void fused(const void* x, const int8_t* q8, const float* d8, const float* s8, const uint8_t* w, int64_t row_bytes,
           void* y, int64_t n, int k, int grid, int variant) {
  HostPool pool(kMoeThreads);
  gridDim = {grid, 1, 1};
  const auto* xp = static_cast<const typename T::storage*>(x);
  auto* yp = static_cast<typename T::storage*>(y);
  for (int b = 0; b < grid; ++b)
    pool.run(b, 0, [=] {
      if (variant == 1)
        quant_mv1_staged_kernel<T, Q>(xp, w, row_bytes, yp, n, k);
      else if (variant == 2)
        quant_mv1_sliced_kernel<T, Q, false>(xp, nullptr, nullptr, nullptr, w, row_bytes, yp, n, k);
      else if (variant == 3)
        quant_mv1_sliced_kernel<T, Q, true>(nullptr, q8, d8, s8, w, row_bytes, yp, n, k);
      else
        quant_mv1_fused_kernel<T, Q>(xp, w, row_bytes, yp, n, k);
    });
}

template <typename T>
void fused_by_code(int code, const void* x, const int8_t* q8, const float* d8, const float* s8, const uint8_t* w,
                   int64_t row_bytes, void* y, int64_t n, int k, int grid, int variant) {
  switch (code) {
    case 1: fused<T, QK4<false>>(x, q8, d8, s8, w, row_bytes, y, n, k, grid, variant); break;
    case 2: fused<T, QK4<true>>(x, q8, d8, s8, w, row_bytes, y, n, k, grid, variant); break;
    case 3: fused<T, Q6_K>(x, q8, d8, s8, w, row_bytes, y, n, k, grid, variant); break;
    case 4: fused<T, Q4_0x8>(x, q8, d8, s8, w, row_bytes, y, n, k, grid, variant); break;
    default: fused<T, Q8_0x8>(x, q8, d8, s8, w, row_bytes, y, n, k, grid, variant); break;
  }
}

// quant_mv1_fused_kernel (variant 1: quant_mv1_staged_kernel, 2: quant_mv1_sliced_kernel, 3: the sliced
// kernel given x's Q8_1 q8 / d8 / s8) on a grid of `grid` blocks (few: each group walks several rows),
// threads below `late` of each block late after every block barrier (the host port.h's stress mode).
// Returns 0, or -1 for a staged Q8_0 (code 5), which the device build does not instantiate.
extern "C" int run_fused(int fp, int code, const void* x, const int8_t* q8, const float* d8, const float* s8,
                         const uint8_t* w, int64_t row_bytes, void* y, int64_t n, int k, int grid, int variant,
                         int late) {
  if (code == 5 && variant == 1) return -1;
  host_late_below = late;
  switch (fp) {
    case 0: fused_by_code<f32_t>(code, x, q8, d8, s8, w, row_bytes, y, n, k, grid, variant); break;
    case 1: fused_by_code<f16_t>(code, x, q8, d8, s8, w, row_bytes, y, n, k, grid, variant); break;
    default: fused_by_code<bf16_t>(code, x, q8, d8, s8, w, row_bytes, y, n, k, grid, variant); break;
  }
  host_late_below = 0;
  return 0;
}

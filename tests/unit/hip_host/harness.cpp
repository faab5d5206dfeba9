// Runs quant_matmul.hip's and quant_matmul_tiled.hip's kernels on the CPU with the host port.h of
// tests/unit/host beside the real device headers (its HostPool: one std::thread per GPU thread of
// a block, blocks in turn).
#include <algorithm>

#include "port.h"
#include "quant_matmul.hip"
#include "quant_matmul_tiled.hip"

using namespace ftlab::qmm;

// M = 1: quant_mv1_kernel's persistent grid, at most 3 blocks here, so that groups walk several rows.
template <typename Q, int M>
void mv(const uint8_t* w, int64_t rb, const int8_t* q8, const float* d8, const float* s8, float* y, int64_t n,
        int64_t k, int variant) {
  const int64_t blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  const int grid = static_cast<int>(M == 1 ? std::min<int64_t>(blocks, 3) : blocks);
  gridDim = {grid, 1, 1};
  HostPool pool(kGroup * kRowsPerBlock, kGroup);
  for (int bx = 0; bx < grid; ++bx)
    pool.run(bx, 0, [=] {
      if (M == 1 && variant == kMv1Vec && Q::kVec)
        quant_mv1_kernel<Q, kMv1Vec>(w, rb, q8, d8, s8, y, n, k);
      else if (M == 1)
        quant_mv1_kernel<Q, kMv1Lanes>(w, rb, q8, d8, s8, y, n, k);
      else
        quant_mv_kernel<Q, M>(w, rb, q8, d8, s8, y, n, k);
    });
}

template <typename Q>
void gemm(const uint8_t* w, int64_t rb, const int8_t* q8, const float* d8, const float* s8, float* y, int64_t m,
          int64_t n, int64_t k) {
  HostPool pool(kGemmThreads);
  for (int by = 0; by < (m + kTileM - 1) / kTileM; ++by)
    for (int bx = 0; bx < (n + kTileN - 1) / kTileN; ++bx)
      pool.run(bx, by, [=] { quant_gemm_kernel<Q>(w, rb, q8, d8, s8, y, m, n, k); });
}

template <typename Q>
void run_type(const uint8_t* w, int64_t rb, const int8_t* q8, const float* d8, const float* s8, float* y, int64_t m,
              int64_t n, int64_t k, int variant) {
  switch (m) {
    case 1: mv<Q, 1>(w, rb, q8, d8, s8, y, n, k, variant); break;
    case 3: mv<Q, 3>(w, rb, q8, d8, s8, y, n, k, variant); break;
    case 8: mv<Q, 8>(w, rb, q8, d8, s8, y, n, k, variant); break;
    default: gemm<Q>(w, rb, q8, d8, s8, y, m, n, k);
  }
}

// qtype: 0 Q8_0, 1 Q4_K, 2 Q5_K, 3 Q6_K; m 1, 3 or 8 runs the matvec, any other m the GEMM;
// variant: quant_mv1_kernel's (m = 1): kMv1Lanes or kMv1Vec.
extern "C" void run(int qtype, const uint8_t* w, int64_t rb, const int8_t* q8, const float* d8, const float* s8,
                    float* y, int64_t m, int64_t n, int64_t k, int variant) {
  switch (qtype) {
    case 0: run_type<Q8_0>(w, rb, q8, d8, s8, y, m, n, k, variant); break;
    case 1: run_type<QK4<false>>(w, rb, q8, d8, s8, y, m, n, k, variant); break;
    case 2: run_type<QK4<true>>(w, rb, q8, d8, s8, y, m, n, k, variant); break;
    case 3: run_type<Q6_K>(w, rb, q8, d8, s8, y, m, n, k, variant); break;
  }
}

template <typename Q, int M>
void tiled(const uint8_t* w, int64_t rb, const int8_t* q8, const float* d8, const float* s8, float* y, int64_t n,
           int64_t k, int g, int splits, int grid) {
  gridDim = {grid, 1, 1};
  HostPool pool(ftlab::qmt::kGroup * ftlab::qmt::kGroups, ftlab::qmt::kGroup);
  for (int bx = 0; bx < grid; ++bx)
    pool.run(bx, 0, [=] { ftlab::qmt::quant_mv_tiled_kernel<Q, M>(w, rb, q8, d8, s8, y, n, k, g, splits); });
}

template <typename Q>
void tiled_type(const uint8_t* w, int64_t rb, const int8_t* q8, const float* d8, const float* s8, float* y, int64_t m,
                int64_t n, int64_t k, int g, int splits, int grid) {
  switch (m) {
    case 1: tiled<Q, 1>(w, rb, q8, d8, s8, y, n, k, g, splits, grid); break;
    case 2: tiled<Q, 2>(w, rb, q8, d8, s8, y, n, k, g, splits, grid); break;
    case 3: tiled<Q, 3>(w, rb, q8, d8, s8, y, n, k, g, splits, grid); break;
    case 4: tiled<Q, 4>(w, rb, q8, d8, s8, y, n, k, g, splits, grid); break;
    case 5: tiled<Q, 5>(w, rb, q8, d8, s8, y, n, k, g, splits, grid); break;
    case 6: tiled<Q, 6>(w, rb, q8, d8, s8, y, n, k, g, splits, grid); break;
    case 7: tiled<Q, 7>(w, rb, q8, d8, s8, y, n, k, g, splits, grid); break;
    case 8: tiled<Q, 8>(w, rb, q8, d8, s8, y, n, k, g, splits, grid); break;
  }
}

// The tiled matvec (m 1..8) with g supers per row and step, K in `splits` ranges (y [splits, m,
// n]), on `grid` blocks.
extern "C" void run_tiled(int qtype, const uint8_t* w, int64_t rb, const int8_t* q8, const float* d8, const float* s8,
                          float* y, int64_t m, int64_t n, int64_t k, int g, int splits, int grid) {
  using namespace ftlab::qmt;
  switch (qtype) {
    case 0: tiled_type<SQ8_0>(w, rb, q8, d8, s8, y, m, n, k, g, splits, grid); break;
    case 1: tiled_type<SQK4<false>>(w, rb, q8, d8, s8, y, m, n, k, g, splits, grid); break;
    case 2: tiled_type<SQK4<true>>(w, rb, q8, d8, s8, y, m, n, k, g, splits, grid); break;
    case 3: tiled_type<SQ6_K>(w, rb, q8, d8, s8, y, m, n, k, g, splits, grid); break;
  }
}

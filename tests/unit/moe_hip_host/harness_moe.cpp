// Runs moe_kquant.hip's lanes expert kernels on the CPU with the host port.h of tests/unit/host
// beside the real device headers (its HostPool: one std::thread per GPU thread of a block, blocks
// in turn; a barrier per block and per 32-lane group).
#include "port.h"
#include "moe_kquant.hip"

using namespace ftlab::qmm;

template <typename Q>
void gate_up(const int8_t* q8, const float* d8, const float* s8, const uint8_t* w, int64_t eb, int64_t rb,
             const int32_t* ids, float* h, int64_t e, int64_t hidden, int64_t inter, int64_t tokens, int64_t k) {
  HostPool pool(kGroup * kRowsPerBlock, kGroup);
  for (int p = 0; p < tokens * k; ++p)
    for (int by = 0; by < (inter + kRowsPerBlock - 1) / kRowsPerBlock; ++by)
      pool.run(p, by, [=] { moe_gate_up_kq_kernel<Q>(q8, d8, s8, w, eb, rb, ids, h, e, hidden, inter, k); });
}

template <typename Q>
void down(const int8_t* q8, const float* d8, const float* s8, const uint8_t* w, int64_t eb, int64_t rb,
          const int32_t* ids, const float* wts, float* y, int64_t e, int64_t hidden, int64_t inter, int64_t tokens,
          int64_t k) {
  HostPool pool(kGroup * kRowsPerBlock, kGroup);
  for (int t = 0; t < tokens; ++t)
    for (int by = 0; by < (hidden + kRowsPerBlock - 1) / kRowsPerBlock; ++by)
      pool.run(t, by, [=] { moe_down_kq_kernel<Q>(q8, d8, s8, w, eb, rb, ids, wts, y, e, hidden, inter, k); });
}

#define FTLAB_BY_CODE(code, F, ...)              \
  switch (code) {                               \
    case 0: F<Q8_0>(__VA_ARGS__); break;        \
    case 1: F<QK4<false>>(__VA_ARGS__); break;  \
    case 2: F<QK4<true>>(__VA_ARGS__); break;   \
    case 3: F<Q6_K>(__VA_ARGS__); break;        \
    default: F<QUnit4_0>(__VA_ARGS__); break;   \
  }

// code: 0 Q8_0, 1 Q4_K, 2 Q5_K, 3 Q6_K, 4 Q4_0 (moe_kquant_launch.hip's codes).
extern "C" void run_gate_up(int code, const int8_t* q8, const float* d8, const float* s8, const uint8_t* w,
                            int64_t eb, int64_t rb, const int32_t* ids, float* h, int64_t e, int64_t hidden,
                            int64_t inter, int64_t tokens, int64_t k) {
  FTLAB_BY_CODE(code, gate_up, q8, d8, s8, w, eb, rb, ids, h, e, hidden, inter, tokens, k)
}

extern "C" void run_down(int code, const int8_t* q8, const float* d8, const float* s8, const uint8_t* w, int64_t eb,
                         int64_t rb, const int32_t* ids, const float* wts, float* y, int64_t e, int64_t hidden,
                         int64_t inter, int64_t tokens, int64_t k) {
  FTLAB_BY_CODE(code, down, q8, d8, s8, w, eb, rb, ids, wts, y, e, hidden, inter, tokens, k)
}

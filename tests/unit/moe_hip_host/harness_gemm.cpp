// Runs moe_gemm.hip's grouped GEMM on the matrix cores (moe_gemm_mma_kernel, fp16 / bf16 banks) on
// the CPU with the host port.h of tests/unit/host beside the real device headers: mma.h's
// fragments and accumulators in the layout the build names (FTLAB_MMA_EMULATE), one std::thread
// per GPU thread, blocks in turn.
#include "port.h"
#include "moe_gemm.hip"

using namespace ftlab;

template <typename T, bool G, int BM>
void run_shape(const uint16_t* a, int64_t a_stride, const uint16_t* bank, int64_t e_stride, int64_t row_stride,
               const int32_t* sorted, const int32_t* expert_ids, const int32_t* npad, const float* wts, void* out,
               int64_t pairs, int top_k, int64_t n_out, int64_t k, int blocks_y) {
  HostPool pool(kMoeThreads);
  for (int by = 0; by < blocks_y; ++by)
    for (int bx = 0; bx < (n_out + 63) / 64; ++bx)
      pool.run(bx, by, [=] {
        moe_gemm_mma_kernel<T, G, BM, 64, 64>(a, a_stride, bank, e_stride, row_stride, sorted, expert_ids, npad, wts,
                                              out, pairs, top_k, n_out, k);
      });
}

// bf16: else fp16; gated: gate/up banks [E, 2 N, K] -> h [pairs, N] in a's dtype, else the down
// bank [E, N, K] -> out [pairs, N] fp32 weighted by wts; bm: moe_align's block_m (32 or 64).
extern "C" void run_mma(int bf16, int gated, int bm, const uint16_t* a, int64_t a_stride, const uint16_t* bank,
                        int64_t e_stride, int64_t row_stride, const int32_t* sorted, const int32_t* expert_ids,
                        const int32_t* npad, const float* wts, void* out, int64_t pairs, int top_k, int64_t n_out,
                        int64_t k, int blocks_y) {
#define FTLAB_RUN(T, G, BM) \
  run_shape<T, G, BM>(a, a_stride, bank, e_stride, row_stride, sorted, expert_ids, npad, wts, out, pairs, top_k, n_out, k, blocks_y)
  if (bf16) {
    if (gated) { if (bm == 32) FTLAB_RUN(bf16_t, true, 32); else FTLAB_RUN(bf16_t, true, 64); }
    else { if (bm == 32) FTLAB_RUN(bf16_t, false, 32); else FTLAB_RUN(bf16_t, false, 64); }
  } else {
    if (gated) { if (bm == 32) FTLAB_RUN(f16_t, true, 32); else FTLAB_RUN(f16_t, true, 64); }
    else { if (bm == 32) FTLAB_RUN(f16_t, false, 32); else FTLAB_RUN(f16_t, false, 64); }
  }
#undef FTLAB_RUN
}

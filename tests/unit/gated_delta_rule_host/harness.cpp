// Runs gated_delta_rule.hip's kernels on the CPU with the host port.h of tests/unit/host beside the real
// device headers (its HostPool: one std::thread per GPU thread of a block, blocks in turn), fp32
// operands.
#include "port.h"
#include "gated_delta_rule.hip"

using namespace ftlab;

template <typename F>
void run_grid(int blocks_x, int blocks_y, int threads, F kernel) {
  HostPool pool(threads);
  for (int by = 0; by < blocks_y; ++by)
    for (int bx = 0; bx < blocks_x; ++bx) pool.run(bx, by, kernel);
}

// tokens == 0: the decode step (q, k [B, Hk, Dk] ...) with step_cols (16 or 32) columns a block
// and 16-byte state accesses when vec, with the gates made from g and beta (the raw a and b) when
// a_neg is given, the rows of reset (bytes, or null) from a zero state; else the prefill scan over
// tokens.
extern "C" void run(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
                    float* o, int b, int tokens, int hk, int hv, int dk, int dv, float scale, int l2norm,
                    int step_cols, int vec, const float* a_neg, const float* dt_bias, const uint8_t* reset) {
  const bool gates = a_neg != nullptr;
  if (tokens == 0)
    run_grid(b * hv, step_cols == 32 ? (dv + 31) / 32 : (dv + 15) / 16, kDsThreads, [=] {
      if (step_cols == 32 && gates)
        gated_delta_step_kernel<f32_t, 8, true>(q, k, v, g, beta, state, o, a_neg, dt_bias, reset, hk, hv, dk, dv,
                                                scale, l2norm, vec);
      else if (step_cols == 32)
        gated_delta_step_kernel<f32_t, 8, false>(q, k, v, g, beta, state, o, a_neg, dt_bias, reset, hk, hv, dk, dv,
                                                 scale, l2norm, vec);
      else if (gates)
        gated_delta_step_kernel<f32_t, 4, true>(q, k, v, g, beta, state, o, a_neg, dt_bias, reset, hk, hv, dk, dv,
                                                scale, l2norm, vec);
      else
        gated_delta_step_kernel<f32_t, 4, false>(q, k, v, g, beta, state, o, a_neg, dt_bias, reset, hk, hv, dk, dv,
                                                 scale, l2norm, vec);
    });
  else
    run_grid(b * hv, (dv + kDnCols - 1) / kDnCols, kDnThreads, [=] {
      gated_delta_scan_kernel<f32_t>(q, k, v, g, beta, state, o, tokens, hk, hv, dk, dv, scale, l2norm);
    });
}

// Runs gated_delta_rule_chunk.hip's two kernels (the chunked prefill on the matrix cores) on the CPU with
// the host port.h of tests/unit/host beside the real device headers: mma.h's scalar path, one
// std::thread per GPU thread of a block, blocks in turn, dynamic LDS a function static.
#include "port.h"
#include "gated_delta_rule_chunk.hip"
#include "gated_delta_rule_chunk_prep.hip"

using namespace ftlab;

template <typename F>
void run_grid(int blocks_x, int blocks_y, F kernel) {
  HostPool pool(kCkThreads);
  for (int by = 0; by < blocks_y; ++by)
    for (int bx = 0; bx < blocks_x; ++bx) pool.run(bx, by, kernel);
}

// q, k [B, T, Hk, Dk], v, o [B, T, Hv, Dv] bf16; g, beta [B, T, Hv] fp32; state [B, Hv, Dk, Dv]
// fp32 in and out; ab, attn [B, Hv, NT, planes, 64, 64] bf16 and sc [B, Hv, NT, 4, 64] fp32 scratch.
// planes: 3 or 1 (the kernels' P). late: the stress mode of the host port.h (the first `late` threads
// of a block sleep after each barrier).
template <int P>
void run_planes(const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* g, const float* beta,
                float* state, uint16_t* o, uint16_t* ab, uint16_t* attn, float* sc, int b, int tokens, int hk, int hv,
                int dk, int dv, float scale, int l2norm) {
  const int nt = (tokens + kCk - 1) / kCk, heads_q = (hv / hk + kCkHeads - 1) / kCkHeads;
  run_grid(nt, b * hk * heads_q, [=] {
    dn_chunk_prep_kernel<P>(q, k, g, beta, ab, attn, sc, tokens, hk, hv, dk, heads_q, scale, l2norm);
  });
  run_grid(b * hv, (dv + kCkBV - 1) / kCkBV, [=] {
    dn_chunk_scan_kernel<P>(q, k, v, ab, attn, sc, state, o, tokens, hk, hv, dk, dv);
  });
}

extern "C" void run_chunk(const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* g, const float* beta,
                          float* state, uint16_t* o, uint16_t* ab, uint16_t* attn, float* sc, int b, int tokens, int hk,
                          int hv, int dk, int dv, float scale, int l2norm, int late, int planes) {
  host_late_below = late;
  if (planes == 3) run_planes<3>(q, k, v, g, beta, state, o, ab, attn, sc, b, tokens, hk, hv, dk, dv, scale, l2norm);
  else run_planes<1>(q, k, v, g, beta, state, o, ab, attn, sc, b, tokens, hk, hv, dk, dv, scale, l2norm);
  host_late_below = 0;
}

// q4_0_norm_prologue.h — the fused Q4_0 matvec's norm prologue (q4_0_matvec.hip, MODE kFusedNorm):
// add_rmsnorm's arithmetic on one row, then its Q8_1 into the matvec's activation records.
// Included by q4_0_matvec.hip inside its namespace ftlab, after its constants (kFusedGroups,
// kSuperBlocks, kRecordWords) and norm_common.h; not a header of its own.
#pragma once

// The fused matvec's norm prologue (MODE kFusedNorm; see there): pieces t = w0 + tid, w0 = 0, NT,
// ... < kNormThreads, each add_rmsnorm_kernel's thread t: s = x + res rounded (stored by block 0),
// the sum of its squares; a warp's sums by the shuffles of add_rmsnorm_kernel, written to
// partial[t / PORT_WARP_SIZE]; after the barrier their sum in order gives r; then y = s * r * w
// rounded (stored by block 0) is quantized into the records as the quantize loop would (q8_1_quarter
// on y's 8 elements, every thread in every round so the quarter shuffles see whole groups).
template <typename T>
__device__ __forceinline__ void norm_prologue(const typename T::storage* x, const typename T::storage* res,
                                              const typename T::storage* norm_w, typename T::storage* s_out,
                                              typename T::storage* y_out, float eps, int nb, int tid,
                                              uint32_t* xrec) {
  constexpr int NT = kGroup * kFusedGroups;
  constexpr int kRounds = kNormThreads / NT;  // 2 (kGroup is 32 on every target)
  static_assert(kNormThreads % NT == 0 && NT % PORT_WARP_SIZE == 0, "rounds of whole waves");
  __shared__ float partial[kNormPartials];
  const int pieces = 4 * nb;  // 8 elements each
  const bool first = blockIdx.x == 0;
  norm_pieces<T, 8> xs[kRounds];
#pragma unroll
  for (int c = 0; c < kRounds; ++c) {
    const int t = c * NT + tid;
    float ss = 0.0f;
    if (t < pieces) {
      norm_pieces<T, 8> rs;
      norm_fetch<T, 8>(x + 8 * t, xs[c]);
      if (res != nullptr) norm_fetch<T, 8>(res + 8 * t, rs);
      ss = norm_sum<T, 8>(xs[c], rs, s_out + 8 * t, res != nullptr, first && res != nullptr);
    }
#pragma unroll
    for (int m = PORT_WARP_SIZE / 2; m > 0; m >>= 1) ss += port_shfl_xor(ss, m);
    if (t % PORT_WARP_SIZE == 0) partial[t / PORT_WARP_SIZE] = ss;
  }
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormThreads / PORT_WARP_SIZE; ++i) total += partial[i];
  float r = 1.0f / port_sqrtf(total / static_cast<float>(8 * pieces) + eps);
  if (total == __builtin_inff()) {  // the squares overflowed (norm_common.h): norm_block_sum's order
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kRounds; ++c) {
      const int t = c * NT + tid;
      const float scaled = norm_wave_sum(t < pieces ? norm_scaled_squares<T, 8>(xs[c]) : 0.0f);
      if (t % PORT_WARP_SIZE == 0) partial[t / PORT_WARP_SIZE] = scaled;
    }
    __syncthreads();
    r = norm_scaled_factor(norm_partials_sum(partial), 8 * pieces, eps);
  }
#pragma unroll
  for (int c = 0; c < kRounds; ++c) {
    const int t = c * NT + tid;
    const bool active = t < pieces;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    if (active) {
      norm_pieces<T, 8> wraw, out;
      norm_fetch<T, 8>(norm_w + 8 * t, wraw);
      float wv[8];
      norm_floats<T, 8>(wraw, wv);
      norm_make<T, 8>(xs[c], wv, r, out);
      if (first) norm_put<T, 8>(y_out + 8 * t, out);
      norm_floats<T, 8>(out, v);
    }
    const int b = t >> 2;
    quarter_to_record(v, active ? xrec + (b / kSuperBlocks) * kRecordWords : nullptr, b % kSuperBlocks, t & 3);
  }
}

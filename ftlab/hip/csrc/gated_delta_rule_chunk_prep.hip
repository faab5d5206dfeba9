// gated_delta_rule_chunk_prep.hip — the chunked prefill's first launch, dn_chunk_prep_kernel: per chunk of
// 64 tokens and key head, for up to four of its value heads, A diag(beta) with A = (I + L)^-1, the
// masked decayed Q K^T and the row factors (gated_delta_rule_chunk.hip's head comment has the design).
#pragma once
#include "gated_delta_rule_chunk.h"

namespace ftlab {

// ------------------------------------------------------------------ prep

struct CkPrepShared {
  union {
    struct {
      uint16_t k[kCk][kLdK], q[kCk][kLdK];
    } in;
    struct {
      float g[kCk][kCk + 1], a[kCk][kCk + 1];  // G, and QK until attn is out; then each head's A
    } m;
  } u;
  float l[kCk][kCk + 1];
  float t[3][16][17];  // off-diagonal block products
  float rk[kCk], rq[kCk], c[kCkHeads][kCk], beta[kCkHeads][kCk];
};
constexpr int kCkPrepLds = static_cast<int>(sizeof(CkPrepShared));
static_assert(kCkPrepLds <= 64 * 1024, "64 KB of LDS a block at most");

// q, k [B, T, Hk, Dk] bf16, g, beta [B, T, Hv] fp32; writes ab, attn [B, Hv, NT, P, 64, 64] (each
// in P bf16 planes: ck_split3's three, or one rounding) and sc [B, Hv, NT, 4, 64] fp32 (NT =
// ceil(T / 64)); heads_q = ceil(Hv / Hk / 4).
template <int P>
__global__ void __launch_bounds__(kCkThreads)
    dn_chunk_prep_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                         const float* __restrict__ g, const float* __restrict__ beta, uint16_t* __restrict__ ab,
                         uint16_t* __restrict__ attn, float* __restrict__ sc, int tokens, int hk, int hv, int dk,
                         int heads_q, float scale, int l2norm) {
  PORT_DYNAMIC_LDS(uint16_t, ck_lds);
  CkPrepShared& sh = *reinterpret_cast<CkPrepShared*>(ck_lds);
  const int tid = threadIdx.x, n = blockIdx.x, by = blockIdx.y, bk = by / heads_q, b = bk / hk, kh = bk % hk;
  const int nt = (tokens + kCk - 1) / kCk, t0 = n * kCk, rep = hv / hk, j0 = kCkHeads * (by % heads_q);
  const int heads = rep - j0 < kCkHeads ? rep - j0 : kCkHeads;
  const int group = tid / PORT_WARP_SIZE;
  {  // K and Q rows, every load issued before the first store
    const bool vec = ck_kq16(q, k, dk);
    bytes16 kv[kCkKQ], qv[kCkKQ];
#pragma unroll
    for (int i = 0; i < kCkKQ; ++i) {
      const int e = tid + i * kCkThreads, r = e / (kCkDk / 8), d = 8 * (e % (kCkDk / 8));
      ck_load_kq(q, k, b, tokens, hk, kh, dk, t0, r, d, vec, kv[i], qv[i]);
    }
#pragma unroll
    for (int i = 0; i < kCkKQ; ++i) {
      const int e = tid + i * kCkThreads, r = e / (kCkDk / 8), d = 8 * (e % (kCkDk / 8));
      *reinterpret_cast<bytes16*>(&sh.u.in.k[r][d]) = kv[i];
      *reinterpret_cast<bytes16*>(&sh.u.in.q[r][d]) = qv[i];
    }
  }
  for (int e = tid; e < heads * kCk; e += kCkThreads) {
    const int j = e / kCk, r = e % kCk;
    const int64_t at = (static_cast<int64_t>(b) * tokens + t0 + r) * hv + kh * rep + j0 + j;
    sh.c[j][r] = t0 + r < tokens ? ck_floor_g(g[at]) : 0.0f;
    sh.beta[j][r] = t0 + r < tokens ? beta[at] : 0.0f;
  }
  __syncthreads();
  if (tid < 2 * kCk) {  // the norm factors, a thread a row
    const uint16_t* row = tid < kCk ? sh.u.in.k[tid] : sh.u.in.q[tid - kCk];
    float ss = 0.0f;
    for (int d = 0; d < kCkDk; ++d) {
      const float x = port_bf16_to_float(row[d]);
      ss += x * x;
    }
    const float r = l2norm ? 1.0f / port_sqrtf(ss + 1e-6f) : 1.0f;
    if (tid < kCk) sh.rk[tid] = r;
    else sh.rq[tid - kCk] = r * scale;
  }
  if (tid < heads) {  // c = cumsum g, a thread a head
    float s = 0.0f;
    for (int r = 0; r < kCk; ++r) sh.c[tid][r] = s += sh.c[tid][r];
  }
  // the 10 lower tiles of K K^T (0..9) and of Q K^T (10..19)
  constexpr int kTiles = 20, kPer = (kTiles + kCkGroups - 1) / kCkGroups;
  MmaAcc acc[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    ck_zero(acc[j]);
    const int tile = group + j * kCkGroups;
    if (tile >= kTiles) continue;
    int i, jj;
    ck_lower_tile(tile % 10, i, jj);
    const uint16_t* arow = tile >= 10 ? sh.u.in.q[16 * i] : sh.u.in.k[16 * i];
    for (int kk = 0; kk < kCkDk; kk += 16)
      mma_16x16x16<bf16_t>(acc[j], mma_frag(arow + kk, kLdK), mma_frag(sh.u.in.k[16 * jj] + kk, kLdK));
  }
  __syncthreads();  // K and Q read: their LDS takes G and QK
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int tile = group + j * kCkGroups;
    if (tile >= kTiles) continue;
    int i, jj;
    ck_lower_tile(tile % 10, i, jj);
#pragma unroll
    for (int e = 0; e < kMmaAcc; ++e)
      (tile >= 10 ? sh.u.m.a : sh.u.m.g)[16 * i + mma_row(e)][16 * jj + mma_col(e)] = acc[j].v[e];
  }
  __syncthreads();
  const int64_t head0 = static_cast<int64_t>(b) * hv + kh * rep + j0;
  // attn of every head first: QK's LDS then holds the inverses
  for (int e = tid; e < heads * kCk * kCk; e += kCkThreads) {
    const int j = e / (kCk * kCk), r = (e / kCk) % kCk, cc = e % kCk;
    const float x = cc <= r ? sh.u.m.a[r][cc] * sh.rq[r] * sh.rk[cc] * port_expf(sh.c[j][r] - sh.c[j][cc]) : 0.0f;
    ck_putp<P>(attn + ((head0 + j) * nt + n) * P * kCkPlanes + r * kCk + cc, kCkPlanes, x);
  }
  for (int j = 0; j < heads; ++j) {
    __syncthreads();  // a is free (attn read, or the previous head's A written out)
    float* scj = sc + ((head0 + j) * nt + n) * 4 * kCk;
    const float* c = sh.c[j];
    const float clast = c[kCk - 1];
    for (int e = tid; e < kCk * kCk; e += kCkThreads) {
      const int r = e / kCk, cc = e % kCk;
      const bool live = cc < r && ck_finite(c[r]);  // rows from a NaN g on: out of the solve
      sh.l[r][cc] = live ? sh.beta[j][r] * sh.rk[r] * sh.rk[cc] * port_expf(c[r] - c[cc]) * sh.u.m.g[r][cc] : 0.0f;
      sh.u.m.a[r][cc] = 0.0f;
    }
    if (tid < kCk) {  // fk selected as L is (R = V - fk P is summed over rows); the others keep a NaN
      const float ec = port_expf(c[tid]);
      scj[tid] = ck_finite(c[tid]) ? ec * sh.rk[tid] : 0.0f;
      scj[kCk + tid] = ec * sh.rq[tid];
      scj[2 * kCk + tid] = sh.rk[tid] * port_expf(clast - c[tid]);
      scj[3 * kCk + tid] = tid == 0 ? port_expf(clast) : 0.0f;
    }
    __syncthreads();
    if (tid < kCk) {  // diagonal blocks: column col of (I + L_bb)^-1 by forward substitution
      const int bb = tid / 16, col = tid % 16, o = 16 * bb;
      float x[16];
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        float s = r == col ? 1.0f : 0.0f;
#pragma unroll
        for (int m = 0; m < r; ++m) s -= sh.l[o + r][o + m] * x[m];
        x[r] = r < col ? 0.0f : s;
        sh.u.m.a[o + r][o + col] = x[r];
      }
    }
    __syncthreads();
    for (int d = 1; d < 4; ++d) {  // A_ij = -A_ii sum_{m=j}^{i-1} L_im A_mj, i - j = d
      for (int e = tid; e < (4 - d) * 256; e += kCkThreads) {
        const int blk = e / 256, r = (e / 16) % 16, cc = e % 16, i = d + blk;
        float s = 0.0f;
        for (int m = 16 * blk; m < 16 * i; ++m) s += sh.l[16 * i + r][m] * sh.u.m.a[m][16 * blk + cc];
        sh.t[blk][r][cc] = s;
      }
      __syncthreads();
      for (int e = tid; e < (4 - d) * 256; e += kCkThreads) {
        const int blk = e / 256, r = (e / 16) % 16, cc = e % 16, i = d + blk;
        float s = 0.0f;
        for (int m = 0; m < 16; ++m) s += sh.u.m.a[16 * i + r][16 * i + m] * sh.t[blk][m][cc];
        sh.u.m.a[16 * i + r][16 * blk + cc] = -s;
      }
      __syncthreads();
    }
    uint16_t* abj = ab + ((head0 + j) * nt + n) * P * kCkPlanes;
    for (int e = tid; e < kCkPlanes; e += kCkThreads)
      ck_putp<P>(abj + e, kCkPlanes, sh.u.m.a[e / kCk][e % kCk] * sh.beta[j][e % kCk]);
  }
}

// the launcher's configurations, instantiated here so that a device-only build of this file has them
template __global__ void dn_chunk_prep_kernel<1>(const uint16_t*, const uint16_t*, const float*, const float*,
                                                 uint16_t*, uint16_t*, float*, int, int, int, int, int, float, int);
template __global__ void dn_chunk_prep_kernel<3>(const uint16_t*, const uint16_t*, const float*, const float*,
                                                 uint16_t*, uint16_t*, float*, int, int, int, int, int, float, int);

}  // namespace ftlab

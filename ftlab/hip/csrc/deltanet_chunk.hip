// deltanet_chunk.hip — the gated delta rule's prefill in chunks of 64 tokens on the matrix cores
// (mma.h's 16 x 16 x 16 bf16 product, fp32 sums), for bf16 q, k, v and Dk <= 128.
// Contract: ftlab/ops/deltanet.py; reference: ftlab/reference/deltanet.py (the chunked form);
// the token-by-token scan of deltanet.hip takes every other case.
//
// Two launches. Per chunk of 64 tokens, with c = cumsum g, rk / rq the norm factors (rq with the
// scale), G = K K^T and QK = Q K^T on the raw bf16 rows:
//   dn_chunk_prep_kernel  grid (NT, B * Hk * ceil(R / 4)), R = Hv / Hk, 256 threads, 57 KB LDS:
//     G and QK (exact bf16 products), then for each of up to four value heads of the key head
//       L = strictly lower (beta_i rk_i rk_j e^(c_i - c_j) G_ij), A = (I + L)^-1 by 16-row blocks
//     in fp32 FMAs, and writes ab = A diag(beta) [64][64], attn = lower (QK_ij rq_i rk_j
//     e^(c_i - c_j)) [64][64] and the row factors sc[4][64]: fk = e^c rk, fq = e^c rq,
//     fx = rk e^(c_last - c), and e^c_last (sc[3][0]; the rest of row 3 zero).
//   dn_chunk_scan_kernel  grid (B * Hv, ceil(Dv / 32)), 256 threads, 61 KB LDS: the state slice
//     S [128 x 32] fp32 in MMA accumulators over all chunks, per chunk
//       P = K S, Qs = Q S          (K, Q exact in bf16; S in three bf16 planes: 3 products)
//       R = V - fk P               (fp32)
//       X = ab R                   (both in three planes: 6 products)
//       O = fq Qs + attn X         (6 products), rounded once to bf16 -> o
//       S = e^c_last S + K^T (fx X) (3 products)
//     No per-chunk state, W, U or v_new goes to memory.
// Precision: an fp32 operand x is split into three bf16 parts, x = p0 + p1 + p2 + r with
// |r| <= 2^-24 |x| while the parts are normal numbers (each rounded to nearest even; the
// differences are exact in fp32; below ~1e-36 the parts go subnormal and r is absolute), so a
// product of such operands is within a few fp32 roundings of the fp32 product -- what tf32x3
// reaches, and what ftlab.testing.gated_delta_tolerance's chunked terms allow.
// Keys past the sequence's end are zero rows (their beta and g zero), so they change nothing.
#pragma once
#include "mma.h"

namespace ftlab {

constexpr int kCk = 64;          // tokens a chunk
constexpr int kCkDk = 128;       // key rows (Dk padded with zeros)
constexpr int kCkBV = 32;        // state columns a scan block
constexpr int kCkHeads = 4;      // value heads a prep block
constexpr int kCkThreads = 256;
constexpr int kCkGroups = kCkThreads / PORT_WARP_SIZE;
constexpr int kLdK = kCkDk + 8;  // LDS row of Dk bf16 (16-byte aligned rows, banks spread)
constexpr int kLdT = kCk + 8;    // LDS row of 64 tokens

// x = bf16(p0) + bf16(p1) + bf16(p2) + r, |r| <= 2^-24 |x| for normal parts
__device__ __forceinline__ void ck_split3(float x, uint16_t& p0, uint16_t& p1, uint16_t& p2) {
  p0 = port_float_to_bf16(x);
  const float r = x - port_bf16_to_float(p0);
  p1 = port_float_to_bf16(r);
  p2 = port_float_to_bf16(r - port_bf16_to_float(p1));
}
// x's three planes, `plane` elements apart, at p
__device__ __forceinline__ void ck_put3(uint16_t* p, int plane, float x) {
  uint16_t p0, p1, p2;
  ck_split3(x, p0, p1, p2);
  p[0] = p0;
  p[plane] = p1;
  p[2 * plane] = p2;
}

// D += A B^T, A exact in bf16 (one plane), B in three planes bplane elements apart
__device__ __forceinline__ void ck_mma_x3(MmaAcc& d, const uint16_t* a, int lda, const uint16_t* b, int ldb,
                                          int bplane) {
  const MmaFrag fa = mma_frag(a, lda);
#pragma unroll
  for (int p = 0; p < 3; ++p) mma_16x16x16<bf16_t>(d, fa, mma_frag(b + p * bplane, ldb));
}
// D += A B^T, both in three planes: the six products of parts down to 2^-16 relative, small first
__device__ __forceinline__ void ck_mma_x6(MmaAcc& d, const uint16_t* a, int lda, int aplane, const uint16_t* b,
                                          int ldb, int bplane) {
  const MmaFrag a0 = mma_frag(a, lda), a1 = mma_frag(a + aplane, lda), a2 = mma_frag(a + 2 * aplane, lda);
  const MmaFrag b0 = mma_frag(b, ldb), b1 = mma_frag(b + bplane, ldb), b2 = mma_frag(b + 2 * bplane, ldb);
  mma_16x16x16<bf16_t>(d, a2, b0);
  mma_16x16x16<bf16_t>(d, a1, b1);
  mma_16x16x16<bf16_t>(d, a0, b2);
  mma_16x16x16<bf16_t>(d, a1, b0);
  mma_16x16x16<bf16_t>(d, a0, b1);
  mma_16x16x16<bf16_t>(d, a0, b0);
}

// min(a, b) without a comparison (|a - b| < 2^31): no lane mask for the compiler to keep
__device__ __forceinline__ int ck_min(int a, int b) { return b + ((a - b) & ((a - b) >> 31)); }

__device__ __forceinline__ void ck_zero(MmaAcc& d) {
#pragma unroll
  for (int i = 0; i < kMmaAcc; ++i) d.v[i] = 0.0f;
}

// Row tile i and column tile j of the w-th of the 10 lower 16 x 16 tiles of a 64 x 64 matrix.
__device__ __forceinline__ void ck_lower_tile(int w, int& i, int& j) {
  i = w < 1 ? 0 : w < 3 ? 1 : w < 6 ? 2 : 3;
  j = w - i * (i + 1) / 2;
}

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

// q, k [B, T, Hk, Dk] bf16, g, beta [B, T, Hv] fp32; writes ab, attn [B, Hv, NT, 64, 64] and
// sc [B, Hv, NT, 4, 64] fp32 (NT = ceil(T / 64)); heads_q = ceil(Hv / Hk / 4).
__global__ void __launch_bounds__(kCkThreads)
    dn_chunk_prep_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                         const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ ab,
                         float* __restrict__ attn, float* __restrict__ sc, int tokens, int hk, int hv, int dk,
                         int heads_q, float scale, int l2norm) {
  PORT_DYNAMIC_LDS(uint16_t, ck_lds);
  CkPrepShared& sh = *reinterpret_cast<CkPrepShared*>(ck_lds);
  const int tid = threadIdx.x, n = blockIdx.x, by = blockIdx.y, bk = by / heads_q, b = bk / hk, kh = bk % hk;
  const int nt = (tokens + kCk - 1) / kCk, t0 = n * kCk, rep = hv / hk, j0 = kCkHeads * (by % heads_q);
  const int heads = rep - j0 < kCkHeads ? rep - j0 : kCkHeads;
  const int group = tid / PORT_WARP_SIZE;
  for (int e = tid; e < kCk * kCkDk; e += kCkThreads) {
    const int r = e / kCkDk, d = e % kCkDk;
    const bool ok = t0 + r < tokens && d < dk;
    const int64_t at = ((static_cast<int64_t>(b) * tokens + t0 + r) * hk + kh) * dk + d;
    sh.u.in.k[r][d] = ok ? k[at] : 0;
    sh.u.in.q[r][d] = ok ? q[at] : 0;
  }
  for (int e = tid; e < heads * kCk; e += kCkThreads) {
    const int j = e / kCk, r = e % kCk;
    const int64_t at = (static_cast<int64_t>(b) * tokens + t0 + r) * hv + kh * rep + j0 + j;
    sh.c[j][r] = t0 + r < tokens ? g[at] : 0.0f;
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
    attn[((head0 + j) * nt + n) * kCk * kCk + r * kCk + cc] = x;
  }
  for (int j = 0; j < heads; ++j) {
    __syncthreads();  // a is free (attn read, or the previous head's A written out)
    float* scj = sc + ((head0 + j) * nt + n) * 4 * kCk;
    const float* c = sh.c[j];
    const float clast = c[kCk - 1];
    for (int e = tid; e < kCk * kCk; e += kCkThreads) {
      const int r = e / kCk, cc = e % kCk;
      sh.l[r][cc] = cc < r ? sh.beta[j][r] * sh.rk[r] * sh.rk[cc] * port_expf(c[r] - c[cc]) * sh.u.m.g[r][cc] : 0.0f;
      sh.u.m.a[r][cc] = 0.0f;
    }
    if (tid < kCk) {
      const float ec = port_expf(c[tid]);
      scj[tid] = ec * sh.rk[tid];
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
    float* abj = ab + ((head0 + j) * nt + n) * kCk * kCk;
    for (int e = tid; e < kCk * kCk; e += kCkThreads) abj[e] = sh.u.m.a[e / kCk][e % kCk] * sh.beta[j][e % kCk];
  }
}

// ------------------------------------------------------------------ scan

// LDS byte offsets. Phase 1: K and Q rows, S^T's planes. Phases 2 and 3: ab's (then attn's)
// planes, R's (then X's) planes, X~'s planes, O's bf16 tile after them. Phase 4: K^T.
constexpr int kOffK = 0, kOffQ = kOffK + kCk * kLdK * 2, kOffS = kOffQ + kCk * kLdK * 2;
constexpr int kSPlane = kCkBV * kLdK;  // elements
constexpr int kOffA = 0, kAPlane = kCk * kLdT, kOffR = kOffA + 3 * kAPlane * 2;
constexpr int kTPlane = kCkBV * kLdT, kOffXt = kOffR + 3 * kTPlane * 2;
constexpr int kOffKt = 0, kOffO = kOffXt + 3 * kTPlane * 2;
constexpr int kOffFac = kOffS + 3 * kSPlane * 2;
constexpr int kCkScanLds = kOffFac + 4 * kCk * 4;
static_assert(kOffO + kCk * kCkBV * 2 <= kOffFac && kOffKt + kCkDk * kLdT * 2 <= kOffXt,
              "the phases' LDS regions");
static_assert(kCkScanLds <= 64 * 1024 && kCkPrepLds <= 64 * 1024, "64 KB of LDS a block at most");

// q, k [B, T, Hk, Dk], v, o [B, T, Hv, Dv] bf16; ab, attn, sc from the prep; state [B, Hv, Dk, Dv]
// fp32, the initial state in, the final one out.
__global__ void __launch_bounds__(kCkThreads)
    dn_chunk_scan_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                         const uint16_t* __restrict__ v, const float* __restrict__ ab,
                         const float* __restrict__ attn, const float* __restrict__ sc, float* __restrict__ state,
                         uint16_t* __restrict__ o, int tokens, int hk, int hv, int dk, int dv) {
  PORT_DYNAMIC_LDS(uint16_t, lds);
  float (*fac)[kCk] = reinterpret_cast<float (*)[kCk]>(lds + kOffFac / 2);
  uint16_t* const lk = lds + kOffK / 2;
  uint16_t* const lq = lds + kOffQ / 2;
  uint16_t* const ls = lds + kOffS / 2;
  uint16_t* const la = lds + kOffA / 2;
  uint16_t* const lr = lds + kOffR / 2;
  uint16_t* const lxt = lds + kOffXt / 2;
  uint16_t* const lkt = lds + kOffKt / 2;
  uint16_t* const lo = lds + kOffO / 2;
  const int tid = threadIdx.x, bh = blockIdx.x, b = bh / hv, h = bh % hv, kh = h / (hv / hk);
  const int col0 = blockIdx.y * kCkBV, group = tid / PORT_WARP_SIZE;
  const int nt = (tokens + kCk - 1) / kCk;
  // S's tiles: 8 row tiles (Dk) x 2 column tiles, tile = group + j groups
  constexpr int kSTiles = (kCkDk / 16) * (kCkBV / 16) / kCkGroups;
  MmaAcc s[kSTiles];
  float* const st = state + static_cast<int64_t>(bh) * dk * dv;
  auto s_rc = [&](int j, int e, int& r, int& c) {
    const int tile = group + j * kCkGroups;
    r = 16 * (tile % 8) + mma_row(e);
    c = 16 * (tile / 8) + mma_col(e);
  };
  auto put_s = [&]() {  // S^T [col][dk] in three planes
#pragma unroll
    for (int j = 0; j < kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e) {
        int r, c;
        s_rc(j, e, r, c);
        ck_put3(ls + c * kLdK + r, kSPlane, s[j].v[e]);
      }
  };
#pragma unroll
  for (int j = 0; j < kSTiles; ++j)
#pragma unroll
    for (int e = 0; e < kMmaAcc; ++e) {
      int r, c;
      s_rc(j, e, r, c);
      // an in-bounds load masked by bits, as v's below (a lane mask here would stay live until
      // the same test at the end)
      const int out = (dk - 1 - r) | (dv - 1 - col0 - c);
      const float x = st[static_cast<int64_t>(ck_min(r, dk - 1)) * dv + ck_min(col0 + c, dv - 1)];
      s[j].v[e] = port_bits_to_float(port_float_to_bits(x) & ~static_cast<uint32_t>(out >> 31));
    }
  put_s();
  // P / Qs: 8 row tiles (4 of K, then 4 of Q) x 2 column tiles; X: 4 x 2
  constexpr int kPTiles = 16 / kCkGroups, kXTiles = (8 + kCkGroups - 1) / kCkGroups;
  for (int n = 0; n < nt; ++n) {
    const int t0 = n * kCk;
    const int64_t chunk = static_cast<int64_t>(bh) * nt + n;
    // ---- phase 1: K and Q rows; P = K S, Qs = Q S
#pragma unroll 1
    for (int e = tid; e < kCk * kCkDk; e += kCkThreads) {
      const int r = e / kCkDk, d = e % kCkDk;
      const bool ok = t0 + r < tokens && d < dk;
      const int64_t at = ((static_cast<int64_t>(b) * tokens + t0 + r) * hk + kh) * dk + d;
      lk[r * kLdK + d] = ok ? k[at] : 0;
      lq[r * kLdK + d] = ok ? q[at] : 0;
    }
    fac[tid / kCk][tid % kCk] = sc[chunk * 4 * kCk + tid];  // 256 threads: the 4 x 64 factors
    __syncthreads();
    MmaAcc p[kPTiles];
#pragma unroll
    for (int j = 0; j < kPTiles; ++j) {
      ck_zero(p[j]);
      const int tile = group + j * kCkGroups, rt = tile % 8, ct = tile / 8;
      const uint16_t* arow = rt < 4 ? lk + 16 * rt * kLdK : lq + 16 * (rt - 4) * kLdK;
#pragma unroll 2
      for (int kk = 0; kk < kCkDk; kk += 16) ck_mma_x3(p[j], arow + kk, kLdK, ls + 16 * ct * kLdK + kk, kLdK, kSPlane);
    }
    __syncthreads();
    // ---- phase 2: ab in planes; R = V - fk P in planes (R^T [col][token]); X = ab R
    const float* abn = ab + chunk * kCk * kCk;
    const uint16_t* vrow = v + ((static_cast<int64_t>(b) * tokens + t0) * hv + h) * dv + col0;
    const int rlast = tokens - 1 - t0, clast = dv - 1 - col0, vstride = hv * dv;
#pragma unroll 1
    for (int e = tid; e < kCk * kCk; e += kCkThreads) ck_put3(la + (e / kCk) * kLdT + e % kCk, kAPlane, abn[e]);
#pragma unroll
    for (int j = 0; j < kPTiles; ++j) {
      const int tile = group + j * kCkGroups, rt = tile % 8, ct = tile / 8;
      if (rt >= 4) continue;
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e) {
        const int r = 16 * rt + mma_row(e), c = 16 * ct + mma_col(e);
        // v's element, or 0 past the sequence or the row: an in-bounds load masked by bits, so
        // that no lane masks stay live across the loads (wave64 keeps each in two SGPRs; NVIDIA
        // has predicates to spare, but the 32-bit offsets save registers there)
        const int out = (rlast - r) | (clast - c);  // negative when either is past
        const uint16_t bits = vrow[ck_min(r, rlast) * vstride + ck_min(c, clast)] &
                              static_cast<uint16_t>(~(out >> 31));
        ck_put3(lr + c * kLdT + r, kTPlane, port_bf16_to_float(bits) - fac[0][r] * p[j].v[e]);
      }
    }
    __syncthreads();
    MmaAcc x[kXTiles];
#pragma unroll
    for (int j = 0; j < kXTiles; ++j) {
      ck_zero(x[j]);
      const int tile = group + j * kCkGroups, rt = tile % 4, ct = tile / 4;
      if (tile >= 8) continue;
#pragma unroll 1
      for (int kb = 0; kb <= rt; ++kb)
        ck_mma_x6(x[j], la + 16 * rt * kLdT + 16 * kb, kLdT, kAPlane, lr + 16 * ct * kLdT + 16 * kb, kLdT, kTPlane);
    }
    __syncthreads();
    // ---- phase 3: attn in planes, X and X~ = fx X in planes; O = fq Qs + attn X (in p)
    const float* atn = attn + chunk * kCk * kCk;
#pragma unroll 1
    for (int e = tid; e < kCk * kCk; e += kCkThreads) ck_put3(la + (e / kCk) * kLdT + e % kCk, kAPlane, atn[e]);
#pragma unroll
    for (int j = 0; j < kXTiles; ++j) {
      const int tile = group + j * kCkGroups, rt = tile % 4, ct = tile / 4;
      if (tile >= 8) continue;
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e) {
        const int r = 16 * rt + mma_row(e), c = 16 * ct + mma_col(e);
        ck_put3(lr + c * kLdT + r, kTPlane, x[j].v[e]);
        ck_put3(lxt + c * kLdT + r, kTPlane, fac[2][r] * x[j].v[e]);
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kPTiles; ++j) {
      const int tile = group + j * kCkGroups, rt = tile % 8 - 4, ct = tile / 8;
      if (rt < 0) continue;
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e) p[j].v[e] *= fac[1][16 * rt + mma_row(e)];
#pragma unroll 1
      for (int kb = 0; kb <= rt; ++kb)
        ck_mma_x6(p[j], la + 16 * rt * kLdT + 16 * kb, kLdT, kAPlane, lr + 16 * ct * kLdT + 16 * kb, kLdT, kTPlane);
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e)
        lo[(16 * rt + mma_row(e)) * kCkBV + 16 * ct + mma_col(e)] = port_float_to_bf16(p[j].v[e]);
    }
    __syncthreads();
    // ---- phase 4: o out of LDS (the stores a row of 32 columns, 64 bytes, together), K^T;
    // S = e^c_last S + K^T X~
#pragma unroll 1
    for (int e = tid; e < kCk * kCkBV; e += kCkThreads) {
      const int r = e / kCkBV, c = e % kCkBV;
      if (t0 + r < tokens && col0 + c < dv)
        o[((static_cast<int64_t>(b) * tokens + t0 + r) * hv + h) * dv + col0 + c] = lo[e];
    }
#pragma unroll 1
    for (int e = tid; e < kCk * kCkDk; e += kCkThreads) {
      const int r = e / kCkDk, d = e % kCkDk;
      const bool ok = t0 + r < tokens && d < dk;
      lkt[d * kLdT + r] = ok ? k[((static_cast<int64_t>(b) * tokens + t0 + r) * hk + kh) * dk + d] : 0;
    }
    __syncthreads();
    const float el = fac[3][0];
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) {
      const int tile = group + j * kCkGroups, rt = tile % 8, ct = tile / 8;
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e) s[j].v[e] *= el;
#pragma unroll 2
      for (int kb = 0; kb < kCk; kb += 16)
        ck_mma_x3(s[j], lkt + 16 * rt * kLdT + kb, kLdT, lxt + 16 * ct * kLdT + kb, kLdT, kTPlane);
    }
    if (n + 1 == nt) break;
    __syncthreads();
    // over X~'s planes and O's tile; the next chunk's phase 1 writes elsewhere and reads these
    // only after its barrier
    put_s();
  }
#pragma unroll
  for (int j = 0; j < kSTiles; ++j)
#pragma unroll
    for (int e = 0; e < kMmaAcc; ++e) {
      int r, c;
      s_rc(j, e, r, c);
      if (r < dk && col0 + c < dv) st[static_cast<int64_t>(r) * dv + col0 + c] = s[j].v[e];
    }
}

}  // namespace ftlab

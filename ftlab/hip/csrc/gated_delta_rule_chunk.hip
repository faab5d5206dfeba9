// gated_delta_rule_chunk.hip — the gated delta rule's prefill in chunks of 64 tokens on the matrix cores
// (mma.h's 16 x 16 x 16 bf16 product, fp32 sums), for bf16 q, k, v and Dk <= 128.
// Contract: ftlab/ops/gated_delta_rule.py; reference: ftlab/reference/gated_delta_rule.py (the chunked form);
// the token-by-token scan of gated_delta_rule.hip takes every other case.
//
// Two launches (the first in gated_delta_rule_chunk_prep.hip; what both share in gated_delta_rule_chunk.h). Per
// chunk of 64 tokens, with c = cumsum g, rk / rq the norm factors (rq with the
// scale), G = K K^T and QK = Q K^T on the raw bf16 rows:
//   dn_chunk_prep_kernel  grid (NT, B * Hk * ceil(R / 4)), R = Hv / Hk, 256 threads, 57 KB LDS:
//     G and QK (exact bf16 products), then for each of up to four value heads of the key head
//       L = strictly lower (beta_i rk_i rk_j e^(c_i - c_j) G_ij), A = (I + L)^-1 by 16-row blocks
//     in fp32 FMAs, and writes ab = A diag(beta) [64][64], attn = lower (QK_ij rq_i rk_j
//     e^(c_i - c_j)) [64][64] (each as its three bf16 planes, split once here rather than in
//     each of the scan's column blocks) and the row factors sc[4][64]: fk = e^c rk, fq = e^c rq,
//     fx = rk e^(c_last - c), and e^c_last (sc[3][0]; the rest of row 3 zero).
//   dn_chunk_scan_kernel  grid (B * Hv, ceil(Dv / 32)), 256 threads, 61 KB LDS: the state slice
//     S [128 x 32] fp32 in MMA accumulators over all chunks, per chunk
//       P = K S, Qs = Q S          (K, Q exact in bf16; S in three bf16 planes: 3 products; one
//                                  plane, P = 1 below: 1 product, and so for every product)
//       R = V - fk P               (fp32)
//       X = ab R                   (both in three planes: 6 products)
//       O = fq Qs + attn X         (6 products), rounded once to bf16 -> o
//       S = e^c_last S + K^T (fx X) (3 products)
//     No per-chunk state, W, U or v_new goes to memory.
// Precision: an fp32 operand x is split into three bf16 parts, x = p0 + p1 + p2 + r with
// |r| <= 2^-24 |x| while the parts are normal numbers (each rounded to nearest even; the
// differences are exact in fp32; below ~1e-36 the parts go subnormal and r is absolute), so a
// product of such operands is within a few fp32 roundings of the fp32 product -- what tf32x3
// reaches, and what ftlab.testing.gated_delta_tolerance's chunked terms allow. Both kernels are
// templates on the planes P: 3 as above, or 1 (the "bf16" precision), where S, R, X, fx X, ab and
// attn are each rounded to bf16 once (relative error <= 2^-8) and every product is one MMA, as fla's
// chunk_gated_delta_rule computes with bf16 operands and fp32 sums (the state itself stays fp32);
// gated_delta_tolerance(operands="bf16") adds those roundings' terms.
// Keys past the sequence's end are zero rows (their beta and g zero), so they change nothing.
// Hostile decays as the reference computes them: g floored at -110 (ck_floor_g: a full forget
// still, without a chunk's cumulative sums losing the decays after it), and a NaN g kept in c but
// selected out of L and fk (ck_finite), so that it reaches o from its token on (through fq) and the
// state (through fx and e^c_last), never an earlier token through a zero coefficient.
#pragma once
#include "gated_delta_rule_chunk.h"

// RDNA's 256 VGPRs a lane do not hold what the other targets keep beside its WMMA fragments
// without spilling, so there (FTLAB_CK_LEAN 1) a chunk's K, Q, V and factors are loaded at the
// chunk's top rather than during the previous chunk's state update, ab's and attn's planes where
// they go to LDS rather than a phase before, and a thread's K / Q pieces run along a row rather
// than down the tokens (whose K^T stores are free of LDS bank conflicts on NVIDIA but cost VGPRs
// on RDNA). Host tests build it either way.
#if !defined(FTLAB_CK_LEAN)
#if defined(__GFX11__) || defined(__GFX12__)
#define FTLAB_CK_LEAN 1
#else
#define FTLAB_CK_LEAN 0
#endif
#endif

namespace ftlab {

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
static_assert(kCkScanLds <= 64 * 1024, "64 KB of LDS a block at most");

// q, k [B, T, Hk, Dk], v, o [B, T, Hv, Dv] bf16; ab, attn, sc from the prep; state [B, Hv, Dk, Dv]
// fp32, the initial state in, the final one out. P: the planes of ab, attn and the fp32 operands (3,
// or 1: each rounded to bf16 once -- fla's precision, ftlab.testing's bf16-operand bound).
template <int P>
__global__ void __launch_bounds__(kCkThreads)
    dn_chunk_scan_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                         const uint16_t* __restrict__ v, const uint16_t* __restrict__ ab,
                         const uint16_t* __restrict__ attn, const float* __restrict__ sc, float* __restrict__ state,
                         uint16_t* __restrict__ o, int tokens, int hk, int hv, int dk, int dv) {
  static_assert(P * kCkPlanes % (8 * kCkThreads) == 0, "the planes in whole 16-byte pieces a thread");
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
  auto put_s = [&]() {  // S^T [col][dk] in P planes
#pragma unroll
    for (int j = 0; j < kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e) {
        int r, c;
        s_rc(j, e, r, c);
        ck_putp<P>(ls + c * kLdK + r, kSPlane, s[j].v[e]);
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
  // A group's j-th P / Qs tile: half t / 8 of t = group + j groups (0: K's rows, 1: Q's), slot
  // u = t % 8; K row tile u % 4, Q row tile 3 - u or u - 4, column tile u / 4. So each group holds
  // K and Q tiles alike, and its share of O (attn X: rt + 1 products a tile) is the same in every
  // group of a wave64 block (its two Q tiles' row tiles sum to 3) and at most one tile's elsewhere.
  auto p_tile = [&](int j, bool& isq, int& rt, int& ct) {
    const int t = group + j * kCkGroups, u = t % 8;
    isq = t >= 8;
    rt = isq ? (u < 4 ? 3 - u : u - 4) : u % 4;
    ct = u / 4;
  };
  // A group's j-th X tile (j < 8 / groups): column tile t / 4 of t = group + j groups, row tile t % 4
  // or 3 - t % 4, so that a wave64 group's two tiles take 5 of X's 10 row-tile products (kb <= rt).
  auto x_tile = [&](int j, int& rt, int& ct) {
    const int t = group + j * kCkGroups;
    ct = t / 4;
    rt = ct == 0 ? t % 4 : 3 - t % 4;
  };
  // A chunk's operands from global memory, held in registers: the next chunk's are loaded while
  // this one's state update runs (every load of a chunk issued together, none waited on in a loop).
  const bool kq16 = ck_kq16(q, k, dk);
  const int clast = dv - 1 - col0, vstride = hv * dv;
  bytes16 kv[kCkKQ], qv[kCkKQ];
  float facv;
  uint16_t vb[kPTiles][kMmaAcc];
  // a thread's K / Q pieces: token r = e % 64 (the lanes of a group on consecutive tokens, so that
  // K^T's LDS stores below fall in distinct banks), elements d = 8 (e / 64) .. +7; lean: along rows
  auto kq_at = [&](int i, int& r, int& d) {
    const int e = tid + i * kCkThreads;
    r = FTLAB_CK_LEAN ? e / (kCkDk / 8) : e % kCk;
    d = 8 * (FTLAB_CK_LEAN ? e % (kCkDk / 8) : e / kCk);
  };
  auto load_chunk = [&](int n) {
    const int t0 = n * kCk, rlast = tokens - 1 - t0;
    const int64_t chunk = static_cast<int64_t>(bh) * nt + n;
#pragma unroll
    for (int i = 0; i < kCkKQ; ++i) {
      int r, d;
      kq_at(i, r, d);
      ck_load_kq(q, k, b, tokens, hk, kh, dk, t0, r, d, kq16, kv[i], qv[i]);
    }
    facv = sc[chunk * 4 * kCk + tid];  // 256 threads: the 4 x 64 factors
    // v's elements of R's tiles, or 0 past the sequence or the row: in-bounds loads masked by
    // bits, so that no lane masks stay live across them (wave64 keeps each in two SGPRs; NVIDIA
    // has predicates to spare, but the 32-bit offsets save registers there)
    const uint16_t* vrow = v + ((static_cast<int64_t>(b) * tokens + t0) * hv + h) * dv + col0;
#pragma unroll
    for (int j = 0; j < kPTiles; ++j) {
      bool isq;
      int rt, ct;
      p_tile(j, isq, rt, ct);
      if (isq) continue;  // a tile of Qs
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e) {
        const int r = 16 * rt + mma_row(e), c = 16 * ct + mma_col(e);
        const int out = (rlast - r) | (clast - c);  // negative when either is past
        vb[j][e] = vrow[ck_min(r, rlast) * vstride + ck_min(c, clast)] & static_cast<uint16_t>(~(out >> 31));
      }
    }
  };
  // ab's (attn's) P planes as the prep wrote them, 16 bytes a load, into LDS rows of kLdT
  bytes16 pv[kCkAB<P>];
  auto load_planes = [&](const uint16_t* src) {
#pragma unroll
    for (int i = 0; i < kCkAB<P>; ++i) pv[i] = reinterpret_cast<const bytes16*>(src)[tid + i * kCkThreads];
  };
  auto put_planes = [&]() {
#pragma unroll
    for (int i = 0; i < kCkAB<P>; ++i) {
      const int e = 8 * (tid + i * kCkThreads), plane = e / kCkPlanes, at = e % kCkPlanes;
      *reinterpret_cast<bytes16*>(la + plane * kAPlane + (at / kCk) * kLdT + at % kCk) = pv[i];
    }
  };
  MmaAcc small;  // the small products' sums of a tile (ck_mma_x3 / x6), folded in after its last
  ck_zero(small);
  if (!FTLAB_CK_LEAN) load_chunk(0);
  for (int n = 0; n < nt; ++n) {
    const int t0 = n * kCk;
    if (FTLAB_CK_LEAN) load_chunk(n);
    const int64_t chunk = static_cast<int64_t>(bh) * nt + n;
    if (!FTLAB_CK_LEAN) load_planes(ab + chunk * P * kCkPlanes);  // in flight through P and Qs
    // ---- phase 1: K and Q rows; P = K S, Qs = Q S
#pragma unroll
    for (int i = 0; i < kCkKQ; ++i) {
      int r, d;
      kq_at(i, r, d);
      *reinterpret_cast<bytes16*>(lk + r * kLdK + d) = kv[i];
      *reinterpret_cast<bytes16*>(lq + r * kLdK + d) = qv[i];
    }
    fac[tid / kCk][tid % kCk] = facv;
    __syncthreads();
    MmaAcc p[kPTiles];
#pragma unroll
    for (int j = 0; j < kPTiles; ++j) {
      ck_zero(p[j]);
      bool isq;
      int rt, ct;
      p_tile(j, isq, rt, ct);
      const uint16_t* arow = (isq ? lq : lk) + 16 * rt * kLdK;
#pragma unroll 2
      for (int kk = 0; kk < kCkDk; kk += 16)
        ck_mma_p<P>(p[j], small, arow + kk, kLdK, ls + 16 * ct * kLdK + kk, kLdK, kSPlane);
      ck_foldp<P>(p[j], small);
    }
    __syncthreads();
    // ---- phase 2: ab in planes; R = V - fk P in planes (R^T [col][token]); X = ab R
    if (FTLAB_CK_LEAN) load_planes(ab + chunk * P * kCkPlanes);
    put_planes();
    if (!FTLAB_CK_LEAN) load_planes(attn + chunk * P * kCkPlanes);  // in flight through X
#pragma unroll
    for (int j = 0; j < kPTiles; ++j) {
      bool isq;
      int rt, ct;
      p_tile(j, isq, rt, ct);
      if (isq) continue;
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e) {
        const int r = 16 * rt + mma_row(e), c = 16 * ct + mma_col(e);
        ck_putp<P>(lr + c * kLdT + r, kTPlane, port_bf16_to_float(vb[j][e]) - fac[0][r] * p[j].v[e]);
      }
    }
    __syncthreads();
    MmaAcc x[kXTiles];
#pragma unroll
    for (int j = 0; j < kXTiles; ++j) {
      ck_zero(x[j]);
      if (group + j * kCkGroups >= 8) continue;
      int rt, ct;
      x_tile(j, rt, ct);
#pragma unroll 1
      for (int kb = 0; kb <= rt; ++kb)
        ck_mma_pp<P>(x[j], small, la + 16 * rt * kLdT + 16 * kb, kLdT, kAPlane, lr + 16 * ct * kLdT + 16 * kb,
                     kLdT, kTPlane);
      ck_foldp<P>(x[j], small);
    }
    __syncthreads();
    // ---- phase 3: attn in planes, X and X~ = fx X in planes; O = fq Qs + attn X (in p)
    if (FTLAB_CK_LEAN) load_planes(attn + chunk * P * kCkPlanes);
    put_planes();
#pragma unroll
    for (int j = 0; j < kXTiles; ++j) {
      if (group + j * kCkGroups >= 8) continue;
      int rt, ct;
      x_tile(j, rt, ct);
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e) {
        const int r = 16 * rt + mma_row(e), c = 16 * ct + mma_col(e);
        ck_putp<P>(lr + c * kLdT + r, kTPlane, x[j].v[e]);
        ck_putp<P>(lxt + c * kLdT + r, kTPlane, fac[2][r] * x[j].v[e]);
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kPTiles; ++j) {
      bool isq;
      int rt, ct;
      p_tile(j, isq, rt, ct);
      if (!isq) continue;
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e) p[j].v[e] *= fac[1][16 * rt + mma_row(e)];
#pragma unroll 1
      for (int kb = 0; kb <= rt; ++kb)
        ck_mma_pp<P>(p[j], small, la + 16 * rt * kLdT + 16 * kb, kLdT, kAPlane, lr + 16 * ct * kLdT + 16 * kb,
                     kLdT, kTPlane);
      ck_foldp<P>(p[j], small);
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
#pragma unroll
    for (int i = 0; i < kCkKQ; ++i) {
      int r, d;
      kq_at(i, r, d);
      uint32_t w[4];
      words_of(kv[i], w);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        lkt[(d + 2 * m) * kLdT + r] = static_cast<uint16_t>(w[m]);
        lkt[(d + 2 * m + 1) * kLdT + r] = static_cast<uint16_t>(w[m] >> 16);
      }
    }
    if (!FTLAB_CK_LEAN && n + 1 < nt) load_chunk(n + 1);  // in flight through the state update below
    __syncthreads();
    const float el = fac[3][0];
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) {
      const int tile = group + j * kCkGroups, rt = tile % 8, ct = tile / 8;
#pragma unroll
      for (int e = 0; e < kMmaAcc; ++e) s[j].v[e] *= el;
#pragma unroll 2
      for (int kb = 0; kb < kCk; kb += 16)
        ck_mma_p<P>(s[j], small, lkt + 16 * rt * kLdT + kb, kLdT, lxt + 16 * ct * kLdT + kb, kLdT, kTPlane);
      ck_foldp<P>(s[j], small);
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

// the launcher's configurations, instantiated here so that a device-only build of this file has them
template __global__ void dn_chunk_scan_kernel<1>(const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                                                 const uint16_t*, const float*, float*, uint16_t*, int, int, int, int,
                                                 int);
template __global__ void dn_chunk_scan_kernel<3>(const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                                                 const uint16_t*, const float*, float*, uint16_t*, int, int, int, int,
                                                 int);

}  // namespace ftlab

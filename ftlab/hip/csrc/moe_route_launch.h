// moe_route_launch.h — host glue of the router kernels of moe_route.hip (route_topk, router_topk and
// the add_rmsnorm + router_topk launch). Included by moe_launch.hip inside its namespace ftlab, after
// its check helpers; not a translation unit of its own.
#pragma once

// The router's outputs for T tokens of E experts: logits [T, E] contiguous, weights fp32 and ids
// int32 [T, k], counters int32 [>= T]; 1 <= k <= min(E, 32), E <= kMaxExperts, T < 65536.
void check_router_outputs(const TensorView& logits, const TensorView& wts, const TensorView& ids,
                          const TensorView& counters, int64_t t, int64_t e, int64_t top_k) {
  check_contiguous(logits, "logits");
  TVM_FFI_CHECK(logits.ndim() == 2 && logits.size(0) == t && logits.size(1) == e, ValueError) << "logits must be [T, E]";
  TVM_FFI_CHECK(e >= 1 && e <= kMaxExperts, ValueError) << "the router takes 1 to " << kMaxExperts << " experts, got " << e;
  TVM_FFI_CHECK(top_k >= 1 && top_k <= e && top_k <= kMoeGroup, ValueError)
      << "top_k must be in [1, min(E, " << kMoeGroup << ")], got " << top_k;
  check_f32(wts, "weights");
  check_i32(ids, "ids");
  TVM_FFI_CHECK(wts.numel() == t * top_k && ids.numel() == t * top_k, ValueError) << "weights and ids must be [T, k]";
  check_contiguous(counters, "counters");
  TVM_FFI_CHECK(counters.dtype().code == kDLInt && counters.dtype().bits == 32 && counters.numel() >= t, TypeError)
      << "counters must be int32 with at least T entries";
  TVM_FFI_CHECK(t < 65536, ValueError) << "the router takes fewer than 65536 tokens a call, got " << t;
}

// What the router launches take of its outputs: the stream, weights, ids and counters, E, k and
// renorm as ints, the grid (ceil(E / 8), T).
struct RouterLaunch {
  port_stream_t st;
  float* wp;
  int32_t* ip;
  uint32_t* cp;
  int ke, kk, rn;
  dim3 grid;
};

RouterLaunch router_launch(const TensorView& wts, const TensorView& ids, const TensorView& counters, int64_t t,
                           int64_t e, int64_t top_k, bool renorm) {
  return {stream_of(wts), static_cast<float*>(base_of(wts)), static_cast<int32_t*>(base_of(ids)),
          static_cast<uint32_t*>(base_of(counters)), static_cast<int>(e), static_cast<int>(top_k), renorm ? 1 : 0,
          dim3(cdiv(e, kRouterRows), static_cast<unsigned>(t))};
}

// Whether v's base and its rows (stride elements of the given bytes) are 16-byte aligned.
bool rows16(const TensorView& v, int64_t stride, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(base_of(v)) % 16 == 0 && (stride * bytes) % 16 == 0;
}

// weights fp32 [T, k], ids int32 [T, k] = the top-k of softmax(logits [T, E]).
void moe_route_topk(TensorView logits, TensorView w, TensorView ids, int64_t top_k, bool renorm) {
  TVM_FFI_CHECK(logits.ndim() == 2 && (logits.size(1) <= 1 || logits.stride(1) == 1), ValueError)
      << "logits must be [T, E] with contiguous rows";
  const int64_t t = logits.size(0), e = logits.size(1);
  TVM_FFI_CHECK(e <= kMaxExperts, ValueError) << "the router takes at most " << kMaxExperts << " experts, got " << e;
  TVM_FFI_CHECK(top_k >= 1 && top_k <= e && top_k <= kMoeGroup, ValueError)
      << "top_k must be in [1, min(E, " << kMoeGroup << ")], got " << top_k;
  check_f32(w, "w");
  check_i32(ids, "ids");
  TVM_FFI_CHECK(w.numel() == t * top_k && ids.numel() == t * top_k, ValueError) << "w and ids must be [T, k]";
  if (t == 0) return;
  port_stream_t st = stream_of(w);
  float* wp = static_cast<float*>(base_of(w));
  int32_t* ip = static_cast<int32_t*>(base_of(ids));
  const int ke = static_cast<int>(e), kk = static_cast<int>(top_k), rn = renorm ? 1 : 0;
  switch (fp_of(logits, "logits")) {
#define FTLAB_ROUTE_CASE(F, T)                                                                              \
  case Fp::F:                                                                                               \
    if (e <= 4 * kMoeGroup) {                                                                               \
      moe_route_topk_kernel<T, 4><<<cdiv(t, kRouteTokens), kMoeThreads, 0, st>>>(                           \
          static_cast<const T::storage*>(base_of(logits)), logits.stride(0), wp, ip, t, ke, kk, rn);        \
    } else {                                                                                                \
      moe_route_topk_kernel<T, kMaxExperts / kMoeGroup><<<cdiv(t, kRouteTokens), kMoeThreads, 0, st>>>(     \
          static_cast<const T::storage*>(base_of(logits)), logits.stride(0), wp, ip, t, ke, kk, rn);        \
    }                                                                                                       \
    break;
    FTLAB_ROUTE_CASE(f32, f32_t)
    FTLAB_ROUTE_CASE(f16, f16_t)
    FTLAB_ROUTE_CASE(bf16, bf16_t)
#undef FTLAB_ROUTE_CASE
  }
  check_launch("moe_route_topk_kernel");
}

// logits [T, E] (x's dtype) = x [T, H] @ w [E, H]^T, and weights fp32 [T, k], ids int32 [T, k]
// = their top-k, in one launch; counters int32 [>= T] all 0 (the kernel leaves them 0).
void moe_router_topk(TensorView x, TensorView w, TensorView logits, TensorView wts, TensorView ids,
                     TensorView counters, int64_t top_k, bool renorm) {
  TVM_FFI_CHECK(x.ndim() == 2 && (x.size(1) <= 1 || x.stride(1) == 1), ValueError)
      << "x must be [T, H] with contiguous rows";
  TVM_FFI_CHECK(w.ndim() == 2 && (w.size(1) <= 1 || w.stride(1) == 1) && w.size(1) == x.size(1), ValueError)
      << "w must be [E, H] with contiguous rows and x's H";
  TVM_FFI_CHECK(fp_of(w, "w") == fp_of(x, "x") && fp_of(logits, "logits") == fp_of(x, "x"), TypeError)
      << "w and logits must have x's dtype";
  const int64_t t = x.size(0), h = x.size(1), e = w.size(0);
  check_router_outputs(logits, wts, ids, counters, t, e, top_k);
  if (t == 0) return;
  const auto [st, wp, ip, cp, ke, kk, rn, grid] = router_launch(wts, ids, counters, t, e, top_k, renorm);
  switch (fp_of(x, "x")) {
#define FTLAB_ROUTER_CASE(F, T)                                                                             \
  case Fp::F: {                                                                                             \
    const int64_t eb = sizeof(T::storage);                                                                  \
    const bool vec = h % 8 == 0 && rows16(x, x.stride(0), eb) && rows16(w, w.stride(0), eb);              \
    const auto* xp = static_cast<const T::storage*>(base_of(x));                                            \
    const auto* wq = static_cast<const T::storage*>(base_of(w));                                            \
    auto* lp = static_cast<T::storage*>(base_of(logits));                                                   \
    if (e <= 4 * kMoeGroup) {                                                                               \
      launch_pdl(moe_router_topk_kernel<T, 4>, grid, dim3(kMoeThreads), st, xp, x.stride(0), wq, w.stride(0), \
                 h, lp, wp, ip, cp, ke, kk, rn, vec);                                                       \
    } else {                                                                                                \
      launch_pdl(moe_router_topk_kernel<T, kMaxExperts / kMoeGroup>, grid, dim3(kMoeThreads), st, xp,        \
                 x.stride(0), wq, w.stride(0), h, lp, wp, ip, cp, ke, kk, rn, vec);                         \
    }                                                                                                       \
    break;                                                                                                  \
  }
    FTLAB_ROUTER_CASE(f32, f32_t)
    FTLAB_ROUTER_CASE(f16, f16_t)
    FTLAB_ROUTER_CASE(bf16, bf16_t)
#undef FTLAB_ROUTER_CASE
  }
  check_launch("moe_router_topk_kernel");
}

// add_rmsnorm then router_topk in one launch: s = x + residual and y = RMSNorm(s) * norm_w (each
// [T, H] contiguous, x's dtype; add_rmsnorm's bits), then logits [T, E] = y @ w^T, weights fp32 and
// ids int32 [T, k] as moe_router_topk computes them from y. x and residual [T, H] with contiguous
// rows; every row, the weights and s / y 16-byte aligned; H a multiple of 16 bytes' elements, at
// most kNormThreads * kNormCache of them times that (ftlab/hip/moe.py checks before it calls).
void moe_norm_router_topk(TensorView x, TensorView res, TensorView norm_w, TensorView s, TensorView y, double eps,
                          TensorView w, TensorView logits, TensorView wts, TensorView ids, TensorView counters,
                          int64_t top_k, bool renorm) {
  const Fp fp = fp_of(x, "x");
  for (const TensorView* v : {&res, &norm_w, &s, &y, &w, &logits})
    TVM_FFI_CHECK(fp_of(*v, "operand") == fp, TypeError) << "every float operand must have x's dtype";
  TVM_FFI_CHECK(x.ndim() == 2 && res.ndim() == 2 && res.size(0) == x.size(0) && res.size(1) == x.size(1), ValueError)
      << "x and residual must be [T, H]";
  const int64_t t = x.size(0), h = x.size(1), e = w.ndim() == 2 ? w.size(0) : 0;
  const int64_t elems = 16 / static_cast<int64_t>(fp == Fp::f32 ? 4 : 2);
  const int64_t eb = fp == Fp::f32 ? 4 : 2;
  TVM_FFI_CHECK((h <= 1 || (x.stride(1) == 1 && res.stride(1) == 1)) && h % elems == 0 &&
                    h <= static_cast<int64_t>(kNormThreads) * kNormCache * elems && rows16(x, x.stride(0), eb) &&
                    rows16(res, res.stride(0), eb),
                ValueError)
      << "x and residual must have 16-byte aligned contiguous rows of H a multiple of " << elems << ", at most "
      << static_cast<int64_t>(kNormThreads) * kNormCache * elems;
  for (const TensorView* v : {&s, &y}) {
    check_contiguous(*v, "s / y");
    TVM_FFI_CHECK(v->ndim() == 2 && v->size(0) == t && v->size(1) == h && rows16(*v, h, eb), ValueError)
        << "s and y must be contiguous [T, H], 16-byte aligned";
  }
  check_contiguous(norm_w, "norm weight");
  TVM_FFI_CHECK(norm_w.numel() == h && rows16(norm_w, 0, eb), ValueError) << "the norm weight must be [H], aligned";
  TVM_FFI_CHECK(w.ndim() == 2 && (h <= 1 || w.stride(1) == 1) && w.size(1) == h, ValueError)
      << "w must be [E, H] with contiguous rows and x's H";
  check_router_outputs(logits, wts, ids, counters, t, e, top_k);
  if (t == 0) return;
  const auto [st, wp, ip, cp, ke, kk, rn, grid] = router_launch(wts, ids, counters, t, e, top_k, renorm);
  const float fe = static_cast<float>(eps);
  const bool vec = h % 8 == 0 && rows16(w, w.stride(0), eb);  // y (LDS) is aligned: moe_router_topk's test on w
  switch (fp) {
#define FTLAB_NORM_ROUTER_CASE(F, T, V)                                                                       \
  case Fp::F: {                                                                                               \
    typedef T::storage S;                                                                                     \
    const S* xp = static_cast<const S*>(base_of(x));                                                          \
    const S* rp = static_cast<const S*>(base_of(res));                                                        \
    const S* np = static_cast<const S*>(base_of(norm_w));                                                     \
    S* sp = static_cast<S*>(base_of(s));                                                                      \
    S* yp = static_cast<S*>(base_of(y));                                                                      \
    const S* wq = static_cast<const S*>(base_of(w));                                                          \
    S* lp = static_cast<S*>(base_of(logits));                                                                 \
    if (e <= 4 * kMoeGroup) {                                                                                 \
      launch_pdl(moe_norm_router_topk_kernel<T, V, 4>, grid, dim3(kMoeThreads), st, xp, x.stride(0), rp,       \
                 res.stride(0), np, sp, yp, fe, wq, w.stride(0), h, lp, wp, ip, cp, ke, kk, rn, vec);           \
    } else {                                                                                                  \
      launch_pdl(moe_norm_router_topk_kernel<T, V, kMaxExperts / kMoeGroup>, grid, dim3(kMoeThreads), st, xp,  \
                 x.stride(0), rp, res.stride(0), np, sp, yp, fe, wq, w.stride(0), h, lp, wp, ip, cp, ke, kk, rn, \
                 vec);                                                                                        \
    }                                                                                                         \
    break;                                                                                                    \
  }
    FTLAB_NORM_ROUTER_CASE(f32, f32_t, 4)
    FTLAB_NORM_ROUTER_CASE(f16, f16_t, 8)
    FTLAB_NORM_ROUTER_CASE(bf16, bf16_t, 8)
#undef FTLAB_NORM_ROUTER_CASE
  }
  check_launch("moe_norm_router_topk_kernel");
}

"""qk_norm_rope (docs/OPS.md section 5): Qwen3's per-head q/k RMSNorm and RoPE in one pass."""

from __future__ import annotations

import math

import torch

from ftlab import argcheck, backends


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    *,
    rotary_dim: int | None = None,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    slots: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's per-head RMSNorm of q and k followed by RoPE, one pass over both.

    ``q [N, Hq, D]`` and ``k [N, Hk, D]`` (fp32 / fp16 / bf16, one dtype; the views of a fused
    q/k/v projection are taken as they are: any token stride, contiguous heads), ``q_weight`` /
    ``k_weight [D]``, ``rotary_dim`` R (even, in [2, D]; None: R = D, then D must be even),
    ``cos`` / ``sin [N, R]`` (or any shape of N * R elements, e.g. ``[B, T, 1, R]``) from
    ``ftlab.models.layers.rope_tables(positions, R, ...)``: ``sin`` is signed, -sin on the
    first half. Each row: ``y = x / sqrt(mean(x^2) + eps) * weight`` over all D, then ``out[d] =
    y[d] * cos[d] + y[(d + R/2) % R] * sin[d]`` for d < R (partial rotary: Qwen3-Next, Qwen3.5)
    and ``out[d] = y[d]`` for d >= R, in fp32, rounded once. Returns new contiguous
    ``(q_out [N, Hq, D], k_out [N, Hk, D])`` in q's dtype. Weights and tables of another float
    dtype are cast to q's.

    The KV cache in the same pass (a decode step's store without a launch of its own): give all
    of ``k_cache [S, Hk * D]``, ``v_cache [S, W]`` (q's dtype and device, contiguous rows, any
    row stride), ``slots [N]`` (int32 / int64) and ``v`` (``[N, ...]`` of W elements a token:
    ``[N, W]`` or ``[N, Hv, Dv]``, e.g. the v view of the fused projection). Then, as
    ``store(k_cache, v_cache, slots, k_out.reshape(N, -1), v.reshape(N, -1), check=False)``:
    ``k_cache[slots[n]] = k_out[n]`` and ``v_cache[slots[n]] = v[n]``, bit for bit; a slot of -1
    or outside ``[0, S)`` writes nothing (slots are not read on the host, so this works inside
    graph capture); two tokens with one slot leave either's rows. No other cache row is touched.

    ``validate=False`` skips the argument checks (the caller vouches for them, as the models do:
    a :class:`~ftlab.models.DecodePlan`'s ``checks``); the backends still refuse layouts they cannot
    read.
    """
    if validate:
        rot, eps = _checks(q, k, q_weight, k_weight, cos, sin, eps, rotary_dim)
        cache = _cache_args(q, k, k_cache, v_cache, slots, v)
    n, _, d = q.shape
    if not validate:
        rot = d if rotary_dim is None else rotary_dim
        cache = (
            None if k_cache is None else (k_cache, v_cache, slots.contiguous(), _value_rows(v, n))
        )
    rows = [
        _rows(t, shape, q.dtype)
        for t, shape in ((q_weight, (d,)), (k_weight, (d,)), (cos, (n, rot)), (sin, (n, rot)))
    ]

    # contiguous heads and elements, any token stride
    def rows_layout(
        t: torch.Tensor,
    ) -> torch.Tensor:
        return t if t.stride(2) == 1 and (t.shape[1] <= 1 or t.stride(1) == d) else t.contiguous()

    impl = backends.resolve("qk_norm_rope", backend, q.device, q.dtype)
    if cache is None:  # a registered backend may not take a cache
        return impl.fn(rows_layout(q), rows_layout(k), *rows, eps, rot)
    return impl.fn(rows_layout(q), rows_layout(k), *rows, eps, rot, cache=cache)


def _rows(t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a contiguous tensor of ``shape`` and ``dtype`` (no copy when it is one)."""
    if t.shape != shape:
        t = t.reshape(shape)
    if t.dtype != dtype:
        t = t.to(dtype)
    return t if t.is_contiguous() else t.contiguous()


def _value_rows(v: torch.Tensor, n: int) -> torch.Tensor:
    """``v [N, ...]`` as ``[N, W]`` with unit element stride (no copy when it has one)."""
    v2 = v.reshape(n, math.prod(v.shape[1:]))  # (N = 0: -1 cannot be inferred)
    return v2.contiguous() if v2.shape[1] > 1 and v2.stride(1) != 1 else v2


def _checks(
    q: object,
    k: object,
    q_weight: object,
    k_weight: object,
    cos: object,
    sin: object,
    eps: object,
    rotary_dim: object,
) -> tuple[int, float]:
    """qk_norm_rope's argument checks (each error names the argument): (rotary dim, eps)."""
    argcheck.float_tensor("q", q)
    argcheck.float_tensor("k", k)
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [N, heads, D], got shape {tuple(t.shape)}")
    n, _, d = q.shape
    if rotary_dim is None:
        if d % 2 or d == 0:
            raise ValueError(f"q's head size D must be even and positive, got {d}")
        rot = d
    else:
        rot = argcheck.int_in("rotary_dim", rotary_dim, 2, max(d, 2))
        if rot % 2:
            raise ValueError(f"rotary_dim must be even, got {rot}")
    if k.shape[0] != n or k.shape[2] != d:
        raise ValueError(f"k must be [{n}, Hk, {d}] like q {tuple(q.shape)}, got {tuple(k.shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    eps = argcheck.finite_float("eps", eps, 0.0)
    for name, t, shape in (
        ("q_weight", q_weight, (d,)),
        ("k_weight", k_weight, (d,)),
        ("cos", cos, (n, rot)),
        ("sin", sin, (n, rot)),
    ):
        argcheck.float_tensor(name, t)
        want = shape[0] * shape[-1] if len(shape) == 2 else d
        if t.numel() != want:
            what = ("N * D" if rot == d else "N * rotary_dim") if len(shape) == 2 else "D"
            raise ValueError(
                f"{name} must hold {want} elements ({what}), got shape {tuple(t.shape)}"
            )
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if k.device != q.device:
        raise ValueError(f"k must be on q's device {q.device}, got {k.device}")
    return rot, eps


def _cache_args(
    q: torch.Tensor, k: torch.Tensor, k_cache: object, v_cache: object, slots: object, v: object
) -> tuple | None:
    """None without a cache, else ``(k_cache, v_cache, slots, v [N, W])`` checked (every error
    names the argument)."""
    given = {"k_cache": k_cache, "v_cache": v_cache, "slots": slots, "v": v}
    if all(t is None for t in given.values()):
        return None
    missing = [name for name, t in given.items() if t is None]
    if missing:
        raise ValueError(
            f"k_cache, v_cache, slots and v go together: {', '.join(missing)} not given"
        )
    for name, t in given.items():
        argcheck.tensor(name, t)
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    n, hk, d = k.shape
    for name in ("k_cache", "v_cache", "v"):
        if given[name].dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {given[name].dtype}")
    if v.dim() < 2 or v.shape[0] != n:
        raise ValueError(f"v must be [N={n}, ...] (a token's W values), got shape {tuple(v.shape)}")
    v2 = _value_rows(v, n)
    argcheck.rows("k_cache", k_cache)
    argcheck.rows("v_cache", v_cache)
    if k_cache.shape[1] != hk * d:
        raise ValueError(
            f"k_cache must be [S, Hk * D = {hk * d}] (k is {tuple(k.shape)}), got "
            f"{tuple(k_cache.shape)}"
        )
    if tuple(v_cache.shape) != (k_cache.shape[0], v2.shape[1]):
        raise ValueError(
            f"v_cache must be [S = {k_cache.shape[0]} (k_cache's slots), W = {v2.shape[1]} (v's "
            f"values a token)], got {tuple(v_cache.shape)}"
        )
    argcheck.index_vector("slots", slots)
    if slots.shape[0] != n:
        raise ValueError(f"slots must be [N = {n}], got shape {tuple(slots.shape)}")
    return k_cache, v_cache, slots.contiguous(), v2

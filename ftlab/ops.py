"""The public ops. Each validates its arguments, routes to a backend, and calls it.

Validation happens here, once, before any backend runs, so every backend path rejects
the same bad input with the same message, and a rejected call has written nothing.
"""

from __future__ import annotations

import os

import torch

from ftlab import argcheck, backends
from ftlab.quant import Q8_1, QK, Q4_0Weight


def index(
    weights: torch.Tensor,
    indices: torch.Tensor,
    *,
    mask: tuple[int, int] | None = None,
    out: torch.Tensor | None = None,
    check: bool = True,
    backend: str = "auto",
) -> torch.Tensor:
    """Gather rows: ``out[i] = weights[indices[i]]`` (embedding lookup, KV-cache read).

    Args:
        weights: ``[N, D]`` fp32 / fp16 / bf16 / fp8-e4m3; rows contiguous, row stride may
            exceed D.
        indices: ``[L]`` int32 or int64. Duplicates are allowed.
        mask: ``(start, length)`` for a vocab-parallel shard: ``pos = indices[i] - start``;
            rows with ``pos`` outside ``[0, length)`` are zero, the others read
            ``weights[pos]``. ``length`` must not exceed N.
        out: optional ``[L, D]`` output of the weights' dtype and device.
        check: verify (on the host) that every index is in ``[0, N)`` when no mask is
            given. ``check=False`` skips the host read (required inside graph capture);
            the GPU kernels then zero-fill out-of-range rows rather than read outside
            ``weights``, but that is not the contract.
        backend: ``"auto"``, ``"reference"``, ``"triton"``, ``"hip"`` or a registered name.

    Returns:
        ``out``, ``[L, D]``, bit-identical in every backend.
    """
    argcheck.tensor("weights", weights)
    argcheck.tensor("indices", indices)
    argcheck.rows("weights", weights)
    argcheck.dtype_in("weights", weights, backends.COPY_DTYPES)
    argcheck.index_vector("indices", indices)
    argcheck.same_device("indices", indices, "weights", weights)
    n, d = weights.shape
    length = indices.shape[0]
    if out is None:
        out = torch.empty((length, d), dtype=weights.dtype, device=weights.device)
    else:
        argcheck.tensor("out", out)
        argcheck.shape("out", out, (length, d))
        argcheck.same_dtype("out", out, "weights", weights)
        argcheck.same_device("out", out, "weights", weights)
        argcheck.rows("out", out)
    if mask is not None:
        if len(mask) != 2 or not all(isinstance(m, int) for m in mask):
            raise TypeError(f"mask must be a pair of ints (start, length), got {mask!r}")
        start, mask_len = mask
        if mask_len < 0 or mask_len > n:
            raise ValueError(f"mask length must be in [0, {n}] (weights rows), got {mask_len}")
    else:
        start, mask_len = 0, -1
        if check and length:
            argcheck.data_checks_allowed("index")
            bad = (indices < 0) | (indices >= n)
            if bool(bad.any()):
                i = argcheck.first_position(bad)
                raise IndexError(
                    f"indices must be in [0, {n}) (weights rows), got indices[{i}] = {int(indices[i])}"
                )
    impl = backends.resolve("index", backend, weights.device, weights.dtype)
    if length and d:
        impl.fn(weights, indices, out, start, mask_len)
    return out


def store(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    check: bool = True,
    backend: str = "auto",
) -> None:
    """Scatter rows into a KV cache in place: ``k_cache[indices[i]] = k[i]``, same for v.

    Args:
        k_cache, v_cache: ``[S, Dk]`` and ``[S, Dv]`` (a paged cache viewed as
            ``[num_slots, D]``); rows contiguous, row stride may exceed D.
        indices: ``[L]`` int32 or int64 slots; ``-1`` skips token i (padding). Slots must
            be unique and in ``[0, S)``.
        k, v: ``[L, Dk]`` and ``[L, Dv]``, rows contiguous; all four tensors share one dtype
            (fp32 / fp16 / bf16 / fp8-e4m3) and device.
        check: verify on the host that slots are in range and unique; with
            ``check=False`` (needed inside graph capture) the kernels skip out-of-range
            slots, and duplicate slots give a scheduling-dependent result.
        backend: ``"auto"``, ``"reference"``, ``"triton"``, ``"hip"`` or a registered name.

    Every row not named by ``indices`` is untouched, bit for bit. A call that raises has
    written nothing.
    """
    for name, t in (
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("indices", indices),
        ("k", k),
        ("v", v),
    ):
        argcheck.tensor(name, t)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        argcheck.rows(name, t)
    argcheck.dtype_in("k_cache", k_cache, backends.COPY_DTYPES)
    for name, t in (("v_cache", v_cache), ("k", k), ("v", v)):
        argcheck.same_dtype(name, t, "k_cache", k_cache)
    for name, t in (("v_cache", v_cache), ("indices", indices), ("k", k), ("v", v)):
        argcheck.same_device(name, t, "k_cache", k_cache)
    argcheck.index_vector("indices", indices)
    slots = k_cache.shape[0]
    if v_cache.shape[0] != slots:
        raise ValueError(
            f"v_cache must have as many slots as k_cache ({slots}), got {v_cache.shape[0]}"
        )
    length = indices.shape[0]
    argcheck.shape("k", k, (length, k_cache.shape[1]))
    argcheck.shape("v", v, (length, v_cache.shape[1]))
    if check and length:
        argcheck.data_checks_allowed("store")
        bad = (indices < -1) | (indices >= slots)
        if bool(bad.any()):
            i = argcheck.first_position(bad)
            raise IndexError(
                f"indices must be -1 (skip) or in [0, {slots}) (cache slots), "
                f"got indices[{i}] = {int(indices[i])}"
            )
        used = indices[indices >= 0]
        ordered = used.sort().values
        dup = ordered[1:] == ordered[:-1]
        if bool(dup.any()):
            slot = int(ordered[1:][dup][0])
            raise ValueError(
                f"indices must be unique (apart from -1), got slot {slot} more than once"
            )
    impl = backends.resolve("store", backend, k_cache.device, k_cache.dtype)
    if length:
        impl.fn(k_cache, v_cache, indices, k, v)


# ------------------------------------------------------------------ GGUF Q4_0 (OPS.md section 2)


def _float_tensor(name: str, t: object) -> torch.Tensor:
    argcheck.tensor(name, t)
    argcheck.dtype_in(name, t, backends.FLOAT_DTYPES)
    return t


def _q4_0_weight(name: str, w: object) -> Q4_0Weight:
    if not isinstance(w, Q4_0Weight):
        raise TypeError(f"{name} must be a ftlab.quant.Q4_0Weight, got {type(w).__name__}")
    return w


def quantize_q4_0(w: torch.Tensor, *, backend: str = "auto") -> Q4_0Weight:
    """Quantize ``w [..., N, K]`` (fp32/fp16/bf16, K % 32 == 0) to GGUF Q4_0 blocks.

    Byte-identical to ``gguf.quants.quantize(w, GGMLQuantizationType.Q4_0)`` in every
    backend. Returns a :class:`~ftlab.quant.Q4_0Weight` on w's device.
    """
    _float_tensor("w", w)
    if w.dim() < 2 or w.shape[-1] % QK:
        raise ValueError(
            f"w must be [..., N, K] with K a multiple of {QK}, got shape {tuple(w.shape)}"
        )
    impl = backends.resolve("quantize_q4_0", backend, w.device, w.dtype)
    return impl.fn(w.contiguous())


def dequantize_q4_0(
    w: Q4_0Weight, dtype: torch.dtype = torch.float32, *, backend: str = "auto"
) -> torch.Tensor:
    """``[..., N, K]`` values ``d * (q - 8)`` of a Q4_0Weight, in ``dtype`` (fp32/fp16/bf16).

    Exact in fp32 (an fp16 scale times a small integer), hence bit-identical across
    backends; fp16/bf16 outputs are that value rounded to nearest even.
    """
    _q4_0_weight("w", w)
    if dtype not in backends.FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    impl = backends.resolve("dequantize_q4_0", backend, w.device, dtype)
    return impl.fn(w, dtype)


def quantize_q8_1(x: torch.Tensor, *, backend: str = "auto") -> Q8_1:
    """Q8_1 activations of ``x [M, K]`` (fp32/fp16/bf16, K % 32 == 0): per 32-block
    ``d = amax / 127``, ``q = round(x / d)`` (halves away from zero), ``s = d * sum(q)``."""
    _float_tensor("x", x)
    if x.dim() != 2 or x.shape[1] % QK:
        raise ValueError(f"x must be [M, K] with K a multiple of {QK}, got shape {tuple(x.shape)}")
    impl = backends.resolve("quantize_q8_1", backend, x.device, x.dtype)
    return impl.fn(x if x.shape[1] <= 1 or x.stride(1) == 1 else x.contiguous())


def q4_0_path(impl: backends.Impl, rows: int, path: str) -> str:
    """The Q4_0 path ``impl`` takes (q4_0_matmul, and moe_experts on Q4_0 banks): ``"int8"``
    for up to 8 rows (tokens), else the backend's prefill path (reference, triton:
    ``"dequant"``; hip: ``"int8"``)."""
    paths = impl.info.get("paths", ("int8", "dequant"))
    if path == "auto":
        path = "int8" if rows <= backends.DECODE_MAX_TOKENS else impl.info.get("prefill", paths[0])
    if path not in ("int8", "dequant"):
        raise ValueError(f"path must be 'auto', 'int8' or 'dequant', got {path!r}")
    if path not in paths:
        raise backends.BackendUnavailable(
            f"{impl.op}: backend {impl.backend!r} implements the {' and '.join(paths)} path(s) for Q4_0 weights, "
            f"not {path!r}"
        )
    return path


def _auto_with_path(x: torch.Tensor, path: str, first: backends.Impl) -> backends.Impl:
    """``backend="auto"`` with a path the preferred backend lacks (HIP has no dequant path):
    the next available backend, in auto order, that has it."""
    available = backends.available_backends("q4_0_matmul", x.device, x.dtype)
    for name in [n for n in backends.AUTO_ORDER_GPU if n in available]:
        impl = backends.resolve("q4_0_matmul", name, x.device, x.dtype)
        if impl.auto and path in impl.info.get("paths", (path,)):
            return impl
    return first


def q4_0_matmul(
    x: torch.Tensor, w: Q4_0Weight, *, path: str = "auto", backend: str = "auto"
) -> torch.Tensor:
    """``x [M, K] @ W.T -> [M, N]`` for Q4_0 weights ``W [N, K]``, in x's dtype.

    Paths (OPS.md section 2):
      ``"int8"``: x is quantized to Q8_1; per block ``d4 * (d8 * sum(q4 * q8) - 8 * s8)``
      with an exact integer dot (dp4a / sudot4 / sdot4), summed in fp32. Backends agree
      to fp32 rounding: ``|y - y_ref| <= (K/32 + 4) * eps32 * sum_b |d4| (|d8 sumi| + 8 |s8|)``
      (see ``ftlab.testing.matmul_tolerance``).
      ``"dequant"``: ``x @ dequantize(W).T`` with the weights rounded to x's dtype in the
      tile (Triton) -- within one rounding of each weight of the fp32 result.
      ``"auto"``: int8 for M <= 8 (decode); for more rows the backend's prefill path.
    With ``backend="auto"`` and an explicit path, the first backend in auto order that
    implements that path serves the call.

    x may be non-contiguous (row stride > K); fp32 / fp16 / bf16.
    """
    _float_tensor("x", x)
    _q4_0_weight("w", w)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if len(w.shape) != 2:
        raise ValueError(f"w must be a 2-D Q4_0Weight [N, K], got shape {tuple(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(
            f"x must have K = {w.shape[1]} columns (w is {tuple(w.shape)}), got {x.shape[1]}"
        )
    if x.device != w.device:
        raise ValueError(f"x must be on the device of w ({w.device}), got {x.device}")
    impl = backends.resolve("q4_0_matmul", backend, x.device, x.dtype)
    if path in ("int8", "dequant") and path not in impl.info.get("paths", (path,)):
        if backend == "auto" and not os.environ.get("FTLAB_BACKEND"):
            impl = _auto_with_path(x, path, impl)
    chosen = q4_0_path(impl, x.shape[0], path)
    if x.shape[0] == 0 or w.shape[0] == 0:
        return torch.zeros((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.contiguous()
    return impl.fn(x, w, chosen)


# ------------------------------------------------------------------ routed MoE (OPS.md section 3)


def route_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool = True, *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router of Qwen3-MoE: ``logits [T, E]`` (fp32/fp16/bf16) -> (weights fp32 ``[T, k]``,
    ids int32 ``[T, k]``). Softmax over all E in fp32, the k largest (ties: the lower expert
    id first), renormalized to sum 1 when ``renormalize`` (Qwen3's ``norm_topk_prob``)."""
    _float_tensor("logits", logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [T, E], got shape {tuple(logits.shape)}")
    if not isinstance(top_k, int) or not 1 <= top_k <= logits.shape[1]:
        raise ValueError(f"top_k must be an int in [1, {logits.shape[1]}] (E), got {top_k!r}")
    impl = backends.resolve("route_topk", backend, logits.device, logits.dtype)
    return impl.fn(logits, top_k, renormalize)


def moe_align(
    ids: torch.Tensor, num_experts: int, block_m: int, *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group the (token, slot) pairs of ``ids [T, k]`` by expert for a grouped GEMM.

    Returns ``sorted_token_ids`` int32 ``[capacity]`` (flat pair index ``t * k + j``, groups
    in expert order, pairs in flat order within a group, each group padded to a multiple of
    ``block_m`` with the sentinel ``T * k``), ``expert_ids`` int32 ``[capacity / block_m]``
    (-1 past the end) and ``num_tokens_post_padded`` int32 ``[1]``. ``capacity`` is the static
    bound :func:`ftlab.reference.moe.align_capacity`. Ids outside ``[0, E)`` are skipped.
    """
    argcheck.tensor("ids", ids)
    argcheck.dtype_in("ids", ids, argcheck.INDEX_DTYPES)
    if ids.dim() != 2:
        raise ValueError(f"ids must be 2-D [T, k], got shape {tuple(ids.shape)}")
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    if not isinstance(block_m, int) or block_m < 1:
        raise ValueError(f"block_m must be a positive int, got {block_m!r}")
    impl = backends.resolve("moe_align", backend, ids.device, None)
    return impl.fn(ids, num_experts, block_m)


def _bank(name: str, w: object) -> tuple[int, ...]:
    if isinstance(w, Q4_0Weight):
        shape = tuple(w.shape)
    elif isinstance(w, torch.Tensor):
        argcheck.dtype_in(name, w, backends.FLOAT_DTYPES)
        shape = tuple(w.shape)
    else:
        raise TypeError(f"{name} must be a tensor or a Q4_0Weight bank, got {type(w).__name__}")
    if len(shape) != 3:
        raise ValueError(f"{name} must be an expert bank [E, N, K], got shape {shape}")
    return shape


def moe_experts(
    x: torch.Tensor,
    w_gate_up: torch.Tensor | Q4_0Weight,
    w_down: torch.Tensor | Q4_0Weight,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    path: str = "auto",
    backend: str = "auto",
) -> torch.Tensor:
    """SwiGLU experts: ``y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))``.

    x ``[T, H]`` fp32/fp16/bf16; ``w_gate_up [E, 2I, H]`` (gate rows, then up rows) and
    ``w_down [E, H, I]``, dense (x's dtype family) or Q4_0Weight banks; ``topk_weights``
    fp32 ``[T, k]``; ``topk_ids`` int32/int64 ``[T, k]`` -- ids outside ``[0, E)``, -1 in
    particular, contribute nothing. Returns ``[T, H]`` in x's dtype.

    ``path`` applies to Q4_0 banks, as in :func:`q4_0_matmul`: ``"int8"`` (x and the SwiGLU
    output h quantized to Q8_1, int8 block dots), ``"dequant"`` (weights dequantized; a
    backend may round them, and h, to x's dtype for its matrix units), ``"auto"`` (int8
    for up to 8 tokens, else the backend's prefill path: reference and triton ``"dequant"``,
    hip ``"int8"``). Dense banks ignore it. The routing weight multiplies each expert's
    down output before the sum over the k slots, in every backend.
    """
    _float_tensor("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [T, H], got shape {tuple(x.shape)}")
    e, two_i, h = _bank("w_gate_up", w_gate_up)
    e2, h2, i = _bank("w_down", w_down)
    if (e2, h2, 2 * i) != (e, x.shape[1], two_i) or h != x.shape[1]:
        raise ValueError(
            f"banks must be w_gate_up [E, 2I, H] and w_down [E, H, I] with H = {x.shape[1]}, "
            f"got {tuple(w_gate_up.shape)} and {tuple(w_down.shape)}"
        )
    argcheck.tensor("topk_weights", topk_weights)
    argcheck.tensor("topk_ids", topk_ids)
    argcheck.dtype_in("topk_ids", topk_ids, argcheck.INDEX_DTYPES)
    if topk_weights.dtype != torch.float32:
        raise TypeError(f"topk_weights must be float32, got {topk_weights.dtype}")
    if (
        topk_ids.dim() != 2
        or topk_ids.shape[0] != x.shape[0]
        or topk_weights.shape != topk_ids.shape
    ):
        raise ValueError(
            f"topk_weights and topk_ids must both be [T, k] with T = {x.shape[0]}, "
            f"got {tuple(topk_weights.shape)} and {tuple(topk_ids.shape)}"
        )
    for name, t in (("w_gate_up", w_gate_up), ("w_down", w_down), ("topk_weights", topk_weights),
                    ("topk_ids", topk_ids)):  # fmt: skip
        if t.device != x.device:
            raise ValueError(f"{name} must be on the device of x ({x.device}), got {t.device}")
    impl = backends.resolve("moe_experts", backend, x.device, x.dtype)
    if isinstance(w_gate_up, Q4_0Weight):
        path = q4_0_path(impl, x.shape[0], path)
    elif path not in ("auto", "dequant", "int8"):
        raise ValueError(f"path must be 'auto', 'dequant' or 'int8', got {path!r}")
    return impl.fn(x, w_gate_up, w_down, topk_weights, topk_ids, path)


def fused_moe(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    w_gate_up: torch.Tensor | Q4_0Weight,
    w_down: torch.Tensor | Q4_0Weight,
    top_k: int,
    renormalize: bool = True,
    *,
    path: str = "auto",
    backend: str = "auto",
) -> torch.Tensor:
    """One Qwen3-MoE layer's experts: :func:`route_topk` then :func:`moe_experts`.

    x ``[T, H]``, router_logits ``[T, E]`` -> ``[T, H]`` in x's dtype."""
    weights, ids = route_topk(router_logits, top_k, renormalize, backend=backend)
    return moe_experts(x, w_gate_up, w_down, weights, ids, path=path, backend=backend)


# ------------------------------------------------------------------ attention (OPS.md section 5)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, eps: float, *, backend: str = "auto"
                 ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Qwen3's per-head RMSNorm of q and k followed by RoPE, one pass over both.

    ``q [N, Hq, D]`` and ``k [N, Hk, D]`` (fp32 / fp16 / bf16, one dtype; D even; the views of
    a fused q/k/v projection are taken as they are: any token stride, contiguous heads),
    ``q_weight`` / ``k_weight [D]``, ``cos`` / ``sin [N, D]`` (or any shape of N * D elements,
    e.g. ``[B, T, 1, D]``) from ``ftlab.models.qwen3_moe.rope_tables``: ``sin`` is signed, -sin on
    the first half. Each row: ``y = x / sqrt(mean(x^2) + eps) * weight``, then ``out[d] =
    y[d] * cos[d] + y[(d + D/2) % D] * sin[d]``, in fp32, rounded once. Returns new contiguous
    ``(q_out [N, Hq, D], k_out [N, Hk, D])`` in q's dtype. Weights and tables of another float
    dtype are cast to q's.
    """
    _float_tensor("q", q)
    _float_tensor("k", k)
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [N, heads, D], got shape {tuple(t.shape)}")
    n, _, d = q.shape
    if d % 2 or d == 0:
        raise ValueError(f"q's head size D must be even and positive, got {d}")
    if k.shape[0] != n or k.shape[2] != d:
        raise ValueError(f"k must be [{n}, Hk, {d}] like q {tuple(q.shape)}, got {tuple(k.shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    if not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"eps must be a non-negative float, got {eps!r}")
    rows = []
    for name, t, shape in (("q_weight", q_weight, (d,)), ("k_weight", k_weight, (d,)), ("cos", cos, (n, d)),
                           ("sin", sin, (n, d))):  # fmt: skip
        _float_tensor(name, t)
        want = shape[0] * shape[-1] if len(shape) == 2 else d
        if t.numel() != want:
            raise ValueError(f"{name} must hold {want} elements ({'N * D' if len(shape) == 2 else 'D'}), got shape "
                             f"{tuple(t.shape)}")  # fmt: skip
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
        rows.append(t.reshape(shape).to(q.dtype).contiguous())
    if k.device != q.device:
        raise ValueError(f"k must be on q's device {q.device}, got {k.device}")

    def rows_layout(t: torch.Tensor) -> torch.Tensor:  # contiguous heads and elements, any token stride
        return t if t.stride(2) == 1 and (t.shape[1] <= 1 or t.stride(1) == d) else t.contiguous()

    impl = backends.resolve("qk_norm_rope", backend, q.device, q.dtype)
    return impl.fn(rows_layout(q), rows_layout(k), *rows, float(eps))

"""The public ops. Each validates its arguments, routes to a backend, and calls it.

Validation happens here, once, before any backend runs, so every backend path rejects
the same bad input with the same message, and a rejected call has written nothing.
"""

from __future__ import annotations

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


MATVEC_MAX_M = 8  # rows up to which path="auto" takes the int8-dot matvec (decode)


def q4_0_path(impl: backends.Impl, rows: int, path: str) -> str:
    """The path ``q4_0_matmul`` takes: ``"int8"`` for up to 8 rows, else the backend's
    prefill path (reference, triton: ``"dequant"``; hip: ``"int8"``)."""
    paths = impl.info.get("paths", ("int8", "dequant"))
    if path == "auto":
        path = "int8" if rows <= MATVEC_MAX_M else impl.info.get("prefill", paths[0])
    if path not in ("int8", "dequant"):
        raise ValueError(f"path must be 'auto', 'int8' or 'dequant', got {path!r}")
    if path not in paths:
        raise backends.BackendUnavailable(
            f"q4_0_matmul: backend {impl.backend!r} implements the {' and '.join(paths)} path(s), not {path!r}"
        )
    return path


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
    chosen = q4_0_path(impl, x.shape[0], path)
    if x.shape[0] == 0 or w.shape[0] == 0:
        return torch.zeros((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.contiguous()
    return impl.fn(x, w, chosen)

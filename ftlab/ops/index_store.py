"""index / store (docs/OPS.md section 1): embedding rows and KV-cache slots."""

from __future__ import annotations

import torch

from ftlab import argcheck, backends


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
    indices = indices.contiguous()  # the backends read the indices as a dense vector
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
        if (
            not isinstance(mask, tuple | list)
            or len(mask) != 2
            or not all(argcheck.is_int(m) for m in mask)
        ):
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
                    f"indices must be in [0, {n}) (weights rows), got indices[{i}] = "
                    f"{int(indices[i])}"
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
    indices = indices.contiguous()  # the backends read the indices as a dense vector
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

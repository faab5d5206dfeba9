"""Argument checks shared by the public ops: each error names the argument, what was
expected and what came, e.g. ``TypeError("indices must be int32 or int64, got torch.float32")``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ftlab.backends import FLOAT_DTYPES
from ftlab.quant import Q8_1, QK, Q4_0Weight, QuantWeight

INDEX_DTYPES = (torch.int32, torch.int64)


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def dtype_in(name: str, t: torch.Tensor, dtypes: Iterable[torch.dtype]) -> None:
    dtypes = tuple(dtypes)
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must be one of {_names(dtypes)}, got {t.dtype}")


def float_tensor(name: str, t: object) -> torch.Tensor:
    """A tensor of fp32 / fp16 / bf16."""
    tensor(name, t)
    dtype_in(name, t, FLOAT_DTYPES)
    return t


def float_dtype(name: str, dtype: object) -> torch.dtype:
    """One of the float dtypes (a torch.dtype: TypeError otherwise)."""
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be one of {_names(FLOAT_DTYPES)}, got {dtype}")
    return dtype


def q4_0_weight(name: str, w: object) -> Q4_0Weight:
    """A :class:`~ftlab.quant.Q4_0Weight`."""
    if not isinstance(w, Q4_0Weight):
        raise TypeError(f"{name} must be a ftlab.quant.Q4_0Weight, got {type(w).__name__}")
    return w


def q8_1(name: str, a: object, x: torch.Tensor) -> Q8_1:
    """A :class:`~ftlab.quant.Q8_1` of ``x [M, K]``'s shape on x's device: q int8 ``[M, K]``, d and
    s fp32 ``[M, K/32]``, each contiguous."""
    if not isinstance(a, Q8_1):
        raise TypeError(f"{name} must be a ftlab.quant.Q8_1, got {type(a).__name__}")
    m, k = x.shape
    for part, t, dtype, want in (
        ("q", a.q, torch.int8, (m, k)),
        ("d", a.d, torch.float32, (m, k // QK)),
        ("s", a.s, torch.float32, (m, k // QK)),
    ):
        tensor(f"{name}.{part}", t)
        if t.dtype != dtype:
            raise TypeError(f"{name}.{part} must be {_names((dtype,))}, got {t.dtype}")
        shape(f"{name}.{part}", t, want)
        same_device(f"{name}.{part}", t, "x", x)
        if not t.is_contiguous():
            raise ValueError(f"{name}.{part} must be contiguous, got strides {t.stride()}")
    return a


def is_int(v: object) -> bool:
    """A Python int that is not a bool (``True`` is an int to Python, never a count here)."""
    return isinstance(v, int) and not isinstance(v, bool)


def int_in(name: str, v: object, low: int, high: int | None = None) -> int:
    """An int (not a bool: TypeError) in ``[low, high]`` (ValueError; no upper bound when ``high``
    is None)."""
    where = f"[{low}, {high}]" if high is not None else f">= {low}"
    if not is_int(v):
        raise TypeError(f"{name} must be an int {where}, got {type(v).__name__} {v!r}")
    if v < low or (high is not None and v > high):
        raise ValueError(f"{name} must be an int {where}, got {v!r}")
    return v


def finite_float(name: str, v: object, low: float = -math.inf) -> float:
    """A real number (int or float, not a bool: TypeError) that is finite and at least ``low``
    (ValueError)."""
    bound = f" >= {low}" if low != -math.inf else ""
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise TypeError(f"{name} must be a finite number{bound}, got {type(v).__name__} {v!r}")
    if not math.isfinite(v) or v < low:
        raise ValueError(f"{name} must be a finite number{bound}, got {v!r}")
    return float(v)


def norm_weight(
    weight: object, dim: str, size: int, eps: object, x: torch.Tensor, **inputs: torch.Tensor | None
) -> float:
    """The weight and eps of a norm over a last dim ``dim`` of ``size``: weight a float tensor
    ``[size]``, eps finite and >= 0 (returned as a float); ``inputs`` (None allowed) and the weight
    on x's device, checked in that order."""
    float_tensor("weight", weight)
    if tuple(weight.shape) != (size,):
        raise ValueError(f"weight must be [{dim}={size}], got shape {tuple(weight.shape)}")
    eps = finite_float("eps", eps, 0.0)
    for name, t in (*inputs.items(), ("weight", weight)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
    return eps


def same_dtype(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.dtype != ref.dtype:
        raise TypeError(f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {t.dtype}")


def same_device(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(
            f"{name} must be on the device of {ref_name} ({ref.device}), got {t.device}"
        )


def rows(name: str, t: torch.Tensor) -> None:
    """A 2-D tensor of rows, each contiguous (row stride may exceed the row length)."""
    shape = t.shape
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D [rows, D], got shape {tuple(shape)}")
    row_stride, col_stride = t.stride()
    if shape[1] > 1 and col_stride != 1:
        raise ValueError(
            f"{name} must have contiguous rows (stride(1) == 1), got strides {t.stride()}"
        )
    if shape[0] > 1 and shape[1] > 0 and row_stride < shape[1]:
        raise ValueError(f"{name} rows must not overlap (stride(0) >= D), got strides {t.stride()}")


def index_vector(name: str, t: torch.Tensor) -> None:
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D [L], got shape {tuple(t.shape)}")


def reset_rows(name: str, t: object, b: int, ref_name: str, ref: torch.Tensor) -> torch.Tensor:
    """A bool ``[B]`` row mask (any stride) on ``ref``'s device: the decode ops' ``reset``."""
    tensor(name, t)
    if t.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got {t.dtype}")
    if tuple(t.shape) != (b,):
        raise ValueError(f"{name} must be [B={b}], got shape {tuple(t.shape)}")
    if t.device != ref.device:
        raise ValueError(f"{name} must be on {ref_name}'s device {ref.device}, got {t.device}")
    return t


def shape(name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(t.shape)}")


def data_checks_allowed(
    op: str,
    what: str = "check=True reads the indices",
    instead: str = "validate the inputs before capture and pass check=False",
) -> None:
    """Data-dependent checks read the tensors on the host: impossible inside graph capture."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{op}: {what} on the host, which cannot happen during CUDA/HIP graph capture; "
            f"{instead}"
        )


def first_position(mask: torch.Tensor) -> int:
    return int(mask.nonzero()[0, 0])


def decode_attention_layout(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor
) -> None:
    """The shapes a decode_attention backend reads, checked at its entry whether or not the op
    validated (host-side shape reads, no device sync): ``q [B, H, D]``, ``k``, ``v [B, S, KVH,
    D]`` with KVH dividing H, ``lengths [B]``."""
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D [B, H, D], got shape {tuple(q.shape)}")
    b, h, d = q.shape
    kvh = k.shape[2] if k.dim() == 4 else -1
    if kvh <= 0 or h % kvh:
        raise ValueError(
            f"k must be [B, S, KVH, D] with KVH dividing q's {h} heads, got shape {tuple(k.shape)}"
        )
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 4 or t.shape[0] != b or t.shape[2] != kvh or t.shape[3] != d:
            raise ValueError(
                f"{name} must be [B={b}, S, KVH, D={d}] (KVH dividing q's heads), got shape "
                f"{tuple(t.shape)}"
            )
    if v.shape[1] != k.shape[1]:
        raise ValueError(f"v must have k's {k.shape[1]} positions, got {v.shape[1]}")
    shape("lengths", lengths, (b,))


def matmul_layout(x: torch.Tensor, w: torch.Tensor | QuantWeight) -> None:
    """The shapes a matmul backend reads (``x [M, K] @ W.T`` for ``W [N, K]``), checked at its
    entry whether or not the op validated (host-side shape reads, no device sync)."""
    if x.dim() != 2 or len(w.shape) != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(
            f"x must be 2-D [M, K] with w's K = {w.shape[-1]} columns (w is {tuple(w.shape)}), got "
            f"shape {tuple(x.shape)}"
        )

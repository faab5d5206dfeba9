"""Strategies and the cross-backend case functions of index / store (bit-exact copies)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from ftlab import ops
from ftlab.bitview import bits_equal, random_rows
from ftlab.testing.common import FLOAT_DTYPES, backends_for, restride

# ------------------------------------------------------------------ index


@dataclass
class IndexCase:
    weights: torch.Tensor  # [N, D], row stride may exceed D
    indices: torch.Tensor  # [L] int32/int64
    mask: tuple[int, int] | None
    out_pad: int  # extra elements per row of a caller-provided out (None when < 0)

    def __repr__(self) -> str:
        n, d = self.weights.shape
        return (
            f"IndexCase(N={n}, D={d}, stride={self.weights.stride(0)}, dtype={self.weights.dtype}, "
            f"L={self.indices.numel()}, idx={self.indices.dtype}, mask={self.mask}, "
            f"out_pad={self.out_pad}, indices={self.indices.tolist()[:16]}...)"
        )


@st.composite
def index_cases(
    draw, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES, max_rows: int = 300, max_d: int = 300
):
    """Random index calls: odd and tiny sizes, padded rows, duplicates, masks."""
    n = draw(st.integers(1, max_rows))
    d = draw(st.sampled_from([1, 2, 3, 7, 8, 16, 54, 64, 97, 128, max_d]) | st.integers(1, max_d))
    pad = draw(st.sampled_from([0, 0, 1, 3, 8]))
    dtype = draw(st.sampled_from(list(dtypes)))
    length = draw(st.sampled_from([0, 1, 2, 5, 64, 257]) | st.integers(0, 300))
    idx_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    use_mask = draw(st.booleans())
    if use_mask:
        start = draw(st.integers(-8, n + 8))
        mask_len = draw(st.integers(0, n))
        mask = (start, mask_len)
        lo, hi = start - 8, start + mask_len + 8  # reach beyond the shard on both sides
    else:
        mask, lo, hi = None, 0, n
    pattern = draw(st.sampled_from(["random", "same", "sorted", "unique"]))
    if pattern == "unique" and hi - lo >= length:
        idx = torch.randperm(hi - lo, generator=gen)[:length] + lo
    else:
        idx = torch.randint(lo, hi, (length,), generator=gen)
        if pattern == "same" and length:
            idx[:] = idx[0]
        elif pattern == "sorted":
            idx = idx.sort().values
    weights = random_rows(gen, n, d, pad, dtype)
    out_pad = draw(st.sampled_from([-1, -1, 0, 5]))
    return IndexCase(weights, idx.to(idx_dtype), mask, out_pad)


def check_index_case(
    case: IndexCase, device: torch.device | str = "cpu", backends: Sequence[str] | None = None
) -> dict[str, torch.Tensor]:
    """Run ``case`` through every backend on ``device``; assert each is bit-identical to the
    reference. Returns ``{backend: output}``."""
    device = torch.device(device)
    weights = restride(case.weights, device)
    indices = case.indices.to(device)
    expected = ops.index(weights, indices, mask=case.mask, backend="reference")
    outputs = {"reference": expected}
    for name in backends_for("index", device, weights.dtype, backends):
        if name == "reference":
            continue
        out = None
        if case.out_pad >= 0:  # a caller's out with padded rows, filled with noise
            noise = random_rows(
                torch.Generator().manual_seed(0),
                indices.numel(),
                weights.shape[1],
                case.out_pad,
                weights.dtype,
            )
            out = restride(noise, device)
        got = ops.index(weights, indices, mask=case.mask, out=out, backend=name)
        if out is not None:
            assert got.data_ptr() == out.data_ptr(), f"{name}: index did not write into out="
        assert bits_equal(got, expected), f"{name}: index differs from the reference for {case!r}"
        outputs[name] = got
    return outputs


# ------------------------------------------------------------------ store


@dataclass
class StoreCase:
    k_cache: torch.Tensor  # [S, Dk], row stride may exceed Dk
    v_cache: torch.Tensor  # [S, Dv]
    indices: torch.Tensor  # [L], unique apart from -1
    k: torch.Tensor  # [L, Dk]
    v: torch.Tensor  # [L, Dv]

    def __repr__(self) -> str:
        return (
            f"StoreCase(S={self.k_cache.shape[0]}, Dk={self.k.shape[1]}, Dv={self.v.shape[1]}, "
            f"strides=({self.k_cache.stride(0)}, {self.v_cache.stride(0)}, {self.k.stride(0)}, "
            f"{self.v.stride(0)}), dtype={self.k.dtype}, L={self.indices.numel()}, "
            f"idx={self.indices.dtype}, indices={self.indices.tolist()[:16]}...)"
        )


@st.composite
def store_cases(
    draw, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES, max_slots: int = 400, max_d: int = 300
):
    """Random store calls: padded rows in caches and inputs, -1 padding tokens, unique slots."""
    slots = draw(st.integers(1, max_slots))
    dk = draw(st.sampled_from([1, 3, 8, 64, 97, 128]) | st.integers(1, max_d))
    dv = draw(st.sampled_from([dk, dk, 1, 5, 64]))
    dtype = draw(st.sampled_from(list(dtypes)))
    length = draw(st.integers(0, min(slots + 4, 300)))
    idx_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    n_skip = draw(st.integers(0, length))
    n_store = min(length - n_skip, slots)
    n_skip = length - n_store
    chosen = torch.randperm(slots, generator=gen)[:n_store]
    idx = torch.cat([chosen, torch.full((n_skip,), -1, dtype=torch.int64)])
    idx = idx[torch.randperm(length, generator=gen)]
    pads = [draw(st.sampled_from([0, 0, 2, 16])) for _ in range(4)]
    return StoreCase(
        random_rows(gen, slots, dk, pads[0], dtype),
        random_rows(gen, slots, dv, pads[1], dtype),
        idx.to(idx_dtype),
        random_rows(gen, length, dk, pads[2], dtype),
        random_rows(gen, length, dv, pads[3], dtype),
    )


def _full_buffer(t: torch.Tensor) -> torch.Tensor:
    """The rows of ``t`` with their padding (what a store must leave alone)."""
    return torch.as_strided(t, (t.shape[0], t.stride(0)), (t.stride(0), 1)) if t.shape[0] else t


def check_store_case(
    case: StoreCase, device: torch.device | str = "cpu", backends: Sequence[str] | None = None
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Run ``case`` through every backend on ``device`` (fresh copies of the caches each);
    assert both whole cache buffers, padding included, are bit-identical to the reference.
    Returns ``{backend: (k_cache, v_cache)}``."""
    device = torch.device(device)
    indices = case.indices.to(device)
    k, v = restride(case.k, device), restride(case.v, device)

    def run(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        kc, vc = restride(case.k_cache, device), restride(case.v_cache, device)
        ops.store(kc, vc, indices, k, v, backend=name)
        return kc, vc

    expected = run("reference")
    results = {"reference": expected}
    for name in backends_for("store", device, case.k.dtype, backends):
        if name == "reference":
            continue
        got = run(name)
        for label, g, e in (("k_cache", got[0], expected[0]), ("v_cache", got[1], expected[1])):
            assert bits_equal(_full_buffer(g), _full_buffer(e)), (
                f"{name}: {label} differs from the reference for {case!r}"
            )
        results[name] = got
    return results

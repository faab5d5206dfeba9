"""The HIP kernels that compute an RMSNorm run on the CPU (tests/unit/norm_host: the device code
compiled by the host C++ compiler against the host port.h, a thread per GPU thread), on rows whose
squares overflow fp32 and on ordinary ones: gated_rmsnorm_kernel, qk_norm_rope_kernel and
add_rmsnorm_kernel within their ops' bounds of the exact result, and the fused Q4_0 matvec's norm
prologue and moe_norm_router_topk_kernel with add_rmsnorm_kernel's bits (s and y), as they
promise. The GPU tests (tests/property/test_norm_overflow.py, ``gpu``) run the real thing."""

import ctypes

import pytest
import torch
import torch.nn.functional as F
from host_build import CSRC, HOST_PORT, ROOT, build_harness

import ftlab.testing as ft
from ftlab import ops
from ftlab.models.layers import rope_tables
from ftlab.testing.common import assert_within
from ftlab.testing.norm import overflow_rows, rms_exact

CODE = {torch.float32: 0, torch.bfloat16: 1}
DTYPES = list(CODE)


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    headers = ("q4_0_common.h", "norm_common.h", "moe_common.h", "q4_0_norm_prologue.h")
    sources = [
        CSRC / n
        for n in (
            *headers,
            "gated_norm.hip",
            "moe_route.hip",
            "norm.hip",
            "q4_0_matvec.hip",
            "qk_norm_rope.hip",
        )
    ]
    sources += [HOST_PORT, ROOT / "tests/unit/norm_host/harness.cpp"]
    return build_harness(tmp_path_factory.mktemp("norm_host"), sources, "harness.cpp")


def ptr(t: torch.Tensor | None):
    return ctypes.c_void_p(None if t is None else t.data_ptr())


def within(got: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor) -> None:
    d = got.shape[-1]
    assert_within(
        "hip (host)", "y", got.reshape(-1, d), exact.reshape(-1, d).float(), bound.reshape(-1, d)
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rmsnorm_kernel(harness, dtype):
    n, h, d = 2, 4, 64
    x, z = (
        overflow_rows((n, h, d), dtype, 1),
        (torch.randn(n, h, d, generator=torch.Generator().manual_seed(2))).to(dtype),
    )
    w = 1 + 0.25 * torch.randn(d, generator=torch.Generator().manual_seed(3))
    y = torch.full((n, h, d), float("nan"), dtype=dtype)
    harness.run_gated(
        CODE[dtype],
        ptr(x),
        ctypes.c_int64(h * d),
        ptr(z),
        ctypes.c_int64(h * d),
        ptr(w),
        ptr(y),
        ctypes.c_float(1e-6),
        n,
        h,
        d,
    )
    within(
        y,
        rms_exact(x, 1e-6) * w.double() * F.silu(z.double()),
        ft.gated_rmsnorm_tolerance(x, z, w, 1e-6),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rope_kernel(harness, dtype):
    n, hq, hk, d, rot = 2, 4, 4, 64, 32
    q, k = overflow_rows((n, hq, d), dtype, 4), overflow_rows((n, hk, d), dtype, 5)
    qw, kw = (
        (1 + 0.25 * torch.randn(d, generator=torch.Generator().manual_seed(s))).to(dtype)
        for s in (6, 7)
    )
    cos, sin = (
        t.reshape(n, rot).contiguous()
        for t in rope_tables(torch.arange(3, 3 + n)[None], rot, 1e4, dtype)
    )
    qo, ko = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    harness.run_qk(
        CODE[dtype],
        ptr(q),
        ptr(k),
        ptr(qw),
        ptr(kw),
        ptr(cos),
        ptr(sin),
        ptr(qo),
        ptr(ko),
        ctypes.c_float(1e-6),
        n,
        hq,
        hk,
        d,
        rot,
    )
    for x, w, out in ((q, qw, qo), (k, kw, ko)):
        y = rms_exact(x, 1e-6) * w.double()
        c, s = cos.double()[:, None], sin.double()[:, None]
        exact = torch.cat(
            [y[..., :rot] * c + torch.roll(y[..., :rot], rot // 2, dims=-1) * s, y[..., rot:]], -1
        )
        within(out, exact, ft.qk_norm_rope_tolerance(x, w, cos, sin, 1e-6, rot))


def add(harness, dtype, vec: bool, x, res, w) -> tuple[torch.Tensor, torch.Tensor]:
    """add_rmsnorm_kernel's (y, s) (s: x without a residual)."""
    n, h = x.shape
    y, s = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    harness.run_add(
        CODE[dtype], int(vec), ptr(x), ptr(res), ptr(w), ptr(s), ptr(y), ctypes.c_float(1e-6), n, h
    )
    return y, x if res is None else s


@pytest.mark.parametrize("dtype", DTYPES)
# 1536: pieces past the cache
@pytest.mark.parametrize("vec, h", [(True, 64), (False, 64), (False, 1536)])
def test_add_rmsnorm_kernel(harness, dtype, vec, h):
    x = overflow_rows((4, h), dtype, 8)
    w = (1 + 0.25 * torch.randn(h, generator=torch.Generator().manual_seed(9))).to(dtype)
    for res in (None, (x * 0.5).to(dtype)):
        y, s = add(harness, dtype, vec, x, res, w)
        assert torch.equal(s, ops.add_rmsnorm(x, res, w, 1e-6, backend="reference")[1])
        within(y, rms_exact(s, 1e-6) * w.double(), ft.add_rmsnorm_tolerance(s, w, 1e-6))


def test_the_fused_q4_0_matvec_norm_has_add_rmsnorm_bits(harness):
    k, n = 512, 64
    gen = torch.Generator().manual_seed(10)
    w = ops.quantize_q4_0(torch.randn(n, k, generator=gen) / 8)
    nw = (1 + 0.25 * torch.randn(k, generator=gen)).to(torch.bfloat16)
    for row in range(4):  # each scale's row alone: the prologue takes one row
        x = overflow_rows((4, k), torch.bfloat16, 11)[row : row + 1].contiguous()
        res = (x * 0.5).to(torch.bfloat16)
        s_out, y_out = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
        out = torch.full((1, n), float("nan"), dtype=torch.bfloat16)
        harness.run_q4_0_norm(
            ptr(x),
            ptr(res),
            ptr(nw),
            ptr(s_out),
            ptr(y_out),
            ctypes.c_float(1e-6),
            ptr(w.data),
            ctypes.c_int64(w.data.shape[1]),
            ptr(out),
            ctypes.c_int64(n),
            ctypes.c_int64(k),
        )
        y, s = add(harness, torch.bfloat16, True, x, res, nw)
        assert torch.equal(s_out, s) and torch.equal(y_out, y), row
        within(y_out, rms_exact(s, 1e-6) * nw.double(), ft.add_rmsnorm_tolerance(s, nw, 1e-6))
        want = ops.q4_0_matmul(y, w, path="int8", backend="reference")
        bound = ft.matmul_tolerance(y, w, "int8", torch.bfloat16)
        assert_within("hip (host) fused", "out", out, want, bound)


def test_the_norm_router_has_add_rmsnorm_bits(harness):
    t, h, e, top_k = 4, 256, 8, 2
    gen = torch.Generator().manual_seed(12)
    x = overflow_rows((t, h), torch.bfloat16, 13)
    res = (x * 0.5).to(torch.bfloat16)
    nw = (1 + 0.25 * torch.randn(h, generator=gen)).to(torch.bfloat16)
    router = (torch.randn(e, h, generator=gen) / 16).to(torch.bfloat16)
    s, y = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    logits = torch.full((t, e), float("nan"), dtype=torch.bfloat16)
    wts, ids = torch.zeros(t, top_k), torch.full((t, top_k), -7, dtype=torch.int32)
    counters = torch.zeros(t, dtype=torch.int32)
    harness.run_norm_router(
        ptr(x),
        ptr(res),
        ptr(nw),
        ptr(s),
        ptr(y),
        ctypes.c_float(1e-6),
        ptr(router),
        ptr(logits),
        ptr(wts),
        ptr(ids),
        ptr(counters),
        t,
        h,
        e,
        top_k,
    )
    want_y, want_s = add(harness, torch.bfloat16, True, x, res, nw)
    assert torch.equal(s, want_s) and torch.equal(y, want_y)
    within(y, rms_exact(s, 1e-6) * nw.double(), ft.add_rmsnorm_tolerance(s, nw, 1e-6))
    _, _, ref_ids = ops.router_topk(y, router, top_k, True, backend="reference")
    assert torch.equal(ids.sort(-1).values, ref_ids.int().sort(-1).values)  # routed from that y

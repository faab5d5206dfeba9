"""Which kernel ``ftlab.hip.quant_matmul.quant_matmul`` launches for a type, M, K and variant, on
the CPU: the JIT module is replaced by a recorder of the entry points called (and with what type
code), so the entry's mapping of the planner's variants to kernels -- a named variant that cannot
serve refused, never swapped; the default taken from ``ftlab.backends.rules``; Q4_0's way back to
``q4_0_matmul`` -- is held without a GPU. The kernels themselves are held to their bounds by the
host harness (test_moe_kquant_vec_host.py) and the GPU tests."""

import pytest
import torch

from ftlab.backends import BackendUnavailable
from ftlab.hip import quant_matmul as hip_qmm
from ftlab.quant import Q8_1, quant_weight
from ftlab.testing.quant_matmul import random_quant_weight


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def entry(*args):
            codes = [a for a in args if isinstance(a, int)]
            self.calls.append((name, codes[0] if codes else None))

        return entry


@pytest.fixture
def calls(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(hip_qmm.jit, "module_for", lambda name, device: rec)
    monkeypatch.setattr(hip_qmm.jit, "on_device", lambda device, launch: launch())
    # no SM count here
    monkeypatch.setattr(hip_qmm, "tiled_config", lambda m, n, k, qtype, device: (4, 1))
    monkeypatch.setattr(
        hip_qmm,
        "quantize_q8_1",
        lambda x: (
            rec.calls.append(("quantize_q8_1", None))
            or Q8_1.empty(x.shape[0], x.shape[1], x.device)
        ),
    )
    monkeypatch.setattr(
        hip_qmm,
        "q4_0_matmul",
        lambda x, w, path: (
            rec.calls.append(("q4_0_matmul", None)) or x.new_zeros(x.shape[0], w.shape[0])
        ),
    )
    return rec.calls


def _weight(qtype, k, n=16):
    w = random_quant_weight(k, qtype, n, k)
    # 16-byte aligned, as the kernels need
    data = torch.empty(w.data.numel() + 16, dtype=torch.uint8)
    off = (-data.data_ptr()) % 16
    view = data[off : off + w.data.numel()].view(w.data.shape)
    view.copy_(w.data)
    return quant_weight(view, w.shape, qtype)


MV1 = {"variant": "mv1"}


@pytest.mark.parametrize(
    "qtype, m, k, kw, want",
    [
        ("Q4_0", 1, 2048, {**MV1, "staging": "held"}, [("quant_mv_fused", 4)]),
        ("Q4_0", 1, 2048, {**MV1, "staging": "staged"}, [("quant_mv_staged", 4)]),
        ("Q4_0", 1, 14336, {**MV1, "staging": "sliced"}, [("quant_mv_sliced", 4)]),
        (
            "Q4_0",
            1,
            14336,
            {**MV1, "staging": "sliced_q8"},
            [("quantize_q8_1", None), ("quant_mv_sliced_q8", 4)],
        ),
        ("Q4_0", 1, 2048, {}, [("q4_0_matmul", None)]),  # no default here: q4_0_matmul's
        ("Q4_0", 1, 2048, MV1, [("quant_mv_fused", 4)]),  # mv1's staging by its table: held
        ("Q8_0", 1, 12288, {**MV1, "staging": "sliced"}, [("quant_mv_sliced", 5)]),
        (
            "Q6_K",
            1,
            14336,
            {**MV1, "staging": "sliced_q8"},
            [("quantize_q8_1", None), ("quant_mv_sliced_q8", 3)],
        ),
        (
            "Q4_K",
            4,
            2048,
            {"variant": "tiled"},
            [("quantize_q8_1", None), ("quant_mv_tiled_q4_k", 4)],
        ),
        ("Q4_K", 4, 2048, {"variant": "lanes"}, [("quantize_q8_1", None), ("quant_mv_q4_k", None)]),
        (
            "Q4_K",
            1,
            2048,
            {"variant": "vec"},
            [("quantize_q8_1", None), ("quant_mv_vec_q4_k", None)],
        ),
        # the default on the CPU's platform: mv1, held
        (
            "Q5_K",
            1,
            4096,
            {},
            [("quant_mv_fused", 2)],
        ),
        # past held's K
        (
            "Q4_K",
            1,
            14336,
            {},
            [("quantize_q8_1", None), ("quant_mv_sliced_q8", 1)],
        ),
        ("Q6_K", 1, 14336, {}, [("quantize_q8_1", None), ("quant_mv_sliced_q8", 3)]),
        # past sliced's: vec
        (
            "Q5_K",
            1,
            16640,
            {},
            [("quantize_q8_1", None), ("quant_mv_vec_q5_k", None)],
        ),
        ("Q8_0", 1, 14336, {}, [("quantize_q8_1", None), ("quant_mv_q8_0", None)]),  # Q8_0: lanes
        ("Q8_0", 4, 2048, {}, [("quantize_q8_1", None), ("quant_mv_tiled_q8_0", 4)]),  # G = 4
        ("Q4_K", 9, 2048, {}, [("quantize_q8_1", None), ("quant_gemm_q4_k", None)]),
    ],
)
def test_variant_to_kernel(calls, qtype, m, k, kw, want):
    w = _weight(qtype, k)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    hip_qmm.quant_matmul(x, w, "int8", **kw)
    assert calls == want


@pytest.mark.parametrize(
    "qtype, m, k, kw, error, why",
    [
        (
            "Q4_0",
            1,
            14336,
            {**MV1, "staging": "held"},
            BackendUnavailable,
            "K = 14336 is not a multiple of 256 in \\(0, 8192\\]",
        ),
        (
            "Q4_0",
            1,
            4096,
            {**MV1, "staging": "staged"},
            BackendUnavailable,
            "K = 4096 is not a multiple of 256 in \\(0, 2048\\]",
        ),
        (
            "Q8_0",
            1,
            2048,
            {**MV1, "staging": "staged"},
            BackendUnavailable,
            "Q8_0 has no staged form",
        ),
        ("Q4_0", 2, 2048, {**MV1, "staging": "sliced"}, BackendUnavailable, "not for small batch"),
        ("Q4_K", 1, 16640, MV1, BackendUnavailable, "K = 16640"),
        ("Q4_K", 9, 2048, {"variant": "lanes"}, BackendUnavailable, "not for prefill"),
        ("Q4_K", 2, 2048, {"variant": "vec"}, BackendUnavailable, "not for small batch"),
        ("Q4_K", 1, 2048, {"variant": "tiled"}, BackendUnavailable, "not for one row"),
        ("Q4_K", 1, 2048, {"variant": "no_such"}, ValueError, "variant must be one of"),
        ("Q4_K", 1, 2048, {**MV1, "staging": "no_such"}, ValueError, "staging must be one of"),
        (
            "Q4_K",
            1,
            2048,
            {"variant": "vec", "staging": "held"},
            ValueError,
            "staging is an option of variant 'mv1'",
        ),
    ],
)
def test_a_variant_that_cannot_serve_is_refused(calls, qtype, m, k, kw, error, why):
    """Nothing is swapped for a named variant or staging: it runs, or the call is refused naming
    why."""
    w = _weight(qtype, k)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    with pytest.raises(error, match=why):
        hip_qmm.quant_matmul(x, w, "int8", **kw)
    assert calls == []


def test_an_unaligned_weight_is_refused_by_the_one_launch_kernels(calls):
    w = _weight("Q4_K", 2048)
    data = torch.empty(w.data.numel() + 32, dtype=torch.uint8)
    off = (-data.data_ptr()) % 16 + 4
    view = data[off : off + w.data.numel()].view(w.data.shape)
    bad = quant_weight(view, w.shape, "Q4_K")
    x = torch.randn(1, 2048, dtype=torch.bfloat16)
    with pytest.raises(BackendUnavailable, match="16-byte aligned"):
        hip_qmm.quant_matmul(x, bad, "int8", variant="mv1")
    hip_qmm.quant_matmul(x, bad, "int8")  # the default for it: lanes (vec needs 16-byte alignment)
    assert calls == [("quantize_q8_1", None), ("quant_mv_q4_k", None)]

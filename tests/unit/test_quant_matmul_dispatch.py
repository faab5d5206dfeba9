"""Which kernel ``ftlab.hip.quant_matmul.quant_matmul`` launches for a type, M, K and variant, on
the CPU: the JIT module is replaced by a recorder of the entry points called (and with what type
code), so the routing of the one-launch one-row kernels -- their applicability checks and
fallbacks, Q4_0's way back to ``q4_0_matmul`` -- is held without a GPU. The kernels themselves are
held to their bounds by the host harness (test_moe_kquant_vec_host.py) and the GPU tests."""

import pytest
import torch

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
    monkeypatch.setattr(hip_qmm, "quantize_q8_1", lambda x: rec.calls.append(("quantize_q8_1", None)) or Q8_1.empty(x.shape[0], x.shape[1], x.device))
    monkeypatch.setattr(hip_qmm, "q4_0_matmul", lambda x, w, path: rec.calls.append(("q4_0_matmul", None)) or x.new_zeros(x.shape[0], w.shape[0]))
    return rec.calls


def _weight(qtype, k, n=16):
    w = random_quant_weight(k, qtype, n, k)
    data = torch.empty(w.data.numel() + 16, dtype=torch.uint8)  # 16-byte aligned, as the kernels need
    off = (-data.data_ptr()) % 16
    view = data[off : off + w.data.numel()].view(w.data.shape)
    view.copy_(w.data)
    return quant_weight(view, w.shape, qtype)


@pytest.mark.parametrize(
    "qtype, m, k, variant, want",
    [
        ("Q4_0", 1, 2048, "fused", [("quant_mv_fused", 4)]),
        ("Q4_0", 1, 2048, "staged", [("quant_mv_staged", 4)]),
        ("Q4_0", 1, 14336, "sliced", [("quant_mv_sliced", 4)]),
        ("Q4_0", 1, 14336, "sliced_q8", [("quantize_q8_1", None), ("quant_mv_sliced_q8", 4)]),
        ("Q4_0", 1, 14336, "fused", [("q4_0_matmul", None)]),  # past fused's K: Q4_0's own kernels
        ("Q4_0", 1, 4096, "staged", [("quant_mv_fused", 4)]),  # past staged's K: fused
        ("Q4_0", 2, 2048, "sliced", [("q4_0_matmul", None)]),  # one row only
        ("Q4_0", 1, 2048, None, [("q4_0_matmul", None)]),  # no default here: q4_0_matmul's
        ("Q8_0", 1, 2048, "staged", [("quant_mv_fused", 5)]),  # no staged Q8_0
        ("Q8_0", 1, 12288, "sliced", [("quant_mv_sliced", 5)]),
        ("Q4_K", 1, 16640, "sliced", [("quantize_q8_1", None), ("quant_mv_vec_q4_k", None)]),  # past 16384: vec
        ("Q6_K", 1, 14336, "sliced_q8", [("quantize_q8_1", None), ("quant_mv_sliced_q8", 3)]),
        ("Q5_K", 1, 4096, None, [("quant_mv_fused", 2)]),  # the default is unchanged
        ("Q4_K", 1, 14336, None, [("quantize_q8_1", None), ("quant_mv_sliced_q8", 1)]),  # past fused's K
        ("Q6_K", 1, 14336, None, [("quantize_q8_1", None), ("quant_mv_sliced_q8", 3)]),
        ("Q5_K", 1, 16640, None, [("quantize_q8_1", None), ("quant_mv_vec_q5_k", None)]),  # past sliced's: vec
        ("Q8_0", 1, 14336, None, [("quantize_q8_1", None), ("quant_mv_q8_0", None)]),  # Q8_0: lanes still
    ],
)
def test_one_row_routing(calls, qtype, m, k, variant, want):
    w = _weight(qtype, k)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    hip_qmm.quant_matmul(x, w, "int8", variant=variant)
    assert calls == want


def test_models_keep_q8_0_off_the_one_launch_kernels():
    """fused takes Q8_0 now, but hip's default for it is three launches: the models' one-row
    backend rule (one_launch_default) says no for it, yes for the K-quants."""
    x = torch.randn(1, 2048)
    assert hip_qmm.fused_ok(x, _weight("Q8_0", 2048))
    assert not hip_qmm.one_launch_default(x, _weight("Q8_0", 2048))
    assert all(hip_qmm.one_launch_default(x, _weight(t, 2048)) for t in ("Q4_K", "Q5_K", "Q6_K"))
    assert hip_qmm.one_launch_default(torch.randn(1, 14336), _weight("Q4_K", 14336))  # past fused's K: sliced_q8
    assert not hip_qmm.one_launch_default(torch.randn(1, 16640), _weight("Q4_K", 16640))  # past sliced's K

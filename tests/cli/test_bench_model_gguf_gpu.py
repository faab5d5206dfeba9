"""``ftlab bench model --gguf`` on a GPU: the user path's rows (the public calls) before the
diagnostics (the model called directly), each diagnostic validated; every hybrid placement's row
graph-replayed."""

import pytest

from ftlab.bench import model_gguf
from tests.cli.test_bench_model_gguf import Q4_K_M


@pytest.mark.gpu
def test_bench_on_the_gpu(tmp_path):
    report = model_gguf.run(Q4_K_M, quick=True, device="cuda", prefill=32)
    # the user's path first: the public calls, each its own row
    user = [m for m in report.measurements if m.kind == "user path"]
    calls = ["Pipeline.load"] + ["Pipeline.prefill"] * 3 + ["Pipeline.generate"] * 3
    assert [m.call for m in user] == calls
    assert all(m.time_us > 0 for m in user)
    # then the diagnostics (the model called directly): batch 1 launches only hip kernels on this
    # file (the vec experts, the fused projections), so its step is recorded and launched too;
    # batch 8's tiled matvec sums its K splits in torch
    diagnostic = [m for m in report.measurements if m.kind == "diagnostic"]
    assert len(user) + len(diagnostic) == len(report.measurements)
    modes = [(m.case.split(":")[0], m.mode) for m in diagnostic]
    assert modes == [
        ("prefill 32 tokens", "eager"),
        ("prefill 32 tokens", "graph"),
        ("decode batch 1", "graph"),
        ("decode batch 1", "launches"),
        ("decode batch 1", "eager"),
        ("decode batch 8", "graph"),
        ("decode batch 8", "eager"),
    ]
    assert all(m.validated for m in diagnostic)


@pytest.mark.gpu
def test_hybrid_bench_on_the_gpu():
    """Half the experts on the CPU: every placement's row graph-replayed (the handshakes pass their
    probes on a GPU), each replay bit-equal to its eager step."""
    report = model_gguf.run(Q4_K_M, quick=True, device="cuda", prefill=32, hybrid_slots=1)
    rows = [(m.case.split(":")[0], m.mode, m.validated) for m in report.measurements[-3:]]
    assert rows == [
        (f"hybrid decode batch 1, {p}", "graph", True) for p in ("layers", "static", "lru")
    ]

"""The benchmark report: JSON round trip, Markdown with the copy bandwidth beside every row."""

import json

import pytest
import torch

from ftlab.bench.harness import Measurement, Report


def test_report_round_trip(tmp_path):
    device = {
        "name": "Test GPU 9000",
        "arch": "gfx1201",
        "torch": "x",
        "date": "2026-01-01",
        "commit": "abc",
    }
    report = Report(
        "index_store",
        device,
        1000.0,
        [Measurement("store decode", "hip", 2.0, 4000, True, "graph")],
        notes=["a note"],
    )
    json_path, md_path = report.write(tmp_path)
    assert json_path.name == "2026-01-01-test-gpu-9000-index_store.json"
    data = json.loads(json_path.read_text())
    row = data["results"][0]
    assert row["gbps"] == 2.0 and row["pct_of_copy"] == 0.2 and row["mode"] == "graph"
    again = Report.from_json(data)
    assert again.markdown() == md_path.read_text()
    assert "**1000 GB/s**" in md_path.read_text() and "- a note" in md_path.read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_a_prefill_row_is_timed_on_the_gpu_clock_and_as_eager_wall_gpu():
    """Every gated_delta_rule prefill row twice: device time (a replayed graph, or events where
    a call cannot be captured) and the eager wall time, labelled apart."""
    from ftlab.bench import gated_delta_rule as bench
    from ftlab.bench.harness import Report

    x = torch.randn(1 << 20, device="cuda")
    report = Report("t", {}, 0.0)
    bench.timed_rows(report, "case", "torch", lambda: x * 2, x.numel() * 8, True, 5)

    def syncs():  # a host synchronization: no capture
        return float((x * 2).sum())

    bench.timed_rows(report, "case", "host sync", syncs, x.numel() * 4, True, 5)
    modes = [(m.backend, m.mode) for m in report.measurements]
    assert modes == [
        ("torch", "graph"),
        ("torch", "eager wall"),
        ("host sync", "events"),
        ("host sync", "eager wall"),
    ]
    assert all(m.time_us > 0 for m in report.measurements)

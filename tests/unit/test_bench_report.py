"""The benchmark report: JSON round trip, Markdown with the copy bandwidth beside every row."""

import json

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

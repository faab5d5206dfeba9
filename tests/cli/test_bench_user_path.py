"""The user path rows of ``ftlab bench model --gguf`` (:mod:`ftlab.bench.user_path`) come
from the public calls, made as a user makes them: a recording stand-in for Pipeline sees them."""

from pathlib import Path

import torch

from ftlab.bench.harness import Report
from ftlab.bench.user_path import bench_user_path

Q4_K_M = Path(__file__).parents[1] / "data" / "llama_cpp" / "qwen3moe-q4_k_m.gguf"


class RecordingPipeline:
    """A stand-in for Pipeline: ``load`` gives one whose calls are recorded (prefill's ids'
    length; generate's prompt length and keywords), each answered at once."""

    calls: list = []

    def __init__(self):
        self.config = type("Config", (), {"vocab_size": 50})()
        self.decode_path = "graph"

    @classmethod
    def load(cls, path, **kwargs):
        cls.calls.append(("load", Path(path).name, kwargs))
        return cls()

    def prefill(self, ids):
        self.calls.append(("prefill", len(ids)))
        return torch.zeros(50)

    def generate(self, prompt, max_new_tokens, **kwargs):
        self.calls.append(("generate", len(prompt), max_new_tokens, kwargs))
        return iter(["a"] * max_new_tokens)


def test_the_user_path_rows_come_from_the_public_calls(tmp_path):
    RecordingPipeline.calls = []
    report = Report("t", {}, 1.0)
    bench_user_path(
        report,
        Q4_K_M,
        torch.device("cpu"),
        torch.float32,
        6,
        runs=2,
        new_tokens=5,
        pipeline=RecordingPipeline,
    )
    load, *rest = RecordingPipeline.calls
    assert load == (
        "load",
        Q4_K_M.name,
        {"device": torch.device("cpu"), "dtype": torch.float32, "max_seq_len": 12},
    )
    greedy = {"ignore_eos": True}
    top_p = {"ignore_eos": True, "temperature": 0.8, "top_p": 0.95, "seed": 0}
    assert (
        rest
        == [("prefill", 6)] * 3
        + [("generate", 1, 5, greedy)] * 3
        + [("generate", 6, 5, greedy)] * 3
        + [("generate", 1, 5, top_p)] * 3
    )  # a warm-up call, then 2 timed
    assert [(m.case.split(":")[0], m.call, m.mode) for m in report.measurements] == [
        ("load", "Pipeline.load", "public API"),
        ("prefill 6 tokens", "Pipeline.prefill", "public API"),
        ("decode batch 1", "Pipeline.generate", "graph"),
        ("decode batch 1 at depth 6", "Pipeline.generate", "graph"),
        ("decode batch 1, top-p 0.95 at temperature 0.8", "Pipeline.generate", "graph"),
    ]
    assert all(m.kind == "user path" and m.backend == "ftlab" for m in report.measurements)

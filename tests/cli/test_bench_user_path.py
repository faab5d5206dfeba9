"""The user path rows of ``ftlab bench model --gguf`` (:mod:`ftlab.bench.user_path`) come
from the public calls, made as a user makes them: a recording stand-in for Pipeline sees them."""

from pathlib import Path

import torch

from ftlab.bench.harness import Report
from ftlab.bench.user_path import bench_user_path

Q4_K_M = Path(__file__).parents[1] / "data" / "llama_cpp" / "qwen3moe-q4_k_m.gguf"


class UniformModel:
    """Equal logits over 50 tokens at every position: a perplexity of exactly 50."""

    def forward(self, tokens, positions):
        return torch.zeros(*tokens.shape, 50)

    def end_step(self):
        pass


class RecordingPipeline:
    """A stand-in for Pipeline: ``load`` gives one whose calls are recorded (prefill's ids'
    length; generate's prompt length and keywords), each answered at once; the accuracy row's
    ``ftlab.eval`` reads its tokenizer (a character a token) and its uniform model."""

    calls: list = []

    def __init__(self, max_seq_len: int = 0):
        self.config = type("Config", (), {"vocab_size": 50})()
        self.max_seq_len, self.device, self.model = max_seq_len, torch.device("cpu"), UniformModel()
        self.tokenizer = type("Tok", (), {"encode": lambda self, t: [ord(c) % 50 for c in t]})()
        self.decode_path = "graph"
        # the prompts whose state is kept (a recurrent model's snapshots at their ends)
        self.held: list[list[int]] = []
        self.reused = 0
        self.prefix_cache = type("Cache", (), {"clear": self.held.clear})()

    def reset(self):
        self.calls.append(("reset",))

    @classmethod
    def load(cls, path, **kwargs):
        cls.calls.append(("load", Path(path).name, kwargs))
        return cls(kwargs["max_seq_len"])

    def prefill(self, ids):
        ids = [int(i) for i in ids]
        self.calls.append(("prefill", len(ids)))
        self.reused = max([len(h) for h in self.held if ids[: len(h)] == h], default=0)
        self.held.append(ids)
        return torch.zeros(50)

    def generate(self, prompt, max_new_tokens, **kwargs):
        self.calls.append(("generate", len(prompt), max_new_tokens, kwargs))
        return iter(["a"] * max_new_tokens)


def recorded(prompt, **kwargs) -> Report:
    """The report of bench_user_path on the recording stand-in, its calls reset first."""
    RecordingPipeline.calls = []
    report = Report("t", {}, 1.0)
    cpu = torch.device("cpu")
    bench_user_path(
        report, Q4_K_M, cpu, torch.float32, prompt, pipeline=RecordingPipeline, **kwargs
    )
    return report


def test_the_user_path_rows_come_from_the_public_calls(tmp_path):
    report = recorded(6, runs=2, new_tokens=5)
    load, *rest = RecordingPipeline.calls
    assert load == (
        "load",
        Q4_K_M.name,
        {"device": torch.device("cpu"), "dtype": torch.float32, "max_seq_len": 12},
    )
    greedy = {"ignore_eos": True}
    top_p = {"ignore_eos": True, "temperature": 0.8, "top_p": 0.95, "seed": 0}
    resume = [("prefill", 6)] + [("prefill", 11)] * 3 + [("reset",), ("prefill", 11)] * 3
    assert (
        rest
        == [("prefill", 6)] * 3
        + resume
        + [("generate", 1, 5, greedy)] * 3
        + [("generate", 6, 5, greedy)] * 3
        + [("generate", 1, 5, top_p)] * 3
        + [("reset",)] * 8  # ftlab.eval: each window a fresh sequence
    )  # a warm-up call, then 2 timed
    assert [(m.case.split(":")[0], m.call, m.mode) for m in report.measurements] == [
        ("load", "Pipeline.load", "public API"),
        ("prefill 6 tokens", "Pipeline.prefill", "public API"),
        ("prefill 6 shared + 5 new tokens, prefix cached", "Pipeline.prefill", "public API"),
        ("prefill 6 shared + 5 new tokens, recomputed", "Pipeline.prefill", "public API"),
        ("decode batch 1", "Pipeline.generate", "graph"),
        ("decode batch 1 at depth 6", "Pipeline.generate", "graph"),
        ("decode batch 1, top-p 0.95 at temperature 0.8", "Pipeline.generate", "graph"),
        ("perplexity of the held-out text", "ftlab.eval.evaluate", "public API"),
    ]
    # the uniform model's perplexity, over 8 windows of the pipeline's whole length
    assert report.measurements[-1].case.split(": ")[1] == (
        "50 (ctx 12, 8 windows, 40 tokens scored)"
    )
    assert all(m.kind == "user path" and m.backend == "ftlab" for m in report.measurements)
    # every resumed prompt started after the shared prefix
    assert "tokens resumed each run: [6, 6, 6] (of 6 shared)" in "\n".join(report.notes)


def test_several_prompt_lengths_and_a_depth():
    report = recorded((4, 12), runs=1, new_tokens=3, depth=8)
    load, *rest = RecordingPipeline.calls
    assert load[2]["max_seq_len"] == 12 + 3 + 1
    resume = [("prefill", 12)] + [("prefill", 15)] * 2 + [("reset",), ("prefill", 15)] * 2
    assert [c[:2] for c in rest] == [("prefill", 4)] * 2 + [("prefill", 12)] * 2 + resume + [
        ("generate", 1),
        ("generate", 1),
        ("generate", 8),
        ("generate", 8),
        ("generate", 1),
        ("generate", 1),
    ] + [("reset",)] * 8
    assert [m.case.split(":")[0] for m in report.measurements] == [
        "load",
        "prefill 4 tokens",
        "prefill 12 tokens",
        "prefill 12 shared + 3 new tokens, prefix cached",
        "prefill 12 shared + 3 new tokens, recomputed",
        "decode batch 1",
        "decode batch 1 at depth 8",
        "decode batch 1, top-p 0.95 at temperature 0.8",
        "perplexity of the held-out text",
    ]


def test_llama_bench_of_several_prompt_lengths(tmp_path):
    from ftlab.bench.llama_bench import llama_bench_args, run_llama_bench
    from tests.cli.test_bench_model_gguf import fake_llama_bench

    results = [
        {"n_prompt": 4, "n_gen": 0, "n_depth": 0, "avg_ts": 400.0},
        {"n_prompt": 12, "n_gen": 0, "n_depth": 0, "avg_ts": 300.0},
        {"n_prompt": 12, "n_gen": 0, "n_depth": 8, "avg_ts": 200.0},  # a depth prefill: not read
        {"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": 50.0},
        {"n_prompt": 0, "n_gen": 128, "n_depth": 8, "avg_ts": 40.0},
    ]
    binary = fake_llama_bench(tmp_path, results)
    rows = run_llama_bench(binary, Q4_K_M, (4, 12), gpu=True, depth=8)
    assert [r.case for r in rows] == [
        "prefill 4 tokens: 400 tokens/s",
        "prefill 12 tokens: 300 tokens/s",
        "decode batch 1: 50 tokens/s",
        "decode batch 1 at depth 8: 40 tokens/s",
    ]
    args = llama_bench_args(Q4_K_M, (4, 12), True, depth=8)
    assert args[args.index("-p") + 1] == "4,12" and args[args.index("-d") + 1] == "0,8"


def test_prefill_lengths_and_depth_options(capsys):
    import pytest

    from ftlab import cli
    from ftlab.bench import model_gguf

    args = cli.parser().parse_args(
        ["bench", "model", "--gguf", "f.gguf", "--prefill", "8,16", "--depth", "4"]
    )
    assert (args.prefill, args.depth) == ((8, 16), 4)
    assert cli.parser().parse_args(["bench", "model", "--gguf", "f", "--prefill", "8"]).prefill == 8
    for bad in (["--prefill", "8,0"], ["--prefill", "8,x"], ["--depth", "0"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["bench", "model", "--gguf", str(Q4_K_M), *bad])
        assert exit_.value.code == 2
    assert "--prefill must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"depth must be an int >= 1 \(or None"):
        model_gguf.run(Q4_K_M, device="cpu", depth=0)

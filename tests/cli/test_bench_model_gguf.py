"""``ftlab bench model --gguf FILE`` on llama.cpp's Q4_K_M file of the tiny Qwen3-MoE
(tests/data/llama_cpp): the report's rows and notes, the decode bound counted from the file's
own tensor sizes, llama-bench's results beside ftlab's (a stand-in binary), the option checks."""

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from ftlab import cli
from ftlab.bench import model_gguf
from ftlab.bench.model import decode_bytes, parted_note, which_side
from ftlab.formats.gguf import open_gguf
from ftlab.models.loader import load_gguf

DATA = Path(__file__).parents[1] / "data"
Q4_K_M = DATA / "llama_cpp" / "qwen3moe-q4_k_m.gguf"
#: What llama-bench -o json prints (the fields the bench reads, values of a real run's kind).
#: With -d 0,8 it runs each test at depth 0 and 8 (decode at 8: where ftlab's decode rows run).
LLAMA_BENCH_JSON = [
    {"n_prompt": 8, "n_gen": 0, "n_depth": 0, "avg_ts": 4000.0, "stddev_ts": 10.0},
    {"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": 250.0, "stddev_ts": 1.0},
    {"n_prompt": 8, "n_gen": 0, "n_depth": 8, "avg_ts": 3900.0, "stddev_ts": 10.0},
    {"n_prompt": 0, "n_gen": 128, "n_depth": 8, "avg_ts": 240.0, "stddev_ts": 1.0},
]
#: the user path's two rows of a shared prefix plus new tokens
RESUMED = ("prefix cached", "recomputed")


def fake_llama_bench(tmp_path: Path, results: list, status: int = 0) -> Path:
    """A stand-in ``llama-bench``: records its arguments beside itself, prints ``results``."""
    script = tmp_path / "llama-bench"
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(tmp_path / 'args.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        f"print({json.dumps(json.dumps(results))})\nsys.exit({status})\n"
    )
    script.chmod(0o755)
    return script


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    binary = fake_llama_bench(out, LLAMA_BENCH_JSON)
    status = cli.main(
        [
            "bench",
            "model",
            "--gguf",
            str(Q4_K_M),
            "--device",
            "cpu",
            "--prefill",
            "8",
            "--quick",
            "--llama-bench",
            str(binary),
            "--out",
            str(out),
        ]
    )
    (path,) = out.glob("*-model-gguf-qwen3moe-q4_k_m.json")
    return status, json.loads(path.read_text()), json.loads((out / "args.json").read_text())


def test_report_rows_and_notes(cpu_run):
    status, report, _ = cpu_run
    assert (
        status == 0 and report["name"] == "model-gguf-qwen3moe-q4_k_m" and report["copy_gbps"] > 0
    )
    users = [r for r in report["results"] if r["kind"] == "user path"]
    assert [(r["case"].split(":")[0], r["call"], r["mode"]) for r in users] == [
        ("load", "Pipeline.load", "public API"),
        ("prefill 8 tokens", "Pipeline.prefill", "public API"),
        *[
            (f"prefill 8 shared + 64 new tokens, {w}", "Pipeline.prefill", "public API")
            for w in RESUMED
        ],
        ("decode batch 1", "Pipeline.generate", "eager"),
        ("decode batch 1 at depth 8", "Pipeline.generate", "eager"),
        ("decode batch 1, top-p 0.95 at temperature 0.8", "Pipeline.generate", "eager"),
        ("perplexity of the held-out text", "ftlab.eval.evaluate", "public API"),
    ]
    assert all(r["backend"] == "ftlab" and r["time_us"] > 0 for r in users)
    rows = report["results"][len(users) :]
    assert [(r["case"].split(":")[0], r["backend"], r["mode"], r["kind"]) for r in rows] == [
        ("prefill 8 tokens", "auto", "eager", "diagnostic"),
        ("decode batch 1", "auto", "eager", "diagnostic"),
        ("decode batch 8", "auto", "eager", "diagnostic"),
        ("prefill 8 tokens", "llama.cpp", "llama-bench", ""),
        ("decode batch 1", "llama.cpp", "llama-bench", ""),
        ("decode batch 1 at depth 8", "llama.cpp", "llama-bench", ""),
    ]
    assert all(r["validated"] and r["time_us"] > 0 for r in rows)
    assert 0 < rows[1]["bytes_moved"] < rows[2]["bytes_moved"]
    assert sum(n.startswith("user path: ") for n in report["notes"]) == 2 + 4 + 1  # + resume
    notes = report["notes"]
    assert notes[0] == f"file: qwen3moe-q4_k_m.gguf, {Q4_K_M.stat().st_size} bytes (842.28 KiB)"
    # the types llama.cpp's Q4_K_M gave this file (tests/data/llama_cpp/README.md)
    assert notes[1].startswith("tensor types (tensors, bytes), 27 tensors: Q4_K 13 (")
    assert ", F32 11 (" in notes[1] and ", Q6_K 3 (" in notes[1]
    assert notes[2].startswith("shape (qwen3moe): 2 layers, hidden 256")
    assert sum(n.startswith("decode batch ") and "bound" in n for n in notes) == 2
    (hist,) = [n for n in notes if n.startswith("prefill expert load histogram")]
    assert sum(json.loads(hist.rsplit(": ", 1)[1])) == 2 * 2  # layers x experts


def test_llama_bench_ran_on_the_same_file(cpu_run):
    _, report, args = cpu_run
    assert args == [
        "-m",
        str(Q4_K_M),
        "-ngl",
        "0",
        "-p",
        "8",
        "-n",
        "128",
        "-d",
        "0,8",
        "-r",
        "3",
        "-o",
        "json",
    ]
    pp, tg, tg_deep = report["results"][-3:]
    assert pp["case"] == "prefill 8 tokens: 4000 tokens/s" and pp["time_us"] == pytest.approx(
        8 / 4000 * 1e6
    )
    assert tg["case"] == "decode batch 1: 250 tokens/s" and tg["time_us"] == pytest.approx(
        1e6 / 250
    )
    assert tg_deep["case"] == "decode batch 1 at depth 8: 240 tokens/s" and tg_deep[
        "time_us"
    ] == pytest.approx(1e6 / 240)
    assert "its decode at depth 8 is where ftlab's decode rows run" in report["notes"][-1]


def test_hybrid_rows_beside_llama_cpp_ncmoe(tmp_path):
    """--hybrid-slots 1 of the file's 2 experts: ftlab's hybrid decode under both residency
    policies, then llama-bench again with -ncmoe at the same share of the expert bytes on the CPU (1
    of 2 layers), no prompt test."""
    binary = fake_llama_bench(tmp_path, LLAMA_BENCH_JSON)
    assert (
        cli.main(
            [
                "bench",
                "model",
                "--gguf",
                str(Q4_K_M),
                "--device",
                "cpu",
                "--prefill",
                "8",
                "--quick",
                "--llama-bench",
                str(binary),
                "--hybrid-slots",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    (path,) = tmp_path.glob("*-model-gguf-qwen3moe-q4_k_m.json")
    report = json.loads(path.read_text())
    measured = [r for r in report["results"] if r["kind"] != "user path"]
    rows = [(r["case"].split(":")[0], r["backend"], r["mode"]) for r in measured]
    assert rows[3:] == [
        ("hybrid decode batch 1, layers", "auto", "eager"),
        ("hybrid decode batch 1, static", "auto", "eager"),
        ("hybrid decode batch 1, lru", "auto", "eager"),
        ("prefill 8 tokens", "llama.cpp", "llama-bench"),
        ("decode batch 1", "llama.cpp", "llama-bench"),
        ("decode batch 1 at depth 8", "llama.cpp", "llama-bench"),
        ("hybrid decode batch 1, -ncmoe 1", "llama.cpp", "llama-bench"),
        ("hybrid decode batch 1, -ncmoe 1 at depth 8", "llama.cpp", "llama-bench"),
    ]
    assert all(r["validated"] and r["time_us"] > 0 for r in measured)
    assert json.loads((tmp_path / "args.json").read_text()) == [
        "-m",
        str(Q4_K_M),
        "-ngl",
        "0",
        "-ncmoe",
        "1",
        "-p",
        "0",
        "-n",
        "128",
        "-d",
        "0,8",
        "-r",
        "3",
        "-o",
        "json",
    ]
    notes = report["notes"]
    assert any(
        n.startswith(
            "hybrid decode: 1 of 2 routed experts a layer on the GPU, 50% of the expert bytes"
        )
        for n in notes
    )
    (static,) = [n for n in notes if n.startswith("hybrid decode (static)")]
    found = [int(x) for x in re.findall(r"on the GPU (\d+) times, on the CPU (\d+)", static)[0]]
    assert sum(found) == 4 * 2 and found[0] > 0 and found[1] > 0  # 4 timed steps x 2 layers x top-1
    (layers,) = [n for n in notes if n.startswith("hybrid decode (layers)")]
    assert "on the GPU 0 times, on the CPU 4 (timed steps, the 1 layers with CPU experts)" in layers


def test_cpu_layers_match_the_expert_share():
    from ftlab.bench.model import CONFIG
    from ftlab.bench.model_hybrid import llama_cpu_layers
    from ftlab.hybrid import cpu_layers

    assert [llama_cpu_layers(CONFIG, s) for s in (0, 32, 64, 96, 128)] == [48, 36, 24, 12, 0]
    assert cpu_layers(2, 2, 1) == 1  # half up
    assert cpu_layers(40, 256, 200) == 9  # 8.75
    with pytest.raises(ValueError, match=re.escape("slots must be an int in [0, 8], got 9")):
        cpu_layers(4, 8, 9)
    with pytest.raises(TypeError, match=re.escape("slots must be an int, got 2.0 (float)")):
        cpu_layers(4, 8, 2.0)
    with pytest.raises(ValueError, match="layers must be >= 0 and num_experts >= 1, got -1 and 8"):
        cpu_layers(-1, 8, 2)


def test_hybrid_arguments(tmp_path, capsys):
    with pytest.raises(ValueError, match=re.escape("hybrid_slots must be an int in [0, 2], got 3")):
        model_gguf.run(Q4_K_M, device="cpu", prefill=4, hybrid_slots=3)
    with pytest.raises(ValueError, match="hybrid_slots benches a qwen3moe file"):
        model_gguf.run(
            DATA / "gguf_qwen3_next" / "qwen35moe-hv2-q4_0.gguf",
            device="cpu",
            prefill=4,
            hybrid_slots=1,
        )
    with pytest.raises(ValueError, match="hybrid_slots must be an int >= 0, got -1"):
        model_gguf.run(Q4_K_M, device="cpu", hybrid_slots=-1)
    assert cli.main(["bench", "model", "--hybrid-slots", "4", "--no-write"]) == 1
    assert (
        "--hybrid-slots is an option of 'ftlab bench model --gguf FILE' only"
        in capsys.readouterr().err
    )
    only_pp = fake_llama_bench(tmp_path, LLAMA_BENCH_JSON[:1])
    with pytest.raises(RuntimeError, match="-ncmoe 1 -p 0 .* gave no decode result at depth 0"):
        model_gguf.run_llama_bench_ncmoe(only_pp, Q4_K_M, 1, gpu=False)
    # no -d support: depth-8 rows missing
    shallow = fake_llama_bench(tmp_path, LLAMA_BENCH_JSON[:2])
    with pytest.raises(RuntimeError, match="gave no decode result at depth 8"):
        model_gguf.run_llama_bench_ncmoe(shallow, Q4_K_M, 1, gpu=False, depth=8)


def test_decode_bytes_count_every_tensor_at_its_types_size():
    """Every expert used: a step reads every tensor of the file once, at its stored size (the F32
    ones loaded in fp32), but the embedding, of which it gathers one dense row a token."""
    config, weights = load_gguf(Q4_K_M, dtype=torch.float32, progress=False)
    stored = sum(int(t.n_bytes) for t in open_gguf(Q4_K_M).tensors if t.name != "token_embd.weight")
    for batch in (1, 8):
        got = decode_bytes(config, weights, config.num_experts, batch)
        assert got == stored + batch * config.hidden_size * 4


def test_qwen35moe_file(tmp_path):
    report = model_gguf.run(
        DATA / "gguf_qwen3_next" / "qwen35moe-hv2-q4_0.gguf", quick=True, device="cpu", prefill=4
    )
    assert report.name == "model-gguf-qwen35moe-hv2-q4_0"
    assert [(m.case.split(":")[0], m.kind) for m in report.measurements] == [
        ("load", "user path"),
        ("prefill 4 tokens", "user path"),
        *[(f"prefill 4 shared + 64 new tokens, {w}", "user path") for w in RESUMED],
        ("decode batch 1", "user path"),
        ("decode batch 1 at depth 4", "user path"),
        ("decode batch 1, top-p 0.95 at temperature 0.8", "user path"),
        ("perplexity of the held-out text", "user path"),
        ("prefill 4 tokens", "diagnostic"),
        ("decode batch 1", "diagnostic"),
        ("decode batch 8", "diagnostic"),
    ]
    assert all(m.validated for m in report.measurements if m.kind == "diagnostic")
    shape = "shape (qwen35moe): 2 layers (1 Gated DeltaNet + 1 gated attention)"
    assert report.notes[2].startswith(shape)


def test_llama_bench_failures(tmp_path):
    bad = fake_llama_bench(tmp_path, [], status=1)
    with pytest.raises(RuntimeError, match="exited 1"):
        model_gguf.run_llama_bench(bad, Q4_K_M, 8, gpu=False)
    only_pp = fake_llama_bench(tmp_path, LLAMA_BENCH_JSON[:1])
    with pytest.raises(RuntimeError, match="gave no decode or decode at depth 8 result"):
        model_gguf.run_llama_bench(only_pp, Q4_K_M, 8, gpu=False)
    shallow = fake_llama_bench(tmp_path, LLAMA_BENCH_JSON[:2])
    with pytest.raises(RuntimeError, match="gave no decode at depth 8 result"):
        model_gguf.run_llama_bench(shallow, Q4_K_M, 8, gpu=False)


def test_a_llama_bench_without_depth_gives_depth_zero_rows(tmp_path):
    """A llama-bench older than -d (it exits 1 on the option) is run again without it: its prefill
    and tg128 rows stand, the depth rows are missing, and a note says why."""
    script = tmp_path / "llama-bench"
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\nif '-d' in sys.argv: print('error: invalid "
        "parameter for argument: -d', file=sys.stderr); "
        f"sys.exit(1)\nprint({json.dumps(json.dumps(LLAMA_BENCH_JSON[:2]))})\n"
    )
    script.chmod(0o755)
    notes = []
    rows = model_gguf.run_llama_bench(script, Q4_K_M, 8, gpu=False, notes=notes)
    assert [r.case for r in rows] == [
        "prefill 8 tokens: 4000 tokens/s",
        "decode batch 1: 250 tokens/s",
    ]
    assert len(notes) == 1 and notes[0].startswith(
        "llama.cpp: no rows at depth 8 (llama-bench failed with -d:"
    )
    assert "invalid parameter for argument: -d" in notes[0]
    hybrid = model_gguf.run_llama_bench_ncmoe(script, Q4_K_M, 1, gpu=False, depth=8, notes=notes)
    assert [r.case for r in hybrid] == ["hybrid decode batch 1, -ncmoe 1: 250 tokens/s"] and len(
        notes
    ) == 2


def test_a_failing_llama_bench_keeps_ftlabs_rows(tmp_path):
    """llama-bench that cannot load the file: the report keeps ftlab's rows and says why."""
    bad = fake_llama_bench(tmp_path, [], status=1)
    report = model_gguf.run(Q4_K_M, quick=True, device="cpu", prefill=4, llama_bench=bad)
    assert [m.backend for m in report.measurements] == ["ftlab"] * 8 + ["auto"] * 3
    assert "llama.cpp: no figures" in report.notes[-1] and "exited 1" in report.notes[-1]


def test_arguments(tmp_path, capsys):
    with pytest.raises(
        ValueError, match=r"prefill must be an int >= 1 \(or a tuple of them\), got 0"
    ):
        model_gguf.run(Q4_K_M, device="cpu", prefill=0)
    with pytest.raises(ValueError, match="device must be 'cuda' or 'cpu', got 'meta'"):
        model_gguf.run(Q4_K_M, device="meta")
    with pytest.raises(ValueError, match="llama_bench must be the path of llama.cpp's llama-bench"):
        model_gguf.run(Q4_K_M, device="cpu", llama_bench=tmp_path / "none")
    with pytest.raises(TypeError, match="path must be a str or Path, got int"):
        model_gguf.run(3, device="cpu")
    for argv, message in [
        (["model", "--gguf", str(Q4_K_M), "--arch", "qwen3moe"], "--arch cannot go with --gguf"),
        (["model", "--gguf", str(Q4_K_M), "--layers", "2"], "--layers cannot go with --gguf"),
        (
            ["model", "--prefill", "8"],
            "--prefill is an option of 'ftlab bench model --gguf FILE' only",
        ),
        (
            ["model", "--device", "cpu"],
            "--device is an option of 'ftlab bench model --arch qwen35moe' and",
        ),
        (["q4_0", "--gguf", str(Q4_K_M)], "--gguf is an option of 'ftlab bench model' only"),
        (["model", "--gguf", str(tmp_path / "none.gguf"), "--device", "cpu"], "none.gguf"),
    ]:
        assert cli.main(["bench", *argv, "--no-write"]) == 1, argv
        assert message in capsys.readouterr().err, argv


def test_static_prefill_is_the_dynamic_one():
    """The bench's graph prefill row replays the static model (every cache slot read under a mask)
    and checks its next token against the eager (dynamic) pass: the two passes agree to rounding."""
    from ftlab.models.qwen3_moe import Qwen3Moe

    config, weights = load_gguf(Q4_K_M, device=torch.device("cpu"), dtype=torch.float32)
    tokens = torch.randint(
        0, config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0)
    )
    pos = torch.arange(24)[None]
    dynamic = Qwen3Moe(config, weights, max_batch=1, max_seq_len=32).forward(
        tokens, pos, last_only=True
    )
    static = Qwen3Moe(config, weights, max_batch=1, max_seq_len=32, static=True).forward(
        tokens, pos, last_only=True
    )
    assert dynamic.shape == static.shape == (1, 1, config.vocab_size)
    torch.testing.assert_close(static, dynamic, rtol=0, atol=1e-4 * float(dynamic.abs().max()))


def test_parted_note_says_how_a_failed_check_parted():
    want = torch.tensor([[1.0, 5.0, -2.0], [0.5, 0.25, 3.0]])
    got = want.clone()
    got[0, 2] = -2.5
    note = parted_note("decode batch 2: the graph step", got, want)
    assert "1 of 6 logits differ" in note and "max |diff| 0.5" in note and "largest logit 5" in note
    assert "greedy tokens the same" in note and "finite" in note
    got[1, 0] = float("inf")
    note = parted_note("x", got, want)
    assert "NOT finite" in note and "greedy tokens different" in note


def test_which_side_tells_the_replay_and_the_eager_steps_apart():
    """``which_side`` on the CPU, a stand-in graph: one that gives the eager step's logits again
    (equal to the step through the captured kernels), and one whose replays drift (each differs)."""
    from ftlab.models.qwen3_moe import Qwen3Moe

    config, weights = load_gguf(Q4_K_M, device=torch.device("cpu"), dtype=torch.float32)
    model = Qwen3Moe(config, weights, max_batch=1, max_seq_len=16, static=True)
    tokens, positions = torch.tensor([[3]]), torch.tensor([[5]])
    same = model.forward(tokens, positions).clone()
    note = which_side(
        lambda t, p: model.forward(t, p), model, tokens, positions, same.clone(), same
    )
    assert note.count("equal") == 3 and "differ" not in note
    drift = iter(range(1, 100))
    note = which_side(lambda t, p: same + next(drift), model, tokens, positions, same + 99, same)
    assert "a second replay and the first: differ" in note
    assert "a second eager step and the first: equal" in note
    assert note.endswith("exactly the captured kernels: differ")
    # a stable replay, apart
    note = which_side(lambda t, p: same + 99, model, tokens, positions, same + 99, same)
    assert "a second replay and the first: equal" in note and note.endswith(
        "exactly the captured kernels: differ"
    )

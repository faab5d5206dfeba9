"""``ftlab bench model --arch qwen35moe`` on the scaled-down shape: the report's rows and notes,
and the GGUF file it writes read back by ``read_gguf_hf`` as the same random model."""

import json

import pytest
import torch

from ftlab import cli
from ftlab.bench.qwen35moe_random import QWEN35_35B_A3B, SMALL, RandomTensors, Shape, hf_config
from ftlab.models.qwen3_next import Qwen3NextConfig, read_gguf_hf
from ftlab.quant import QuantWeight


def bench(tmp_path, *extra: str) -> tuple[int, dict]:
    status = cli.main(
        [
            "bench",
            "model",
            "--arch",
            "qwen35moe",
            "--small",
            "--quick",
            "--out",
            str(tmp_path),
            *extra,
        ]
    )
    (path,) = tmp_path.glob("*-model-qwen35moe-scaled.json")
    return status, json.loads(path.read_text())


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    status, report = bench(out, "--device", "cpu", "--write-gguf", str(out / "small.gguf"))
    return status, report, out / "small.gguf"


def test_report_rows_and_notes(cpu_run):
    status, report, _ = cpu_run
    assert status == 0 and report["name"] == "model-qwen35moe-scaled" and report["copy_gbps"] > 0
    rows = report["results"]
    assert [r["case"].split(":")[0] for r in rows] == [
        "prefill 32 tokens",
        "decode batch 1",
        "decode batch 8",
    ]
    assert all(r["validated"] and r["mode"] == "eager" and r["time_us"] > 0 for r in rows)
    assert rows[1]["bytes_moved"] > 0 and rows[2]["bytes_moved"] > rows[1]["bytes_moved"]
    notes = report["notes"]
    assert notes[0].startswith("shape: 4 layers (3 Gated DeltaNet + 1 gated attention), hidden 256")
    assert any(n.startswith("prefill logits: finite True") for n in notes)
    (hist,) = [n for n in notes if n.startswith("prefill expert load histogram")]
    counts = json.loads(hist.rsplit(": ", 1)[1])
    assert len(counts) == 8 and sum(counts) == SMALL.layers * SMALL.experts
    assert sum(n.startswith("decode batch ") and "bound" in n for n in notes) == 2


def test_gguf_reads_back_as_the_benched_model(cpu_run):
    _, _, path = cpu_run
    hf = hf_config(SMALL)
    config, tensors, perms = read_gguf_hf(path, dtype=torch.float32)
    assert perms == {}
    assert Qwen3NextConfig.from_hf(config) == Qwen3NextConfig.from_hf(hf)
    made = RandomTensors(hf, "cpu")
    assert set(tensors) == set(made)
    for name, want in made.items():
        got = tensors[name]
        if isinstance(want, QuantWeight):
            assert (
                isinstance(got, QuantWeight)
                and got.qtype == "Q4_0"
                and torch.equal(got.data, want.data)
            ), name
        elif name.endswith("A_log"):  # stored as -exp(A_log): back within the f32 rounding of exp
            torch.testing.assert_close(got, want, rtol=2**-23, atol=0)
        else:
            assert torch.equal(got, want.float()), name


def test_shape_options_belong_to_qwen35moe(capsys):
    assert cli.main(["bench", "model", "--layers", "2", "--no-write"]) == 1
    assert (
        "--layers is an option of 'ftlab bench model --arch qwen35moe' only"
        in capsys.readouterr().err
    )
    assert cli.main(["bench", "q4_0", "--arch", "qwen35moe", "--no-write"]) == 1
    assert "--arch is an option of 'ftlab bench model' only" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "model", "--arch", "qwen35moe", "--experts", "0"])
    assert e.value.code == 2 and "--experts must be >= 1, got 0" in capsys.readouterr().err


def test_shapes():
    assert hf_config(QWEN35_35B_A3B)["layer_types"].count("full_attention") == 10
    c = Qwen3NextConfig.from_hf(hf_config(QWEN35_35B_A3B))
    assert (c.num_hidden_layers, c.hidden_size, c.num_experts, c.vocab_size, c.rotary_dim) == (
        40,
        2048,
        256,
        248320,
        64,
    )
    assert SMALL.with_overrides(experts=1).top_k == 1
    with pytest.raises(ValueError, match="hidden must be a multiple of 32"):
        Shape(hidden=100)
    with pytest.raises(ValueError, match="layers must be an int >= 1"):
        Shape(layers=0)


@pytest.mark.gpu
def test_small_bench_on_the_gpu(tmp_path):
    status, report = bench(tmp_path, "--device", "cuda")
    assert status == 0
    modes = [(r["case"].split(":")[0], r["mode"]) for r in report["results"]]
    assert modes == [
        ("prefill 32 tokens", "eager"),
        ("prefill 32 tokens", "graph"),
        ("decode batch 1", "graph"),
        ("decode batch 1", "eager"),
        ("decode batch 8", "graph"),
        ("decode batch 8", "eager"),
    ]
    assert all(r["validated"] for r in report["results"])

"""``ftlab bench model --gguf FILE --tp 2`` under torchrun (two gloo processes on the CPU, a smoke
run; tests/data/llama_cpp's Q4_K_M file of the tiny Qwen3-MoE): rank 0 alone writes the report,
its decode bytes are a rank's, the all-reduce note is there; and the refusals of ``tp``."""

import json
from pathlib import Path

import pytest
import torch

from ftlab.bench import model_gguf
from ftlab.bench.model import decode_bytes
from ftlab.models.loader import load_gguf
from tests.parallel.test_tensor_parallel import torchrun

DATA = Path(__file__).parents[1] / "data"
Q4_K_M = DATA / "llama_cpp" / "qwen3moe-q4_k_m.gguf"


def test_bench_tp2_on_the_cpu(tmp_path):
    res = torchrun(
        "-m",
        "ftlab",
        "bench",
        "model",
        "--gguf",
        str(Q4_K_M),
        "--device",
        "cpu",
        "--prefill",
        "8",
        "--quick",
        "--tp",
        "2",
        "--out",
        str(tmp_path),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("| prefill 8 tokens") == 1  # rank 0 prints
    (path,) = tmp_path.glob("*.json")  # rank 0 writes
    report = json.loads(path.read_text())
    assert report["name"] == "model-gguf-qwen3moe-q4_k_m-tp2"
    rows = report["results"]
    assert [r["case"].split(":")[0] for r in rows] == [
        "prefill 8 tokens",
        "decode batch 1",
        "decode batch 8",
    ]
    assert all(r["validated"] and r["time_us"] > 0 for r in rows)
    config, weights = load_gguf(Q4_K_M, device=torch.device("cpu"), dtype=torch.float32)
    k, e = config.num_experts_per_tok, config.num_experts
    whole = decode_bytes(config, weights, e * (1 - (1 - k / e) ** 1), 1)
    # a rank's bytes: its experts, heads and vocabulary (this file's 256-column K-quant o_proj is
    # cut inside its blocks, so a rank holds its half dense: less than the whole, more than half)
    assert 0 < rows[1]["bytes_moved"] < whole
    notes = report["notes"]
    assert any(n.startswith("tp = 2 ranks") for n in notes)
    assert any(n.startswith("collectives: one all-reduce of float32 activations") for n in notes)


def test_bench_tp_refusals(tmp_path, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="tp must be"):
        model_gguf.run(Q4_K_M, device="cpu", tp=0)
    with pytest.raises(RuntimeError, match="torchrun"):
        model_gguf.run(Q4_K_M, device="cpu", tp=2)
    binary = tmp_path / "llama-bench"
    binary.write_text("")
    with pytest.raises(ValueError, match="llama_bench cannot go with tp > 1"):
        model_gguf.run(Q4_K_M, device="cpu", tp=2, llama_bench=binary)
    with pytest.raises(ValueError, match="qwen3moe file .Qwen3-MoE. only"):
        model_gguf.run(DATA / "gguf_qwen3_next" / "qwen35moe-hv2-q4_0.gguf", device="cpu", tp=2)

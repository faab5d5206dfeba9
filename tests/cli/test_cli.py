import subprocess
import sys

import pytest
import torch

from ftlab import cli


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "ftlab.cli", *args], capture_output=True, text=True
    )


def test_env():
    res = run("env")
    assert res.returncode == 0, res.stderr
    assert "platform :" in res.stdout and "torch    :" in res.stdout and "HIP JIT" in res.stdout


def test_env_with_faked_arch(monkeypatch):
    monkeypatch.setenv("FTLAB_ARCH", "gfx1151")
    text = cli.env_report()
    assert "gfx1151" in text and "RDNA3.5" in text and "UMA" in text and "wave32" in text


@pytest.fixture(scope="module")
def demo():
    return run("demo")


def test_demo_runs_every_backend(demo):
    res = demo
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert any(line.startswith("index  reference  yes") for line in lines)
    assert any(line.startswith("store  triton     yes") for line in lines)
    assert any(line.startswith("triton     identical       bit-exact") for line in lines)
    assert "NO" not in res.stdout and "DIFFERENT" not in res.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_bench_refuses_without_gpu():
    res = run("bench", "index_store", "--no-write")
    assert res.returncode != 0 and "needs a CUDA or ROCm GPU" in res.stderr


def test_unknown_bench_op():
    res = run("bench", "nope")
    assert res.returncode == 2 and "invalid choice" in res.stderr


def test_demo_runs_the_tiny_pipeline(demo):
    res = demo
    assert "== tiny Qwen3-MoE pipeline ==" in res.stdout
    for stage in (
        "embed",
        "layer 1 router",
        "layer 1 experts",
        "logits",
        "sample",
        "decode steps",
        "generated",
    ):
        assert stage in res.stdout, stage


def test_run_streams_tokens_and_rate(tmp_path):
    res = run("run", "--model", "tiny-qwen3-moe", "--prompt", "Hello world", "--max-new-tokens", "5", "--stages",
              "--quant", "f32", "--compare", "reference")  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "[layer 0 router]" in res.stdout and "tokens/s" in res.stdout and "max |diff|" in res.stdout
    )


def test_run_with_hybrid_experts():
    res = run("run", "--model", "tiny-qwen3-moe", "--prompt", "Hello world", "--max-new-tokens", "5",
              "--hybrid-slots", "4", "--graphs")  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[hybrid experts: 4 of 8 a layer" in res.stdout and "handshake" in res.stdout
    assert "hybrid residency over all layers:" in res.stdout and "tokens/s" in res.stdout

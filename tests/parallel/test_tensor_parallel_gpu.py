"""Tensor / expert parallelism on two GPUs (NCCL; RCCL on ROCm): the torchrun worker of
test_tensor_parallel.py with each rank on its own GPU, the auto backends and the decode step
captured in a CUDA/HIP graph with the collectives inside, against one GPU; and ``ftlab run --tp 2``
printing the one-GPU text. Skipped below two GPUs."""

import pytest
import torch

from tests.parallel.test_tensor_parallel import (
    LLAMA,
    WORKER,
    cli_matches_one_process,
    match_one_process,
    torchrun,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
    ),
]
#: fp32 models (HF and GGUF F32) and the dequant path of Q4_0 and K-quant files: the same values
#: up to the ranks' summation order
CASES = [
    "tiny-qwen3-moe:hf:auto",
    "tiny-qwen3-moe:q4_0:dequant",
    "tiny-qwen35-moe:hf:auto",
    "tiny-qwen3-next:q4_0:dequant",
    f"{LLAMA / 'qwen3moe-q4_k_m.gguf'}:hf:dequant",
]


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp_gpu") / "ranks.pt"
    with pytest.MonkeyPatch.context() as mp:  # the workers inherit it; restored after
        mp.setenv("FTLAB_TP_DEVICE", "cuda")
        res = torchrun(str(WORKER), str(out), *CASES)
    assert res.returncode == 0, res.stderr[-3000:]
    return torch.load(out)


@pytest.mark.parametrize("case", CASES, ids=[c.replace(str(LLAMA) + "/", "") for c in CASES])
def test_two_gpus_match_one_gpu(two_gpus, case, monkeypatch):
    """Next-token logits after the prompt and after 16 graph-replayed decode steps within 1e-4 of
    one GPU's, the 16 greedy tokens identical."""
    monkeypatch.setenv("FTLAB_TP_DEVICE", "cuda")
    match_one_process(case, two_gpus[case], ("logits", "last"))


def test_cli_tp_on_two_gpus_prints_the_one_gpu_text():
    cli_matches_one_process("cuda")

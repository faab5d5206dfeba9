"""Quantization ranks as it must: on llama.cpp's own quantizations of one model
(tests/data/llama_cpp: ``llama-quantize`` of a random Qwen3-MoE of K-quant-friendly shape),
``ftlab.eval``'s KL divergence against the F32 file (rewritten here, as make_files.py wrote it)
orders the files by their bits -- KLD(Q8_0) < KLD(Q6_K) < KLD(Q5_K_M) < KLD(Q4_K_M) < KLD(Q4_0)
-- and top-1 agreement the other way; on the CPU's reference backend, and on the GPU's."""

import importlib.util
import itertools
from pathlib import Path

import pytest
import torch

from ftlab import eval as fteval
from ftlab.models import tiny
from ftlab.models.pipeline import Pipeline
from ftlab.models.qwen3_moe import save_gguf
from ftlab.models.tokenizer import gguf_metadata

HERE = Path(__file__).resolve().parents[1] / "data" / "llama_cpp"
spec = importlib.util.spec_from_file_location("make_files", HERE / "make_files.py")
make_files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_files)
# fewest bits last
RANKED = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")
CTX = 64


@pytest.fixture(scope="module")
def f32_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("f32") / "f32.gguf"
    meta = gguf_metadata(tiny.train_tokenizer())
    return save_gguf(
        path, make_files.CONFIG, make_files.random_weights(make_files.CONFIG), metadata=meta
    )


def ranked(f32: Path, device: str, backend: str) -> list[fteval.EvalResult]:
    ids = torch.randint(
        make_files.CONFIG.vocab_size, (CTX * 16,), generator=torch.Generator().manual_seed(0)
    )
    ref = Pipeline.load(str(f32), device, max_seq_len=CTX, backends="reference")
    out = []
    for ftype in RANKED:
        pipe = Pipeline.load(
            str(HERE / f"qwen3moe-{ftype.lower()}.gguf"), device, max_seq_len=CTX, backends=backend
        )
        out.append(fteval.evaluate(pipe, ids, ctx=CTX, reference=ref, progress=False))
    return out


def check(results: list[fteval.EvalResult]) -> None:
    kld = [r.kl_divergence for r in results]
    top1 = [r.top1_agreement for r in results]
    assert all(a < b for a, b in itertools.pairwise(kld)), dict(zip(RANKED, kld, strict=True))
    assert all(a > b for a, b in itertools.pairwise(top1)), dict(zip(RANKED, top1, strict=True))
    assert kld[0] > 0


def test_kl_divergence_ranks_the_quantizations_by_their_bits(f32_file):
    check(ranked(f32_file, "cpu", "reference"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
@pytest.mark.parametrize("backend", ["triton", "hip"])
def test_kl_divergence_ranks_the_quantizations_on_the_gpu(f32_file, backend):
    check(ranked(f32_file, "cuda", backend))

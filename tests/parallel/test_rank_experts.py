"""A tensor-parallel rank reads only its experts: the Qwen3-MoE loaders take ``experts=(start,
stop)`` (GGUF: a view of the memory-mapped banks before gate and up are joined; HF: only those
experts' tensors), ``Pipeline.load(tp=N)`` passes the rank's range from the config, and the shard
keeps banks loaded that way as they are. The Qwen3-Next / Qwen3.5-MoE readers take a range too
(here: that the loaders accept it and rank_experts gives it; their banks in
test_rank_experts_next.py)."""

from pathlib import Path

import pytest
import torch

from ftlab.models import tiny
from ftlab.models.checkpoint_checks import expert_range
from ftlab.models.loader import load_gguf_model, load_hf
from ftlab.models.pipeline import rank_experts
from ftlab.models.qwen3_moe import load_gguf
from ftlab.models.tensor_parallel import TensorParallel, experts, rows
from ftlab.quant import QuantWeight

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_cpp"
pytestmark = pytest.mark.usefixtures("module_cache_dir")


def same(a, b) -> None:
    assert type(a) is type(b) and tuple(a.shape) == tuple(b.shape)
    if isinstance(a, QuantWeight):
        assert a.qtype == b.qtype and torch.equal(a.data, b.data)
    else:
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("file", ["qwen3moe-q4_k_m.gguf", "qwen3moe-q4_0.gguf"])
def test_gguf_banks_of_a_range_of_experts(file):
    c, full = load_gguf(LLAMA / file, dtype=torch.float32, progress=False)
    e0, e1 = c.num_experts // 2, c.num_experts
    c2, part = load_gguf(LLAMA / file, dtype=torch.float32, progress=False, experts=(e0, e1))
    assert c2 == c
    for lf, lp in zip(full.layers, part.layers, strict=True):
        same(lp.w_gate_up, rows(lf.w_gate_up, e0, e1))
        same(lp.w_down, rows(lf.w_down, e0, e1))
        same(lp.router, lf.router)  # every expert still scored
    same(part.lm_head, full.lm_head)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gguf_float_banks_of_a_range_of_experts(dtype):
    """F32 banks (the tiny model's f32 file), kept fp32 or cast: only the range, its own memory."""
    path = tiny.ensure("tiny-qwen3-moe") / "model-f32.gguf"
    c, full = load_gguf(path, dtype=dtype, progress=False)
    e0, e1 = 1, 3
    _, part = load_gguf(path, dtype=dtype, progress=False, experts=(e0, e1))
    for lf, lp in zip(full.layers, part.layers, strict=True):
        same(lp.w_gate_up, lf.w_gate_up[e0:e1])
        same(lp.w_down, lf.w_down[e0:e1])
        assert lp.w_down.untyped_storage().nbytes() == lp.w_down.numel() * lp.w_down.element_size()
    assert c.num_experts > e1


def test_hf_banks_of_a_range_of_experts():
    path = tiny.ensure("tiny-qwen3-moe")
    c, full = load_hf(path, dtype=torch.float32, progress=False)
    _, part = load_hf(path, dtype=torch.float32, progress=False, experts=(1, 3))
    for lf, lp in zip(full.layers, part.layers, strict=True):
        same(lp.w_gate_up, lf.w_gate_up[1:3])
        same(lp.w_down, lf.w_down[1:3])
    assert c.num_experts > 3


@pytest.mark.parametrize(
    "bad", [(2, 1), (0, 0), (-1, 2), (0, 9), [0, 1], (0.0, 1), (True, 2), (0, 1, 2)]
)
def test_expert_range_is_checked(bad):
    with pytest.raises(
        ValueError, match=r"experts must be \(start, stop\) with 0 <= start < stop <= 8"
    ):
        expert_range(bad, 8)


def test_qwen3_next_loaders_take_a_range():
    """Once refused; now the hybrid models' banks hold just the range, the router every expert."""
    path = tiny.ensure("tiny-qwen3-next")
    c, weights = load_hf(path, progress=False, experts=(0, 1))
    _, from_gguf, _ = load_gguf_model(path / "model-q4_0.gguf", progress=False, experts=(3, 5))
    for moe, held in ((weights.layers[0].moe, 1), (from_gguf.layers[-1].moe, 2)):
        assert (
            moe.w_gate_up.shape[0] == moe.w_down.shape[0] == held
            and moe.router.shape[0] == c.num_experts
        )


def test_rank_range_from_the_config():
    tp = TensorParallel(rank=1, world=2)
    c, _ = load_gguf(LLAMA / "qwen3moe-q4_0.gguf", progress=False)
    assert rank_experts(LLAMA / "qwen3moe-q4_0.gguf", tp) == (c.num_experts // 2, c.num_experts)
    moe = tiny.ensure("tiny-qwen3-moe")
    e = load_hf(moe, progress=False)[0].num_experts
    assert rank_experts(moe, tp) == (e // 2, e)
    # hybrid models: config.json and GGUF metadata alike
    for name in (
        "tiny-qwen3-next",
        "tiny-qwen35-moe",
    ):
        e = load_hf(tiny.ensure(name), progress=False)[0].num_experts
        assert rank_experts(tiny.ensure(name), tp) == (e // 2, e)
        assert rank_experts(tiny.ensure(name) / "model-q4_0.gguf", tp) == (e // 2, e)


def test_shard_takes_a_bank_of_the_rank_as_it_is():
    bank = torch.randn(4, 3, 2)
    same(experts(bank, 2, 4, 4), bank[2:4])
    part = bank[2:4]
    assert experts(part, 2, 4, 4) is part
    with pytest.raises(ValueError, match="neither all 4 nor this rank's 2"):
        experts(bank[:3], 2, 4, 4)

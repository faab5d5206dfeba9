"""Qwen3-MoE from GGUF (llama.cpp names and qwen3moe.* metadata): the F32 file equals the HF
path, the Q4_0 file equals the reference computed with its dequantized weights, and a long
greedy decode stays finite."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ftlab import ops  # noqa: E402
from ftlab.formats.gguf import read_tensors  # noqa: E402
from ftlab.models.loader import CheckpointError, load_gguf, load_hf, save_gguf  # noqa: E402
from ftlab.models.qwen3_moe import LayerWeights, ModelWeights, Qwen3Moe  # noqa: E402
from ftlab.quant import Q4_0Weight  # noqa: E402

# Q4_0 needs rows of whole 32-blocks
TINY = dict(
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    tie_word_embeddings=False,
    moe_intermediate_size=32,
)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from tests.models.test_qwen3_moe_oracle import make_checkpoint

    path = tmp_path_factory.mktemp("hf")
    make_checkpoint(path, seed=21, **TINY)
    return path


def prompt():
    return torch.randint(0, 320, (1, 11), generator=torch.Generator().manual_seed(4)), torch.arange(
        11
    )[None]


def dequantized(weights: ModelWeights) -> ModelWeights:
    def d(t):
        return ops.dequantize_q4_0(t, torch.float32) if isinstance(t, Q4_0Weight) else t

    layers = [
        LayerWeights(**{f: d(getattr(lw, f)) for f in lw.__dataclass_fields__})
        for lw in weights.layers
    ]
    return ModelWeights(d(weights.embed), layers, d(weights.norm), d(weights.lm_head))


def test_f32_gguf_equals_hf(hf_dir, tmp_path):
    config, weights = load_hf(hf_dir, dtype=torch.float32, progress=False)
    path = save_gguf(tmp_path / "tiny-f32.gguf", config, weights)
    config2, weights2 = load_gguf(path, dtype=torch.float32, progress=False)
    assert config2 == config
    tokens, positions = prompt()
    a = Qwen3Moe(config, weights).forward(tokens, positions)
    b = Qwen3Moe(config2, weights2).forward(tokens, positions)
    assert torch.equal(a, b)


def test_q4_0_gguf_equals_reference_with_dequantized_weights(hf_dir, tmp_path):
    config, weights = load_hf(hf_dir, dtype=torch.float32, progress=False)
    path = save_gguf(tmp_path / "tiny-q4_0.gguf", config, weights, quantize=True)
    assert isinstance(
        read_tensors(path, ["blk.0.ffn_up_exps.weight"])["blk.0.ffn_up_exps.weight"], Q4_0Weight
    )
    config_q, weights_q = load_gguf(path, dtype=torch.float32, progress=False)
    assert isinstance(weights_q.layers[0].w_gate_up, Q4_0Weight) and weights_q.layers[
        0
    ].w_gate_up.shape == (8, 64, 64)
    tokens, positions = prompt()
    q = Qwen3Moe(config_q, weights_q, q4_0_path="dequant").forward(tokens, positions)
    dense = Qwen3Moe(config_q, dequantized(weights_q)).forward(tokens, positions)
    torch.testing.assert_close(q, dense, rtol=1e-5, atol=1e-5)
    int8 = Qwen3Moe(config_q, weights_q, q4_0_path="int8").forward(tokens, positions)
    # Q8_1 activations: close, not equal
    assert (int8 - dense).abs().max() < 0.05 * dense.abs().max()
    hf = Qwen3Moe(config, weights).forward(tokens, positions)
    assert (q - hf).abs().max() < 0.2 * hf.abs().max()  # 4-bit weights: near the float model


def test_long_decode_is_finite(hf_dir):
    config, weights = load_hf(hf_dir, dtype=torch.float32, progress=False)
    model = Qwen3Moe(config, weights, max_seq_len=520)
    logits = model.forward(torch.tensor([[1, 2, 3]]), torch.arange(3)[None])
    token, pos = int(logits[0, -1].argmax()), 3
    for _ in range(512):
        logits = model.forward(torch.tensor([[token]]), torch.tensor([[pos]]))
        assert torch.isfinite(logits).all(), f"non-finite logits at position {pos}"
        token, pos = int(logits[0, -1].argmax()), pos + 1


def test_gguf_errors_name_the_problem(hf_dir, tmp_path):
    config, weights = load_hf(hf_dir, dtype=torch.float32, progress=False)
    path = save_gguf(tmp_path / "x.gguf", config, weights, metadata={})
    raw = path.read_bytes()
    (tmp_path / "trunc.gguf").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="trunc.gguf"):
        load_gguf(tmp_path / "trunc.gguf", progress=False)
    from ftlab.formats.gguf_write import write_tensors

    write_tensors(tmp_path / "llama.gguf", {"token_embd.weight": torch.zeros(4, 32)}, arch="llama")
    with pytest.raises(CheckpointError, match="general.architecture must be 'qwen3moe'"):
        load_gguf(tmp_path / "llama.gguf", progress=False)

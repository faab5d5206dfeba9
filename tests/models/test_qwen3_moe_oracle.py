"""ftlab's Qwen3-MoE against transformers' Qwen3MoeForCausalLM (the oracle), fp32, CPU.

Tiny random configurations written by transformers in HF format (per-expert tensors), loaded
through ftlab.models.loader: logits within 1e-4, greedy tokens identical, incremental decode
equal to the full-sequence forward.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ftlab.models.loader import CheckpointError, load_hf  # noqa: E402
from ftlab.models.qwen3_moe import Qwen3Moe  # noqa: E402

CONFIGS = {
    "gqa2-top2-norm": dict(
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        tie_word_embeddings=False,
    ),
    "gqa4-top1-raw-tied": dict(
        num_attention_heads=8,
        num_key_value_heads=2,
        num_experts_per_tok=1,
        norm_topk_prob=False,
        tie_word_embeddings=True,
    ),
    "mha-top4": dict(
        num_attention_heads=4,
        num_key_value_heads=4,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        tie_word_embeddings=False,
    ),
}


def make_checkpoint(tmp_path, seed: int, **overrides):
    torch.manual_seed(seed)
    base = dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=24,
        num_hidden_layers=2,
        head_dim=16,
        num_experts=8,
        max_position_embeddings=256,
        rope_theta=10000.0,
    )
    cfg = transformers.Qwen3MoeConfig(**{**base, **overrides})
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():  # a larger router spread so that routing really varies token to token
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 0.5)
    model.save_pretrained(tmp_path, safe_serialization=True)
    return model


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(tmp_path, name):
    oracle = make_checkpoint(tmp_path, seed=len(name), **CONFIGS[name])
    config, weights = load_hf(tmp_path, dtype=torch.float32, progress=False)
    model = Qwen3Moe(config, weights, max_batch=2, max_seq_len=64)
    tokens = torch.randint(0, 320, (2, 19), generator=torch.Generator().manual_seed(7))
    positions = torch.arange(19)[None].expand(2, 19)
    ours = model.forward(tokens, positions)
    with torch.no_grad():
        theirs = oracle(tokens).logits.float()
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_incremental_decode_equals_full_forward(tmp_path):
    make_checkpoint(tmp_path, seed=3, **CONFIGS["gqa2-top2-norm"])
    config, weights = load_hf(tmp_path, dtype=torch.float32, progress=False)
    tokens = torch.randint(0, 320, (1, 12), generator=torch.Generator().manual_seed(1))
    full = Qwen3Moe(config, weights, max_seq_len=32).forward(tokens, torch.arange(12)[None])
    step = Qwen3Moe(config, weights, max_seq_len=32)
    prefix = step.forward(tokens[:, :5], torch.arange(5)[None])
    outs = [prefix]
    for p in range(5, 12):
        outs.append(step.forward(tokens[:, p : p + 1], torch.tensor([[p]])))
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)


def test_greedy_tokens_match_transformers(tmp_path):
    oracle = make_checkpoint(tmp_path, seed=11, **CONFIGS["gqa2-top2-norm"])
    config, weights = load_hf(tmp_path, dtype=torch.float32, progress=False)
    model = Qwen3Moe(config, weights, max_seq_len=64)
    prompt = torch.randint(0, 320, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = oracle.generate(prompt, max_new_tokens=32, do_sample=False)[0, 6:].tolist()
    logits = model.forward(prompt, torch.arange(6)[None])
    ours, pos = [], 6
    nxt = int(logits[0, -1].argmax())
    for _ in range(32):
        ours.append(nxt)
        logits = model.forward(torch.tensor([[nxt]]), torch.tensor([[pos]]))
        pos += 1
        nxt = int(logits[0, -1].argmax())
    assert ours == theirs


def test_loader_errors_name_the_problem(tmp_path):
    make_checkpoint(tmp_path, seed=5, **CONFIGS["gqa2-top2-norm"])
    import json

    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError,
        match=r"missing tensor 'model\.layers\.1\.mlp\.experts\.3\.up_proj\.weight'",
    ):
        load_hf(tmp_path, progress=False)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(
        CheckpointError,
        match=r"model_type must be one of \['qwen3_5_moe', .*'qwen3_moe', .*got 'llama'",
    ):
        load_hf(tmp_path, progress=False)
    raw = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes(raw[: len(raw) // 3])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_hf(tmp_path, progress=False)


def test_static_forward_equals_dynamic(tmp_path):
    """static=True reads every cache slot under a mask (no host sync, graph-capturable)."""
    make_checkpoint(tmp_path, seed=9, **CONFIGS["gqa2-top2-norm"])
    config, weights = load_hf(tmp_path, dtype=torch.float32, progress=False)
    tokens = torch.randint(0, 320, (1, 9), generator=torch.Generator().manual_seed(5))
    dynamic, static = (
        Qwen3Moe(config, weights, max_seq_len=24),
        Qwen3Moe(config, weights, max_seq_len=24, static=True),
    )
    a = [dynamic.forward(tokens[:, :4], torch.arange(4)[None])]
    b = [static.forward(tokens[:, :4], torch.arange(4)[None])]
    for p in range(4, 9):
        a.append(dynamic.forward(tokens[:, p : p + 1], torch.tensor([[p]])))
        b.append(static.forward(tokens[:, p : p + 1], torch.tensor([[p]])))
    torch.testing.assert_close(torch.cat(b, 1), torch.cat(a, 1), rtol=1e-5, atol=1e-6)

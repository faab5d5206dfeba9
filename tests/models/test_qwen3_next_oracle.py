"""ftlab's Qwen3-Next / Qwen3.5-MoE against transformers' Qwen3NextForCausalLM,
Qwen3_5MoeForCausalLM and Qwen3_5MoeForConditionalGeneration (the oracles), fp32, CPU.

Tiny random configurations written by transformers in HF format, loaded through
ftlab.models.loader: logits within 1e-4 over prompts of several delta-rule chunks, greedy tokens
identical, prefill-then-decode (the recurrent path) equal to one full forward (the chunked one).
"""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ftlab.models.loader import CheckpointError, load_hf  # noqa: E402
from ftlab.models.qwen3_next import Qwen3Next  # noqa: E402

LIN, FULL = "linear_attention", "full_attention"
CONFIGS = {
    # Qwen3-Next: k/v head ratio 2, partial rotary 0.25, top 2 renormalized
    "next-r2-partial": dict(
        arch="next",
        layer_types=[LIN, FULL, LIN],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        partial_rotary_factor=0.25,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        shared_expert_intermediate_size=32,
        tie_word_embeddings=False,
    ),
    # Qwen3-Next: ratio 1, full rotary, top 1 raw, tied, full attention first
    "next-r1-tied": dict(
        arch="next",
        layer_types=[FULL, LIN],
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        partial_rotary_factor=1.0,
        num_experts_per_tok=1,
        norm_topk_prob=False,
        shared_expert_intermediate_size=48,
        tie_word_embeddings=True,
    ),
    # Qwen3.5 text model: ratio 2 over one key head, half rotary, top 4 of 8
    "q35-r2-top4": dict(
        arch="q35",
        layer_types=[LIN, LIN, FULL],
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        partial_rotary_factor=0.5,
        num_experts_per_tok=4,
        shared_expert_intermediate_size=16,
        tie_word_embeddings=False,
    ),
    # Qwen3.5 conditional generation (text under model.language_model., a vision tower ignored); the
    # shared expert as wide as the routed ones (Qwen3.6's 512 / 512): ftlab runs it as slot k of one
    # call
    "q35-vl": dict(
        arch="q35-vl",
        layer_types=[LIN, FULL],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        partial_rotary_factor=0.25,
        num_experts_per_tok=2,
        shared_expert_intermediate_size=24,
        tie_word_embeddings=False,
    ),
}
VOCAB = 320


def _randomize(model, seed: int) -> None:
    """Weights that keep activations O(1) and make every part matter: projections at fan-in
    scale, a wide router, zero-centred norms off zero, A_log and dt_bias spread."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" in name:
                continue
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(-2.0, 1.0, generator=g))
            elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:  # the (1 + w) norms
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            else:  # [out, in] linears, [E, out, in] banks, conv [C, 1, W]
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)


def make_checkpoint(tmp_path, name: str, seed: int = 0):
    spec = dict(CONFIGS[name])
    arch, factor = spec.pop("arch"), spec.pop("partial_rotary_factor")
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=len(spec["layer_types"]),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=8,
        moe_intermediate_size=24,
        max_position_embeddings=512,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": factor,
        },
    )
    torch.manual_seed(seed)
    if arch == "next":
        model = transformers.Qwen3NextForCausalLM(
            transformers.Qwen3NextConfig(**base, **spec, intermediate_size=96)
        )
    elif arch == "q35":
        model = transformers.Qwen3_5MoeForCausalLM(
            transformers.Qwen3_5MoeTextConfig(**base, **spec)
        )
    else:
        vision = dict(
            depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64
        )
        cfg = transformers.Qwen3_5MoeConfig(
            text_config={**base, **spec},
            vision_config=vision,
            tie_word_embeddings=spec["tie_word_embeddings"],
        )
        model = transformers.Qwen3_5MoeForConditionalGeneration(cfg)
    model = model.eval()
    _randomize(model, seed)
    model.save_pretrained(tmp_path, safe_serialization=True)
    return model


def _tokens(b: int, t: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(tmp_path, name):
    """Prompts of 150 tokens: three chunks of the chunked delta rule, the last one partial.
    The oracle's exact value is transformers' forward in float64: ftlab's fp32 logits within 1e-4
    of it -- about twice the fp32 rounding noise of these prompts, which reaches 3e-4 in
    transformers' own fp32 forward -- and so within 1e-4 plus that noise of the fp32 oracle."""
    oracle = make_checkpoint(tmp_path, name, seed=len(name))
    config, weights = load_hf(tmp_path, dtype=torch.float32, progress=False)
    model = Qwen3Next(config, weights, max_batch=2, max_seq_len=160)
    # one moe_experts call for the routed and shared experts where their widths match (q35-vl's)
    assert model.one_call == (set(range(config.num_hidden_layers)) if name == "q35-vl" else set())
    tokens = _tokens(2, 150, 7)
    ours = model.forward(tokens, torch.arange(150)[None].expand(2, 150)).double()
    with torch.no_grad():
        theirs = oracle(tokens).logits.double()
        oracle.set_experts_implementation("eager")  # the grouped-mm experts take no float64
        exact = oracle.double()(tokens).logits
    assert exact.abs().max() > 1.0  # logits of a size where 1e-4 means something
    assert (ours - exact).abs().max().item() <= 1e-4
    assert (ours - theirs).abs().max().item() <= 1e-4 + (theirs - exact).abs().max().item()


@pytest.mark.parametrize("name", ["next-r2-partial", "q35-vl"])
def test_greedy_tokens_match_transformers(tmp_path, name):
    oracle = make_checkpoint(tmp_path, name, seed=11)
    config, weights = load_hf(tmp_path, dtype=torch.float32, progress=False)
    model = Qwen3Next(config, weights, max_seq_len=64)
    prompt = _tokens(1, 6, 2)
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


@pytest.mark.parametrize("static", [False, True])
def test_prefill_then_decode_equals_full_forward(tmp_path, static):
    """A prefill of 130 tokens (chunked), 10 decode steps (the recurrent path), then a second
    prefill chunk continuing the state, against one forward of all 150; two sequences."""
    make_checkpoint(tmp_path, "next-r2-partial", seed=3)
    config, weights = load_hf(tmp_path, dtype=torch.float32, progress=False)
    tokens = _tokens(2, 150, 1)
    full = Qwen3Next(config, weights, max_batch=2, max_seq_len=160).forward(
        tokens, torch.arange(150)[None].expand(2, -1)
    )
    step = Qwen3Next(config, weights, max_batch=2, max_seq_len=160, static=static)

    def run(a: int, b: int) -> torch.Tensor:
        return step.forward(tokens[:, a:b], torch.arange(a, b)[None].expand(2, -1))

    outs = [run(0, 130), *(run(p, p + 1) for p in range(130, 140)), run(140, 150)]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-4)
    again = run(0, 150)  # position 0 starts the sequences afresh, whatever state they had
    torch.testing.assert_close(again, full, rtol=1e-5, atol=1e-4)


def test_loader_errors_name_the_problem(tmp_path):
    make_checkpoint(tmp_path, "q35-r2-top4", seed=5)
    from safetensors.torch import load_file, save_file

    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "layer_types": [LIN, LIN]}))
    with pytest.raises(
        CheckpointError, match="layer_types must name num_hidden_layers = 3 layers, got 2"
    ):
        load_hf(tmp_path, progress=False)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    with pytest.raises(CheckpointError, match="hidden_act must be 'silu'"):
        load_hf(tmp_path, progress=False)
    (tmp_path / "config.json").write_text(
        json.dumps({**cfg, "num_hidden_layers": 4, "layer_types": None})
    )
    with pytest.raises(
        CheckpointError, match=r"num_hidden_layers is 4, but the shards .* hold layers 0\.\.2"
    ):
        load_hf(tmp_path, progress=False)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.linear_attn.A_log"]
    tensors["model.layers.0.linear_attn.in_proj_z.weight"] = tensors[
        "model.layers.0.linear_attn.in_proj_z.weight"
    ][1:]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError, match=r"in_proj_z\.weight' has shape \(31, 64\), expected \(32, 64\)"
    ):
        load_hf(tmp_path, progress=False)
    del tensors["model.layers.0.linear_attn.in_proj_z.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError, match=r"missing tensor 'model\.layers\.0\.linear_attn\.in_proj_z\.weight'"
    ):
        load_hf(tmp_path, progress=False)


def test_triton_backends_under_the_interpreter_match_reference(tmp_path):
    """Every op with a Triton kernel through it (the interpreter on the CPU), the rest on the
    reference: logits and the recurrent path within 1e-4 of the all-reference model."""
    from ftlab import backends as ftbackends

    make_checkpoint(tmp_path, "next-r2-partial", seed=13)
    config, weights = load_hf(tmp_path, dtype=torch.float32, progress=False)
    triton = {op: "triton" for op in Qwen3Next.OPS if "triton" in ftbackends.backends_of(op)}
    assert {
        "causal_conv1d",
        "causal_conv1d_update",
        "gated_delta_rule",
        "gated_delta_step",
        "gated_rmsnorm",
        "output_gate",
        "qk_norm_rope",
    } <= set(triton)
    tokens = _tokens(1, 20, 4)
    results = []
    for backends in ({}, triton):
        model = Qwen3Next(
            config,
            weights,
            max_seq_len=24,
            backends=dict.fromkeys(Qwen3Next.OPS, "reference") | backends,
        )
        out = [model.forward(tokens[:, :17], torch.arange(17)[None])]
        out += [model.forward(tokens[:, p : p + 1], torch.tensor([[p]])) for p in range(17, 20)]
        results.append(torch.cat(out, 1))
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
def test_the_oracle_runs_transformers_torch_delta_rule(family):
    """The session fixture (tests/conftest.py) binds transformers' delta-rule names to its own torch
    functions, not to a wrapper that would call fla's kernels where fla is installed."""
    import importlib
    import inspect

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        fn = getattr(module, name)
        assert inspect.isfunction(fn) and not hasattr(fn, "__wrapped__"), (name, fn)
        assert fn.__module__ == module.__name__ and fn.__code__.co_name == name, (name, fn)


def test_the_patch_names_what_it_did_not_find():
    """A transformers that binds the functions some new way fails the session loudly."""
    import types

    from tests.conftest import torch_delta_rule

    module = types.ModuleType("transformers.models.x.modeling_x")
    module.torch_chunk_gated_delta_rule = torch.nn.Identity()
    named = r"modeling_x\.torch_chunk_gated_delta_rule: expected transformers' torch function"
    with pytest.raises(AssertionError, match=named):
        torch_delta_rule(module, "torch_chunk_gated_delta_rule")
    with pytest.raises(AssertionError, match=r"x\.torch_recurrent_gated_delta_rule: expected"):
        torch_delta_rule(module, "torch_recurrent_gated_delta_rule")  # absent

"""build_weights: the hybrid models' weights from HF-named tensors in the forms other loaders
(the GGUF one) hand over -- expert banks instead of per-expert tensors, packed Q4_0 and Q8_0
tensors, an out_proj stored with permuted columns."""

import json

import pytest
import torch
from safetensors.torch import load_file

from ftlab import ops
from ftlab.formats import CheckpointError
from ftlab.models import tiny
from ftlab.models.qwen3_next import Qwen3Next, Qwen3NextConfig, build_weights
from ftlab.quant import Q4_0Weight, QuantWeight

OUT = "model.layers.0.linear_attn.out_proj.weight"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Config and HF-named tensors (``model.`` prefix) of tiny-qwen35-moe."""
    path = tiny.ensure("tiny-qwen35-moe", tmp_path_factory.mktemp("tiny"))
    config = Qwen3NextConfig.from_hf(json.loads((path / "config.json").read_text()))
    tensors = {
        k.replace("model.language_model.", "model."): v
        for k, v in load_file(path / "model.safetensors").items()
    }
    return config, tensors


def _logits(config, weights, path: str = "auto") -> torch.Tensor:
    tokens = torch.randint(
        0, config.vocab_size, (1, 11), generator=torch.Generator().manual_seed(0)
    )
    model = Qwen3Next(config, weights, max_seq_len=16, q4_0_path=path, backends="reference")
    return model.forward(tokens, torch.arange(11)[None])


def _banks(tensors: dict, config, fused: bool) -> dict:
    """The per-expert tensors as HF's fused banks (gate_up_proj) or as gate / up banks."""
    out = {k: v for k, v in tensors.items() if ".mlp.experts." not in k}
    for i in range(config.num_hidden_layers):
        x = f"model.layers.{i}.mlp.experts."
        gate, up, down = (
            torch.stack([tensors[f"{x}{j}.{n}_proj.weight"] for j in range(config.num_experts)])
            for n in ("gate", "up", "down")
        )
        out[x + "down_proj"] = down
        if fused:
            out[x + "gate_up_proj"] = torch.cat([gate, up], dim=1)
        else:
            out[x + "gate_proj"], out[x + "up_proj"] = gate, up
    return out


def test_expert_banks_equal_per_expert_tensors(checkpoint):
    config, tensors = checkpoint
    want = _logits(config, build_weights(config, tensors))
    for fused in (True, False):
        torch.testing.assert_close(
            _logits(config, build_weights(config, _banks(tensors, config, fused))),
            want,
            rtol=0,
            atol=0,
        )


def test_permuted_out_proj_columns(checkpoint):
    """A dense out_proj stored with permuted columns is put back at load; a Q4_0 one is fed its
    input permuted: both give the model of the HF-ordered weight."""
    config, tensors = checkpoint
    perm = torch.randperm(config.value_dim, generator=torch.Generator().manual_seed(1))
    stored = tensors[OUT][:, perm]
    want = _logits(config, build_weights(config, tensors))
    dense = build_weights(config, {**tensors, OUT: stored.clone()}, input_perms={OUT: perm})
    assert dense.layers[0].mixer.out_perm is None
    torch.testing.assert_close(_logits(config, dense), want, rtol=0, atol=1e-5)
    packed = ops.quantize_q4_0(stored)
    q = build_weights(config, {**tensors, OUT: packed}, input_perms={OUT: perm})
    assert isinstance(q.layers[0].mixer.out_proj, Q4_0Weight) and torch.equal(
        q.layers[0].mixer.out_perm, perm
    )
    rounded = ops.dequantize_q4_0(packed)[:, perm.argsort()]  # the same rounded values, in HF order
    expected = _logits(config, build_weights(config, {**tensors, OUT: rounded}))
    torch.testing.assert_close(_logits(config, q, path="dequant"), expected, rtol=0, atol=1e-4)
    with pytest.raises(CheckpointError, match="must be a permutation of range"):
        build_weights(
            config, tensors, input_perms={OUT: torch.zeros(config.value_dim, dtype=torch.long)}
        )


def test_packed_tensors_of_other_types_run_dense(checkpoint):
    """Q8_0 tensors (no matmul kernel) are dequantized into dense weights; Q4_0 projections stay
    packed, and a Q4_0 norm or router is made dense."""
    config, tensors = checkpoint
    q8 = "model.layers.1.self_attn.o_proj.weight"
    router = "model.layers.1.mlp.gate.weight"
    w = build_weights(
        config,
        {
            **tensors,
            q8: ops.quantize(tensors[q8], "Q8_0"),
            router: ops.quantize_q4_0(tensors[router]),
        },
    )
    o_proj = w.layers[1].mixer.o_proj
    assert isinstance(o_proj, torch.Tensor) and not isinstance(o_proj, QuantWeight)
    torch.testing.assert_close(
        o_proj, tensors[q8], rtol=0, atol=float(tensors[q8].abs().max()) / 100
    )
    assert isinstance(w.layers[1].moe.router, torch.Tensor)


def test_missing_and_misshapen_tensors_are_named(checkpoint):
    config, tensors = checkpoint
    name = "model.layers.2.linear_attn.A_log"
    with pytest.raises(
        CheckpointError, match=r"gguf-x: missing tensor 'model\.layers\.2\.linear_attn\.A_log'"
    ):
        build_weights(config, {k: v for k, v in tensors.items() if k != name}, where="gguf-x")
    with pytest.raises(
        CheckpointError,
        match=r"'model\.layers\.2\.linear_attn\.A_log' has shape \(3,\), expected \(4,\)",
    ):
        build_weights(config, {**tensors, name: tensors[name][:3]})

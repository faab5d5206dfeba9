"""Qwen3.6 (qwen35moe) / Qwen3-Next (qwen3next) GGUF files: the ones llama.cpp's converter wrote
(tests/data/gguf_qwen3_next, README there) read back into exactly the HF state dict and config
they were made from; write_gguf_hf writes the converter's tensors byte for byte; packed weights
survive the V-head reordering. Hostile files and bad writes: test_gguf_qwen3_next_hostile.py."""

import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ftlab import ops
from ftlab.formats import DequantizedWarning
from ftlab.models.qwen3_next import read_gguf_hf, read_gguf_tokenizer, write_gguf_hf
from ftlab.models.qwen3_next.gguf_layout import hf_shapes, v_perm
from ftlab.models.qwen3_next.gguf_write import gguf_tensors, normalized_config
from ftlab.quant import Q4_0Weight, QuantWeight, quant_weight

QT = gguf.GGMLQuantizationType
DATA = Path(__file__).parent.parent / "data" / "gguf_qwen3_next"
FIXTURES = ["qwen35moe-hv2", "qwen35moe-hv1", "qwen3next-hv2"]
NORMS = (
    "layernorm.weight",
    "q_norm.weight",
    "k_norm.weight",
    "model.norm.weight",
    "mtp.norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)


def hf_checkpoint(name):
    """(HF config, HF state dict) that fixture ``name`` was converted from."""
    return json.loads((DATA / f"{name}.json").read_text()), load_file(
        str(DATA / f"{name}.safetensors")
    )


def _stored(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("name", FIXTURES)
def test_converter_file_reads_as_the_hf_checkpoint(name):
    hf_config, ref = hf_checkpoint(name)
    config, tensors, perms = read_gguf_hf(DATA / f"{name}.gguf", dtype=torch.float32)
    assert perms == {} and set(tensors) == set(ref)
    stored = _stored(DATA / f"{name}.gguf")
    for k, want in ref.items():
        got = tensors[k]
        assert got.dtype == torch.float32 and got.shape == want.shape, k
        if k.endswith(NORMS):  # stored as fl32(w + 1): w back to what the addition kept
            assert torch.equal(got, (want + 1) - 1), k
            assert (got - want).abs().max() <= 2.0**-24, k
        elif k.endswith("A_log"):  # stored as fl32(-exp(A_log)): the log of it, rounded once
            a = torch.from_numpy(
                np.array(
                    stored[
                        k.replace("model.layers.", "blk.").replace("linear_attn.A_log", "ssm_a")
                    ].data
                )
            )
            if "hv2" in name and "qwen35" in name:
                a = a[torch.argsort(v_perm(2, 4, 1))]
            assert torch.equal(-torch.exp(got), a), k
            ulp = torch.finfo(torch.float32).eps * want.abs().clamp_min(2**-126)
            # exp's error, relative, is log's absolute
            assert ((got - want).abs() <= 2.0**-23 + ulp / 2).all(), k
        else:
            assert torch.equal(got, want), k
    for key, value in config.items():
        if key == "rope_parameters":
            extra = {"mrope_section", "mrope_interleaved"} if name.startswith("qwen35") else set()
            assert {k: v for k, v in value.items() if k not in extra} == hf_config[key]
        elif key in hf_config and key != "full_attention_interval":
            assert value == hf_config[key], key
    assert {k for k in set(hf_config) - set(config) if hf_config[k] is not None} <= {
        "dtype",
        "transformers_version",
        "initializer_range",
        "output_router_logits",
        "router_aux_loss_coef",
        "use_cache",
        "attention_dropout",
        "pad_token_id",
    }


@pytest.mark.parametrize("name", FIXTURES)
def test_transformers_runs_what_was_read(name):
    transformers = pytest.importorskip("transformers")
    hf_config, ref = hf_checkpoint(name)
    config, tensors, _ = read_gguf_hf(DATA / f"{name}.gguf", dtype=torch.float32)

    def logits(cfg, weights):
        if cfg["model_type"] == "qwen3_5_moe_text":
            from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import (
                Qwen3_5MoeTextConfig as cls,
            )
        else:
            cls = transformers.Qwen3NextConfig
        cfg = {
            k: v
            for k, v in cfg.items()
            if k not in ("architectures", "model_type", "transformers_version")
        }
        model = getattr(transformers, hf_config["architectures"][0])(cls(**cfg)).eval()
        # transformers has no MTP
        dense = {k: v for k, v in weights.items() if not k.startswith("mtp.")}
        model.load_state_dict(dense, strict=not cfg.get("tie_word_embeddings"))
        with torch.no_grad():
            return model(torch.arange(1, 9)[None]).logits.double()

    want, got = logits(hf_config, ref), logits(config, tensors)
    # the norms and A_log differ from the checkpoint's in the last bit of w + 1 and exp(A_log)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


@pytest.mark.parametrize("name", FIXTURES)
def test_write_makes_the_converters_file(tmp_path, name):
    hf_config, ref = hf_checkpoint(name)
    fused = name == "qwen35moe-hv1"  # converted with --fuse-gate-up-exps --fuse-qkv
    path = write_gguf_hf(
        tmp_path / "w.gguf",
        hf_config,
        ref,
        tokenizer=read_gguf_tokenizer(DATA / f"{name}.gguf"),
        fuse_gate_up_exps=fused,
        fuse_qkv=fused,
    )
    want, got = gguf.GGUFReader(DATA / f"{name}.gguf"), gguf.GGUFReader(path)
    assert [t.name for t in sorted(got.tensors, key=lambda t: t.name)] == sorted(
        t.name for t in want.tensors
    )
    by_name = {t.name: t for t in got.tensors}
    for t in want.tensors:
        g = by_name[t.name]
        assert (g.tensor_type, g.shape.tolist()) == (t.tensor_type, t.shape.tolist()), t.name
        assert np.asarray(g.data).tobytes() == np.asarray(t.data).tobytes(), t.name
    for key, field in want.fields.items():
        if not key.startswith(("general.", "GGUF.")):
            assert [int(x) for x in got.fields[key].types] == [int(x) for x in field.types], key
            assert got.fields[key].contents() == field.contents(), key


def test_tokenizer_from_the_file():
    from ftlab.models.tiny import train_tokenizer

    tok, hf = read_gguf_tokenizer(DATA / "qwen35moe-hv2.gguf"), train_tokenizer()
    text = "The router sends every token to a few experts.<|endoftext|> Hello world!"
    assert tok.encode(text) == hf.encode(text).ids
    # a CONTROL token, matched whole
    assert tok.encode("<|endoftext|>") == [hf.token_to_id("<|endoftext|>")]
    plain = text.split("<|endoftext|>")[0]
    assert tok.decode(tok.encode(plain)) == plain
    assert tok.eos_token_id == hf.token_to_id("<|endoftext|>")


def _quantized_roundtrip(tmp_path, name, qtype):
    hf_config, ref = hf_checkpoint(name)
    first = write_gguf_hf(tmp_path / "a.gguf", hf_config, ref, types=qtype)
    config, tensors, perms = read_gguf_hf(first, dtype=torch.float32)
    second = write_gguf_hf(tmp_path / "b.gguf", config, tensors, types=qtype, input_perms=perms)
    return ref, tensors, perms, first, second


@pytest.mark.parametrize("name", ["qwen35moe-hv2", "qwen3next-hv2"])
@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q8_0], ids=lambda q: q.name)
def test_packed_weights_read_back_in_hf_order(tmp_path, name, qtype):
    ref, tensors, perms, first, second = _quantized_roundtrip(tmp_path, name, qtype)
    assert perms == {} and first.read_bytes() == second.read_bytes()
    for k in (
        "model.layers.0.linear_attn.out_proj.weight",
        "model.layers.1.mlp.experts.gate_up_proj",
        "model.layers.1.self_attn.q_proj.weight",
        "lm_head.weight",
        *(k for k in ref if "in_proj" in k),
    ):
        got = tensors[k]
        assert (
            isinstance(got, QuantWeight) and got.qtype == qtype.name and got.shape == ref[k].shape
        ), k
        if qtype == QT.Q4_0:
            assert isinstance(got, Q4_0Weight)
        # blocks lie along a row and within one V head (head dim 32): quantizing permutes with them
        want = gguf.quants.quantize(ref[k].numpy(), qtype)
        assert np.array_equal(got.data.numpy(), want), k


def test_columns_a_block_cannot_follow_come_with_an_input_perm(tmp_path):
    hf_config, ref = hf_checkpoint("qwen35moe-hv2")
    config = normalized_config(hf_config)
    k = "model.layers.0.linear_attn.out_proj.weight"
    rows = ref[k].shape[0]  # out_proj [64, 4 V heads * 64]: one Q4_K block a row spans all four
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (rows, 144), dtype=torch.uint8, generator=gen)
    ref_k = dict(ref)
    ref_k[k] = quant_weight(data, (rows, 256), "Q4_K")
    config = {**config, "linear_value_head_dim": 64}  # Hv * dv = 256
    with pytest.raises(ValueError, match="cannot be reordered"):
        gguf_tensors("qwen35moe", config, _resized(ref_k, config), None)
    perm = v_perm(2, 4, 64)
    path = write_gguf_hf(
        tmp_path / "k.gguf", config, _resized(ref_k, config), input_perms={k: perm}
    )
    _, tensors, perms = read_gguf_hf(path, dtype=torch.float32)
    assert set(perms) == {k} and torch.equal(perms[k], perm)
    assert isinstance(tensors[k], QuantWeight) and torch.equal(tensors[k].data, data)  # as stored
    x = torch.randn(3, 256, dtype=torch.float64, generator=gen)
    w = torch.randn(rows, 256, dtype=torch.float64, generator=gen)  # stored[:, t] = hf[:, perm[t]]
    hf = torch.empty_like(w)
    hf[:, perm] = w
    assert torch.allclose(torch.nn.functional.linear(x[..., perms[k]], w), x @ hf.T)


def _resized(tensors, config):
    """``tensors`` with the linear attention resized to ``config``'s value head dim (random)."""
    shapes = hf_shapes("qwen35moe", config)
    gen = torch.Generator().manual_seed(1)
    return {
        n: t if tuple(t.shape) == shapes[n] else torch.randn(shapes[n], generator=gen) * 0.05
        for n, t in tensors.items()
    }


def test_types_without_a_kernel_load_dense_with_a_warning(tmp_path):
    hf_config, ref = hf_checkpoint("qwen3next-hv2")
    path = write_gguf_hf(
        tmp_path / "q.gguf", hf_config, ref, types={"blk.0.attn_qkv.weight": QT.Q5_0}
    )
    with pytest.warns(DequantizedWarning, match="Q5_0: blk.0.attn_qkv.weight"):
        _, tensors, _ = read_gguf_hf(path, dtype=torch.float32)
    got = tensors["model.layers.0.linear_attn.in_proj_qkvz.weight"]
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert (
        got - ref["model.layers.0.linear_attn.in_proj_qkvz.weight"]
    ).abs().max() < 0.05 * math.sqrt(2)


def test_dense_reads_follow_dtype_and_pack_nothing_but_matmul_weights(tmp_path):
    hf_config, ref = hf_checkpoint("qwen35moe-hv2")
    path = write_gguf_hf(tmp_path / "q.gguf", hf_config, ref, types=QT.Q4_0)
    _, tensors, _ = read_gguf_hf(path)
    for k, t in tensors.items():
        packed = isinstance(t, QuantWeight)
        assert packed != k.endswith(
            (
                "norm.weight",
                "A_log",
                "dt_bias",
                "conv1d.weight",
                "mlp.gate.weight",
                "shared_expert_gate.weight",
                "embed_tokens.weight",
            )
        ), k
        assert packed or t.dtype == torch.bfloat16, k
    assert torch.equal(tensors["model.norm.weight"], (ref["model.norm.weight"] + 1 - 1).bfloat16())
    assert torch.equal(
        ops.dequantize(tensors["lm_head.weight"]),
        torch.from_numpy(
            gguf.quants.dequantize(
                gguf.quants.quantize(ref["lm_head.weight"].numpy(), QT.Q4_0), QT.Q4_0
            )
        ),
    )


@pytest.mark.gpu
def test_reads_onto_the_gpu(tmp_path):
    hf_config, ref = hf_checkpoint("qwen35moe-hv2")
    path = write_gguf_hf(tmp_path / "q.gguf", hf_config, ref, types=QT.Q4_0)
    _, on_cpu, _ = read_gguf_hf(path)
    _, on_gpu, _ = read_gguf_hf(path, device="cuda")
    for k, t in on_gpu.items():
        assert t.device.type == "cuda", k
        want = on_cpu[k]
        if isinstance(t, QuantWeight):
            assert torch.equal(t.data.cpu(), want.data), k
        else:
            assert torch.equal(t.cpu(), want), k


def test_fp16_checkpoints_are_transformed_in_fp16_as_the_converter_does(tmp_path):
    hf_config, ref = hf_checkpoint("qwen35moe-hv2")
    half = {k: v.half() for k, v in ref.items()}
    stored = gguf_tensors("qwen35moe", normalized_config(hf_config), half)
    want = (half["model.norm.weight"] + 1).float()
    assert stored["output_norm.weight"].dtype == torch.float32
    assert torch.equal(stored["output_norm.weight"], want)


def test_fused_packed_files_read_as_the_split_ones(tmp_path):
    hf_config, ref = hf_checkpoint("qwen35moe-hv1")
    split = write_gguf_hf(tmp_path / "s.gguf", hf_config, ref, types=QT.Q8_0)
    fused = write_gguf_hf(
        tmp_path / "f.gguf", hf_config, ref, types=QT.Q8_0, fuse_gate_up_exps=True, fuse_qkv=True
    )
    names = {t.name for t in gguf.GGUFReader(fused).tensors}
    assert "blk.2.attn_qkv.weight" in names and "blk.2.attn_q.weight" not in names
    assert "blk.0.ffn_gate_up_exps.weight" in names and "blk.0.ffn_gate_exps.weight" not in names
    (_, want, _), (_, got, _) = read_gguf_hf(split), read_gguf_hf(fused)
    assert set(got) == set(want)
    for k, t in got.items():
        if isinstance(t, QuantWeight):
            assert (
                t.qtype == "Q8_0" and t.shape == want[k].shape and torch.equal(t.data, want[k].data)
            ), k
        else:
            assert torch.equal(t, want[k]), k


def test_llama_quantize_files_read_packed_in_hf_order(tmp_path):
    hf_config, ref = hf_checkpoint("qwen35moe-hv2")
    path = DATA / "qwen35moe-hv2-q4_0.gguf"
    _, tensors, perms = read_gguf_hf(path, dtype=torch.float32)
    assert perms == {} and set(tensors) == set(ref)
    packed = {k: t for k, t in tensors.items() if isinstance(t, QuantWeight)}
    assert {t.qtype for t in packed.values()} == {"Q4_0", "Q8_0"} and len(packed) == 20
    for k, t in packed.items():  # llama.cpp's quantizers are gguf-py's, block for block
        want = gguf.quants.quantize(ref[k].numpy(), QT[t.qtype])
        assert np.array_equal(t.data.numpy(), want), k
    types = {
        t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors if t.tensor_type != QT.F32
    }
    mine = write_gguf_hf(tmp_path / "m.gguf", hf_config, ref, types=types)
    stored = _stored(mine)
    for t in gguf.GGUFReader(path).tensors:
        assert stored[t.name].tensor_type == t.tensor_type, t.name
        assert np.asarray(stored[t.name].data).tobytes() == np.asarray(t.data).tobytes(), t.name


def test_llama_quantize_fallback_types_load_dense():
    _, ref = hf_checkpoint("qwen35moe-hv2")
    with pytest.warns(DequantizedWarning, match="Q5_0"):
        _, tensors, _ = read_gguf_hf(DATA / "qwen35moe-hv2-q4_k_m.gguf", dtype=torch.float32)
    for k, t in tensors.items():
        got = ops.dequantize(t) if isinstance(t, QuantWeight) else t
        # Q5_0 (the coarsest here): d = amax / 16 with the 32 levels clamped, so a value of the
        # other sign than the block's extreme is off by up to d; plus the fp16 rounding of d
        # times at most 16 steps: amax * (1/16 + 2^-11) <= amax * (1/16 + 1/1024)
        assert (got - ref[k]).abs().max() <= ref[k].abs().max() * (1 / 16 + 1 / 1024), k

"""Hostile Qwen3.6 (qwen35moe) / Qwen3-Next (qwen3next) GGUF files and bad writes: a file missing
a tensor or a metadata key, with a tensor of the wrong shape, an extra tensor, a packed vector
or metadata of the wrong type or inconsistent with the tensors is refused by read_gguf_hf naming
the file and the key or tensor; write_gguf_hf refuses bad arguments and writes nothing. The files
read and written as the converter does: test_gguf_qwen3_next.py."""

import gguf
import numpy as np
import pytest
import torch

from ftlab.formats.gguf import GGUFError
from ftlab.formats.gguf_write import write_tensors
from ftlab.models.qwen3_next import read_gguf_hf, write_gguf_hf
from ftlab.models.qwen3_next.gguf_write import (
    arch_of,
    gguf_metadata_of,
    gguf_tensors,
    normalized_config,
)
from tests.formats.test_gguf_qwen3_next import DATA, hf_checkpoint

QT = gguf.GGMLQuantizationType


def _hostile(tmp_path, name="qwen35moe-hv2", drop=(), replace=None, meta=None):
    hf_config, ref = hf_checkpoint(name)
    c = normalized_config(hf_config)
    arch = arch_of(c)
    tensors = {k: v for k, v in gguf_tensors(arch, c, ref).items() if k not in drop}
    tensors |= replace or {}
    return write_tensors(
        tmp_path / "bad.gguf",
        tensors,
        arch=arch,
        metadata={**gguf_metadata_of(arch, c), **(meta or {})},
    )


def test_a_missing_tensor_is_refused(tmp_path):
    path = _hostile(tmp_path, drop={"blk.0.ssm_a"})
    with pytest.raises(GGUFError, match=rf"{path}: missing tensor 'blk.0.ssm_a'"):
        read_gguf_hf(path)


def test_a_wrong_shape_is_refused(tmp_path):
    path = _hostile(tmp_path, replace={"blk.0.attn_gate.weight": torch.zeros(127, 64)})
    with pytest.raises(
        GGUFError,
        match=rf"{path}: tensor 'blk.0.attn_gate.weight' has shape \[127, 64\], expected \[128, "
        r"64\]",
    ):
        read_gguf_hf(path)


A = "qwen35moe."


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({A + "ssm.state_size": "32"}, "'qwen35moe.ssm.state_size' must be an integer, got STRING"),
        (
            {A + "attention.layer_norm_rms_epsilon": 1},
            "'qwen35moe.attention.layer_norm_rms_epsilon' must be a float",
        ),
        (
            {A + "attention.recurrent_layers": [1, 0]},
            "'qwen35moe.attention.recurrent_layers' must be an array of BOOL",
        ),
        ({A + "attention.recurrent_layers": [True]}, "has 1 entries, 'qwen35moe.block_count' is 2"),
        (
            {A + "ssm.time_step_rank": 3},
            "'qwen35moe.ssm.time_step_rank' \\(3\\) must be a multiple",
        ),
        (
            {A + "block_count": 3, A + "attention.recurrent_layers": [True, False, False]},
            "'qwen35moe.block_count' is 3, but there are no tensors of blk.2",
        ),
        (
            {A + "block_count": 1, A + "attention.recurrent_layers": [True]},
            "tensors of blk.1, beyond the 1 blocks of metadata 'qwen35moe.block_count'",
        ),
        ({A + "expert_count": 0}, "'qwen35moe.expert_count' must be >= 1, got 0"),
        (
            {A + "attention.value_length": 16},
            "'qwen35moe.attention.value_length' \\(16\\) must equal",
        ),
    ],
)
def test_wrong_metadata_is_refused(tmp_path, meta, message):
    path = _hostile(tmp_path, meta=meta)
    with pytest.raises(GGUFError, match=rf"{path}: .*({message})"):
        read_gguf_hf(path)


def test_a_missing_key_and_an_extra_tensor_are_refused(tmp_path):
    path = _hostile(tmp_path, replace={"blk.0.ssm_extra.weight": torch.zeros(4)})
    with pytest.raises(
        GGUFError, match="tensor 'blk.0.ssm_extra.weight' is not part of this model"
    ):
        read_gguf_hf(path)
    hf_config, ref = hf_checkpoint("qwen35moe-hv2")
    c = normalized_config(hf_config)
    meta = {
        k: v
        for k, v in gguf_metadata_of("qwen35moe", c).items()
        if k != "qwen35moe.ssm.conv_kernel"
    }
    path = write_tensors(
        tmp_path / "nokey.gguf", gguf_tensors("qwen35moe", c, ref), arch="qwen35moe", metadata=meta
    )
    with pytest.raises(
        GGUFError, match=rf"{path}: missing metadata key 'qwen35moe.ssm.conv_kernel'"
    ):
        read_gguf_hf(path)


def test_write_refuses_bad_arguments_and_writes_nothing(tmp_path):
    hf_config, ref = hf_checkpoint("qwen35moe-hv2")
    path = tmp_path / "x.gguf"
    cases = [
        (
            ValueError,
            "misses 'model.layers.0.linear_attn.A_log'",
            {k: v for k, v in ref.items() if not k.endswith("0.linear_attn.A_log")},
            hf_config,
        ),
        (
            ValueError,
            r"must have shape \[4\], got \[5\]",
            {**ref, "model.layers.0.linear_attn.A_log": torch.zeros(5)},
            hf_config,
        ),
        (
            TypeError,
            "must be a float tensor or a QuantWeight, got torch.int64",
            {**ref, "model.norm.weight": torch.zeros(64, dtype=torch.long)},
            hf_config,
        ),
        (
            ValueError,
            r"hf_config\['linear_num_key_heads'\] must be an int >= 1",
            ref,
            {**hf_config, "linear_num_key_heads": 0},
        ),
        (
            ValueError,
            "must describe one of",
            ref,
            {**hf_config, "architectures": ["X"], "model_type": "x"},
        ),
    ]
    for exc, message, tensors, config in cases:
        with pytest.raises(exc, match=message):
            write_gguf_hf(path, config, tensors)
        assert not path.exists()
    with pytest.raises(ValueError, match="types names 'blk.9.attn_q.weight'"):
        write_gguf_hf(path, hf_config, ref, types={"blk.9.attn_q.weight": QT.Q4_0})
    assert not path.exists()


def test_dtype_is_checked_first():
    with pytest.raises(TypeError, match="dtype must be one of"):
        read_gguf_hf(DATA / "missing.gguf", dtype=torch.int8)


def test_a_packed_vector_is_refused(tmp_path):
    from ftlab.formats.gguf_write import Blocks

    q8 = gguf.quants.quantize(np.ones((1, 64), np.float32), QT.Q8_0).reshape(-1)
    path = _hostile(tmp_path, replace={"output_norm.weight": Blocks(q8, QT.Q8_0)})
    with pytest.raises(
        GGUFError, match=rf"{path}: tensor 'output_norm.weight' is a vector of Q8_0 blocks"
    ):
        read_gguf_hf(path)

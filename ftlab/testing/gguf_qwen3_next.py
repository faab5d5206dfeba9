"""Tiny Qwen3.6 (``Qwen3_5MoeForCausalLM``) and Qwen3-Next (``Qwen3NextForCausalLM``) HF
checkpoints with random weights, and their conversion by llama.cpp's own converter.

``python -m ftlab.testing.gguf_qwen3_next LLAMA_CPP_DIR OUT_DIR`` writes, for every entry of
:data:`FIXTURES`, ``OUT_DIR/<name>.gguf`` (converted with ``--outtype f32``, ``--no-mtp`` for those
without an MTP head, and the fixture's own flags) and ``OUT_DIR/<name>.safetensors`` (the HF state
dict, transformers' names), plus ``OUT_DIR/<name>.json`` (the HF config): the files ``tests/data``
holds.

The converter picks the pre-tokenizer by hashing the ids its tokenizer gives a fixed text; the
tiny byte-level BPE (``ftlab.models.tiny.train_tokenizer``) matches no known hash, so the
conversion runs with ``get_vocab_base_pre`` answering the Qwen pre-tokenizer name
(``qwen35`` for Qwen3.5/3.6, ``qwen2`` for Qwen3-Next), which is what the converter writes
for the real Qwen tokenizers. Everything else is the converter's unchanged code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from ftlab.models.qwen3_next.gguf_layout import hf_shapes

_COMMON = dict(
    vocab_size=384,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    layer_types=["linear_attention", "full_attention"],
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    eos_token_id=0,
)
#: name -> (transformers class name, config overrides, seed, more converter flags).
FIXTURES: dict[str, tuple[str, dict, int, tuple[str, ...]]] = {
    "qwen35moe-hv2": (
        "Qwen3_5MoeForCausalLM",
        dict(linear_num_key_heads=2, linear_num_value_heads=4),
        0,
        (),
    ),
    "qwen35moe-hv1": (
        "Qwen3_5MoeForCausalLM",
        dict(
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            tie_word_embeddings=True,
            mtp_num_hidden_layers=1,
        ),
        1,
        ("--fuse-gate-up-exps", "--fuse-qkv"),
    ),
    "qwen3next-hv2": (
        "Qwen3NextForCausalLM",
        dict(
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            full_attention_interval=2,
            decoder_sparse_step=1,
            intermediate_size=64,
        ),
        2,
        (),
    ),
}
_PRE = {"Qwen3_5MoeForCausalLM": "qwen35", "Qwen3NextForCausalLM": "qwen2"}
GGUF_ARCH = {"Qwen3_5MoeForCausalLM": "qwen35moe", "Qwen3NextForCausalLM": "qwen3next"}


def make_model(arch: str, overrides: dict, seed: int):
    """A randomly initialised transformers model of ``arch`` with the tiny config; norms,
    A_log and dt_bias drawn too, so that every tensor is distinct."""
    import transformers

    if arch == "Qwen3_5MoeForCausalLM":
        from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import (
            Qwen3_5MoeTextConfig as cls,
        )
    else:
        cls = transformers.Qwen3NextConfig
    torch.manual_seed(seed)
    config = cls(**{**_COMMON, **overrides})
    model = getattr(transformers, arch)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or name.endswith(("A_log", "dt_bias")):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if name.endswith("A_log") else 0.0))
            else:
                p.copy_(torch.randn_like(p) * 0.05)
    return model


def mtp_weights(arch: str, config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random multi-token-prediction tensors (``mtp.*``, fused expert banks) for ``config``:
    transformers builds no MTP module, real checkpoints carry one."""
    gen = torch.Generator().manual_seed(seed + 1000)
    shapes = hf_shapes(GGUF_ARCH[arch], config)
    out = {}
    for name, shape in shapes.items():
        if name.startswith("mtp."):
            scale, shift = (0.1, 0.0) if len(shape) == 1 else (0.05, 0.0)
            out[name] = torch.randn(shape, generator=gen) * scale + shift
    return out


def on_disk(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fused expert banks split per expert, as checkpoints store them."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("experts.gate_up_proj"):
            p, inter = name.removesuffix("gate_up_proj"), t.shape[1] // 2
            for j in range(t.shape[0]):
                out[f"{p}{j}.gate_proj.weight"] = t[j, :inter].contiguous()
                out[f"{p}{j}.up_proj.weight"] = t[j, inter:].contiguous()
        elif name.endswith("experts.down_proj"):
            for j in range(t.shape[0]):
                out[f"{name.removesuffix('down_proj')}{j}.down_proj.weight"] = t[j].contiguous()
        else:
            out[name] = t
    return out


def write_checkpoint(directory: Path, arch: str, overrides: dict, seed: int) -> None:
    """config.json, model.safetensors and the tiny tokenizer in ``directory``."""
    from safetensors.torch import load_file, save_file

    from ftlab.models.tiny import train_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    model = make_model(arch, overrides, seed)
    model.save_pretrained(directory)
    if overrides.get("mtp_num_hidden_layers"):
        config = json.loads((directory / "config.json").read_text())
        tensors = load_file(str(directory / "model.safetensors"))
        tensors |= on_disk(mtp_weights(arch, config, seed))
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    train_tokenizer().save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"})
    )


def convert(
    llama_cpp: Path,
    directory: Path,
    out: Path,
    arch: str,
    outtype: str = "f32",
    flags: tuple[str, ...] = (),
) -> None:
    """Run llama.cpp's ``convert_hf_to_gguf.py`` (with its own gguf-py) on ``directory``."""
    script = (
        "import sys; sys.argv = sys.argv[1:]; import runpy, conversion.base as b; "
        f"b.TextModel.get_vocab_base_pre = lambda self, tok: {_PRE[arch]!r}; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    env = {**os.environ, "PYTHONPATH": f"{llama_cpp / 'gguf-py'}{os.pathsep}{llama_cpp}"}
    cmd = [
        sys.executable,
        "-c",
        script,
        str(llama_cpp / "convert_hf_to_gguf.py"),
        str(directory),
        "--outtype",
        outtype,
        "--outfile",
        str(out),
    ]
    if not json.loads((directory / "config.json").read_text()).get("mtp_num_hidden_layers"):
        cmd.append("--no-mtp")
    cmd += flags
    subprocess.run(cmd, env=env, check=True, capture_output=True)


def main(argv: list[str]) -> None:
    import shutil
    import tempfile

    from safetensors.torch import save_file

    llama_cpp, out_dir = Path(argv[0]), Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (arch, overrides, seed, flags) in FIXTURES.items():
        with tempfile.TemporaryDirectory() as tmp:
            hf = Path(tmp) / name
            write_checkpoint(hf, arch, overrides, seed)
            convert(llama_cpp, hf, out_dir / f"{name}.gguf", arch, flags=flags)
            model = make_model(arch, overrides, seed)
            state = {k: v.contiguous() for k, v in model.state_dict().items()}
            if model.config.tie_word_embeddings:
                state.pop("lm_head.weight", None)
            state |= mtp_weights(arch, json.loads((hf / "config.json").read_text()), seed)
            save_file(state, str(out_dir / f"{name}.safetensors"))
            shutil.copy(hf / "config.json", out_dir / f"{name}.json")


if __name__ == "__main__":
    main(sys.argv[1:])

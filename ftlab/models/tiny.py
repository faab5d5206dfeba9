"""Built-in tiny checkpoints: deterministic, written on first use.

Each tiny model exists as a HF directory (``config.json``, ``model.safetensors`` with the
per-expert tensor names of real Qwen3-MoE checkpoints, a byte-level BPE ``tokenizer.json``
trained on a small built-in text) and as GGUF files (``model-f32.gguf``, ``model-q4_0.gguf``
with its matmul weights Q4_0) with the tokenizer in ``tokenizer.ggml.*`` metadata. The tiny
hybrid models (:data:`ftlab.models.qwen3_next.tiny.HYBRID_MODELS`: Qwen3.5-MoE, Qwen3-Next) are
HF checkpoints of their own layout, and their GGUF files are what llama.cpp's converter makes of
them (``qwen35moe`` / ``qwen3next``, written by
:func:`~ftlab.models.qwen3_next.gguf_write.write_gguf_hf`). Router weights are drawn, not zero,
so routing spreads over the experts. The default cache is ``~/.cache/ftlab/tiny``
(``FTLAB_CACHE_DIR``).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import torch

from ftlab.models import trained
from ftlab.models.qwen3_next.tiny import (
    HYBRID_MODELS,
    hybrid_config,
    hybrid_weights,
    write_hybrid_gguf,
)
from ftlab.models.trained import TRAINED_MODELS

QWEN3_MOE_MODELS: dict[str, dict] = {
    "tiny-qwen3-moe": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        seed=0,
    ),
    "tiny-qwen3-moe-wide": dict(
        hidden_size=128,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=64,
        norm_topk_prob=False,
        tie_word_embeddings=True,
        seed=1,
    ),
}
TINY_MODELS: dict[str, dict] = {
    **QWEN3_MOE_MODELS,
    **HYBRID_MODELS,
    # the trained models shipped (ftlab.models.trained): their files expanded on first use
    **{name: {"trained": str(src)} for name, src in TRAINED_MODELS.items()},
}
#: the model ``Pipeline.load()`` and ``ftlab run`` take when none is named: the trained Qwen3-MoE
#: where it is shipped (it writes text a person can read), else the random one
DEFAULT = "trained-qwen3-moe" if "trained-qwen3-moe" in TRAINED_MODELS else "tiny-qwen3-moe"
VOCAB_SIZE = 384
CORPUS = """\
The lab measures kernels for a mixture of experts model. Every operator has a reference, a
Triton kernel and a HIP kernel, and the tests hold each kernel to the reference. A router sends
every token to a few experts; the experts are small feed-forward networks. Quantized weights
keep four bits per value and one scale per block of thirty-two. The cache keeps keys and values
for every position, so a decode step reads what earlier steps wrote. Hello world! Radeon and
Instinct GPUs, NVIDIA GPUs and the CPU all run the same model, step by step.
"""


def cache_dir() -> Path:
    return Path(os.environ.get("FTLAB_CACHE_DIR", Path.home() / ".cache" / "ftlab")) / "tiny"


def ensure(name: str = DEFAULT, root: Path | None = None) -> Path:
    """The directory of tiny model ``name``, written first if absent."""
    if name not in TINY_MODELS:
        raise ValueError(f"tiny model must be one of {sorted(TINY_MODELS)}, got {name!r}")
    # a changed recipe gets a new directory
    path = (root or cache_dir()) / f"{name}-{spec_digest(name)}"
    if (path / "model-q4_0.gguf").is_file():
        return path
    # written into a directory of this process's, then renamed into place whole: a process that
    # finds the directory finds every file complete (another may be writing the same model)
    work = path.with_name(f"{path.name}.part-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        _write(name, work)
        for _ in range(3):
            try:
                os.rename(work, path)
                break
            except OSError:  # another process put it there first, or a partial directory is there
                if (path / "model-q4_0.gguf").is_file():
                    break
                stale = path.with_name(f"{path.name}.stale-{os.getpid()}-{threading.get_ident()}")
                try:  # moved aside whole (never deleted in place: a reader may hold it)
                    os.rename(path, stale)
                except OSError:
                    pass
                shutil.rmtree(stale, ignore_errors=True)
        if not (path / "model-q4_0.gguf").is_file():
            raise RuntimeError(f"could not put tiny model {name!r} in place at {path}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return path


def _write(name: str, path: Path) -> None:
    """Every file of tiny model ``name`` into ``path``."""
    if name in TRAINED_MODELS:
        trained.write_files(TRAINED_MODELS[name], path)
        return
    hybrid = name in HYBRID_MODELS
    tokenizer = train_tokenizer()
    tokenizer.save(str(path / "tokenizer.json"))
    config = hybrid_config(name, VOCAB_SIZE) if hybrid else hf_config(name)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    from safetensors.torch import save_file

    if hybrid:
        from gguf import GGMLQuantizationType as QT

        weights = hybrid_weights(name, VOCAB_SIZE)
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
        write_hybrid_gguf(path / "model-f32.gguf", config, weights, tokenizer, QT.F32)
        write_hybrid_gguf(path / "model-q4_0.gguf", config, weights, tokenizer, QT.Q4_0)
        return

    save_file(random_weights(name), str(path / "model.safetensors"), metadata={"format": "pt"})
    from ftlab.models.loader import load_hf, save_gguf
    from ftlab.models.tokenizer import gguf_metadata

    cfg, weights = load_hf(path, dtype=torch.float32, progress=False)
    meta = gguf_metadata(tokenizer)
    save_gguf(path / "model-f32.gguf", cfg, weights, metadata=meta)
    save_gguf(path / "model-q4_0.gguf", cfg, weights, quantize=True, metadata=meta)


def spec_digest(name: str) -> str:
    """Hash of everything a tiny model is made from."""
    import hashlib
    import inspect

    if name in TRAINED_MODELS:
        return trained.digest(TRAINED_MODELS[name])
    weights = hybrid_weights if name in HYBRID_MODELS else random_weights
    from ftlab.models.tokenizer import gguf_metadata

    recipe = json.dumps(
        [
            TINY_MODELS[name],
            VOCAB_SIZE,
            CORPUS,
            inspect.getsource(weights),
            inspect.getsource(gguf_metadata),  # the tokenizer as the GGUF files hold it
        ],
        sort_keys=True,
    )
    if name in HYBRID_MODELS:  # and what makes its GGUF files
        from ftlab.models.qwen3_next import gguf_layout, gguf_write
        from ftlab.models.qwen3_next import tiny as hybrid_tiny

        recipe += "".join(inspect.getsource(m) for m in (hybrid_tiny, gguf_write, gguf_layout))
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def hf_config(name: str) -> dict:
    spec = {k: v for k, v in TINY_MODELS[name].items() if k != "seed"}
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": VOCAB_SIZE,
        "intermediate_size": 4 * spec["hidden_size"],
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "attention_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        **spec,
    }


def random_weights(name: str) -> dict[str, torch.Tensor]:
    """Deterministic weights in HF names. Scales keep activations O(1) through the layers."""
    spec = TINY_MODELS[name]
    g = torch.Generator().manual_seed(1000 + spec["seed"])
    h, hd, e, inter = (
        spec["hidden_size"],
        spec["head_dim"],
        spec["num_experts"],
        spec["moe_intermediate_size"],
    )
    q_out, kv_out = spec["num_attention_heads"] * hd, spec["num_key_value_heads"] * hd

    def w(*shape: int, scale: float | None = None) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * (
            scale if scale is not None else shape[-1] ** -0.5
        )

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    out = {"model.embed_tokens.weight": w(VOCAB_SIZE, h, scale=1.0), "model.norm.weight": norm(h)}
    if not spec["tie_word_embeddings"]:
        out["lm_head.weight"] = w(VOCAB_SIZE, h)
    for i in range(spec["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": w(q_out, h),
            p + "self_attn.k_proj.weight": w(kv_out, h),
            p + "self_attn.v_proj.weight": w(kv_out, h),
            p + "self_attn.o_proj.weight": w(h, q_out),
            p + "self_attn.q_norm.weight": norm(hd),
            p + "self_attn.k_norm.weight": norm(hd),
            p + "input_layernorm.weight": norm(h),
            p + "post_attention_layernorm.weight": norm(h),
            p + "mlp.gate.weight": w(e, h, scale=1.0),  # drawn, and wide: routing must vary
        }
        for j in range(e):
            x = f"{p}mlp.experts.{j}."
            out |= {
                x + "gate_proj.weight": w(inter, h),
                x + "up_proj.weight": w(inter, h),
                x + "down_proj.weight": w(h, inter),
            }
    return {k: v.contiguous() for k, v in out.items()}


def train_tokenizer(texts: list[str] | None = None, vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE of ``vocab_size`` tokens (``<|endoftext|>`` its one special token, GPT-2's
    pre-tokenizer) trained on ``texts`` (default: CORPUS), deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4 if texts is None else texts, trainer=trainer)
    return tok

"""Writes the llama.cpp-quantized GGUF fixtures of this directory (see README.md).

A random Qwen3-MoE of K-quant-friendly shape (every matrix row a multiple of 256 values) is
written as F32 by ftlab's ``save_gguf``, then quantized by llama.cpp's ``llama-quantize``
into each type of ``FTYPES``. The F32 file is not kept: the tests read the quantized files
only. Run from the repository root:

    python tests/data/llama_cpp/make_files.py /path/to/llama-quantize
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ftlab.models import tiny
from ftlab.models.qwen3_moe import LayerWeights, ModelWeights, Qwen3MoeConfig, save_gguf
from ftlab.models.tokenizer import gguf_metadata

HERE = Path(__file__).resolve().parent
CONFIG = Qwen3MoeConfig(
    vocab_size=tiny.VOCAB_SIZE,
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=128,
    num_experts=2,
    num_experts_per_tok=1,
    moe_intermediate_size=256,
    rope_theta=1_000_000.0,
    max_position_embeddings=1024,
)
FTYPES = ("Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")


def random_weights(c: Qwen3MoeConfig, seed: int = 2026) -> ModelWeights:
    """Gaussian weights scaled so that activations stay O(1) through the layers; a wide router."""
    g = torch.Generator().manual_seed(seed)
    h, hd, e, inter = c.hidden_size, c.head_dim, c.num_experts, c.moe_intermediate_size

    def w(*shape: int, scale: float | None = None) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * (shape[-1] ** -0.5 if scale is None else scale)

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    layers = [
        LayerWeights(
            q_proj=w(c.num_attention_heads * hd, h),
            k_proj=w(c.num_key_value_heads * hd, h),
            v_proj=w(c.num_key_value_heads * hd, h),
            o_proj=w(h, c.num_attention_heads * hd),
            q_norm=norm(hd),
            k_norm=norm(hd),
            input_norm=norm(h),
            post_attention_norm=norm(h),
            router=w(e, h, scale=1.0),
            w_gate_up=w(e, 2 * inter, h),
            w_down=w(e, h, inter),
        )
        for _ in range(c.num_hidden_layers)
    ]
    return ModelWeights(w(c.vocab_size, h, scale=1.0), layers, norm(h), w(c.vocab_size, h))


def main(quantize: str) -> None:
    meta = gguf_metadata(tiny.train_tokenizer())
    with tempfile.TemporaryDirectory() as tmp:
        f32 = save_gguf(Path(tmp) / "f32.gguf", CONFIG, random_weights(CONFIG), metadata=meta)
        for ftype in FTYPES:
            out = HERE / f"qwen3moe-{ftype.lower()}.gguf"
            subprocess.run([quantize, str(f32), str(out), ftype, "1"], check=True)


if __name__ == "__main__":
    main(sys.argv[1])

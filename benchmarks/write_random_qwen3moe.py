"""Write a Qwen3-30B-A3B-shaped model (``ftlab.bench.model.CONFIG``) with random weights as a
Q8_0 (or BF16) GGUF file that llama.cpp and ftlab both load; ``llama-quantize`` turns it into
the K-quant files people download (benchmarks/make_kquant_model.sh).

Weights are Gaussian, each row scaled to unit RMS of its dot with a unit-RMS input (norms are
ones, the embedding RMS 4, as in ``ftlab bench model``), drawn layer by layer on ``--device``
and quantized there by ``ops.quantize`` (byte-identical to gguf-py's Q8_0): host memory holds
the packed model only (Q8_0: 32 GB; BF16: 61 GB). The tokenizer is llama.cpp's "none" type
with the vocab size: llama-bench and ftlab's ``load_gguf`` run it; text generation has no vocabulary.

    python benchmarks/write_random_qwen3moe.py OUT.gguf [--type Q8_0|BF16] [--device cuda] [--layers N]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from tqdm import tqdm

from ftlab import ops
from ftlab.bench.model import CONFIG
from ftlab.formats.gguf_write import write_tensors
from ftlab.models.gguf_loader import GGUF_ARCH

KEYS = {"num_hidden_layers": "block_count", "hidden_size": "embedding_length", "num_attention_heads":
        "attention.head_count", "num_key_value_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
        "num_experts": "expert_count", "num_experts_per_tok": "expert_used_count",
        "moe_intermediate_size": "expert_feed_forward_length", "rope_theta": "rope.freq_base",
        "rms_norm_eps": "attention.layer_norm_rms_epsilon", "max_position_embeddings": "context_length",
        "vocab_size": "vocab_size"}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--type", default="Q8_0", choices=["Q8_0", "BF16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--layers",
        type=int,
        default=CONFIG.num_hidden_layers,
        help="fewer layers for a quick check",
    )
    ap.add_argument(
        "--experts", type=int, default=CONFIG.num_experts, help="fewer experts for a quick check"
    )
    args = ap.parse_args()
    c = dataclasses.replace(CONFIG, num_hidden_layers=args.layers, num_experts=args.experts,
                            num_experts_per_tok=min(CONFIG.num_experts_per_tok, args.experts))  # fmt: skip
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(0)

    def matrix(*shape: int, rms: float | None = None):
        w = torch.randn(*shape, device=dev, generator=gen, dtype=torch.float32)
        w *= shape[-1] ** -0.5 if rms is None else rms
        return (
            w.to(torch.bfloat16).cpu() if args.type == "BF16" else ops.quantize(w, "Q8_0").to("cpu")
        )

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.float32)

    h, hd, e, inter = c.hidden_size, c.head_dim, c.num_experts, c.moe_intermediate_size
    tensors = {"token_embd.weight": matrix(c.vocab_size, h, rms=4.0), "output_norm.weight": ones(h),
               "output.weight": matrix(c.vocab_size, h)}  # fmt: skip
    for i in tqdm(range(c.num_hidden_layers), desc=f"random {args.type} layers", unit="layer"):
        p = f"blk.{i}."
        tensors |= {
            p + "attn_q.weight": matrix(c.num_attention_heads * hd, h),
            p + "attn_k.weight": matrix(c.num_key_value_heads * hd, h),
            p + "attn_v.weight": matrix(c.num_key_value_heads * hd, h),
            p + "attn_output.weight": matrix(h, c.num_attention_heads * hd),
            p + "attn_q_norm.weight": ones(hd), p + "attn_k_norm.weight": ones(hd),
            p + "attn_norm.weight": ones(h), p + "ffn_norm.weight": ones(h),
            p + "ffn_gate_inp.weight": torch.randn(e, h, generator=gen, device=dev).cpu() * h**-0.5,
            p + "ffn_gate_exps.weight": matrix(e, inter, h), p + "ffn_up_exps.weight": matrix(e, inter, h),
            p + "ffn_down_exps.weight": matrix(e, h, inter),
        }  # fmt: skip
    meta = {f"{GGUF_ARCH}.{key}": getattr(c, field) for field, key in KEYS.items()}
    # llama.cpp takes a value head of embedding_length / head_count (64 here) unless told
    meta[f"{GGUF_ARCH}.attention.value_length"] = c.head_dim
    meta |= {"general.name": f"random Qwen3-30B-A3B-shaped ({c.num_hidden_layers} layers, {e} experts)",
             "tokenizer.ggml.model": "none"}  # fmt: skip
    print(f"writing {args.out}")
    write_tensors(args.out, tensors, arch=GGUF_ARCH, metadata=meta)


if __name__ == "__main__":
    main()

"""Write a Qwen3-30B-A3B-shaped model (``ftlab.bench.model.CONFIG``) with random weights as a
GGUF file that llama.cpp and ftlab both load: Q8_0 (or BF16), from which ``llama-quantize`` makes
the K-quant files people download (benchmarks/make_kquant_model.sh), or Q4_K_M or Q4_0 directly.

Weights are Gaussian, each row scaled to unit RMS of its dot with a unit-RMS input (norms are
ones, the embedding RMS 4, as in ``ftlab bench model``), drawn layer by layer on ``--device``
and quantized there: Q8_0 by ``ops.quantize`` (byte-identical to gguf-py's Q8_0); Q4_K_M by
``ftlab.bench.kquant_pack`` (min/max scales, not llama.cpp's error search) in llama.cpp's
Q4_K_M type mix for this architecture (:func:`q4_k_m_type`); Q4_0 as llama-quantize's Q4_0 (every
matrix Q4_0 by ``ops.quantize``, ``output.weight`` Q6_K). Host memory holds the packed model
only (Q8_0: 32 GB; BF16: 61 GB; Q4_K_M: 18.6 GB). The tokenizer is llama.cpp's "none" type
with the vocab size (llama-bench and ftlab's ``load_gguf`` run it; text generation has no
vocabulary), or, with ``--vocab-from FILE.gguf``, that file's byte-level BPE tokenizer
(``tokenizer.ggml.*``), padded to the vocab size with ``[PAD<i>]`` UNUSED tokens as llama.cpp's
converter pads: then ``Pipeline.load`` takes the file, as ``ftlab bench model --gguf`` needs.

    python benchmarks/write_random_qwen3moe.py OUT.gguf [--type Q8_0|BF16|Q4_K_M|Q4_0] [--device
    cuda]
        [--layers N] [--experts N] [--vocab N] [--vocab-from FILE.gguf]
"""

from __future__ import annotations

import argparse
import dataclasses

import gguf
import torch
from tqdm import tqdm

from ftlab import ops
from ftlab.bench.kquant_pack import PACKERS
from ftlab.bench.model import CONFIG
from ftlab.formats.gguf_write import write_tensors
from ftlab.models.qwen3_moe import GGUF_ARCH

KEYS = {
    "num_hidden_layers": "block_count",
    "hidden_size": "embedding_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "num_experts": "expert_count",
    "num_experts_per_tok": "expert_used_count",
    "moe_intermediate_size": "expert_feed_forward_length",
    "rope_theta": "rope.freq_base",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "max_position_embeddings": "context_length",
    "vocab_size": "vocab_size",
}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's ``use_more_bits`` (src/llama-quant.cpp): the layers whose attn_v and ffn_down
    its Q4_K_M keeps in Q6_K -- the first and last eighth, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, n_layers: int) -> str:
    """The GGUF type llama.cpp's Q4_K_M gives the 2-D / 3-D weight ``name`` of a ``qwen3moe`` model
    of ``n_layers`` layers (``llama_tensor_get_type``): Q6_K for ``output.weight`` and for
    ``attn_v`` and ``ffn_down_exps`` of the :func:`use_more_bits` layers, Q4_K otherwise
    (``token_embd`` included). For 48 layers: 289 Q4_K, 49 Q6_K. (llama.cpp gives a model of
    exactly 8 experts Q8_0 attn_k / attn_v and Q5_K attn_output; this mix is that of any other
    expert count.)"""
    if name == "output.weight":
        return "Q6_K"
    if name.startswith("blk.") and name.endswith((".attn_v.weight", ".ffn_down_exps.weight")):
        return "Q6_K" if use_more_bits(int(name.split(".")[1]), n_layers) else "Q4_K"
    return "Q4_K"


def tokenizer_of(path: str, vocab_size: int) -> dict:
    """The ``tokenizer.ggml.*`` metadata of the GGUF file ``path`` (a byte-level BPE), its
    tokens padded to ``vocab_size`` with ``[PAD<i>]`` tokens of type UNUSED."""
    from ftlab.formats.gguf import field_value, open_gguf

    f = open_gguf(path)
    if field_value(f, "tokenizer.ggml.model", "str") != "gpt2":
        raise SystemExit(f"--vocab-from: {path} has no byte-level BPE tokenizer ('gpt2')")
    tokens = field_value(f, "tokenizer.ggml.tokens", "str[]")
    types = field_value(f, "tokenizer.ggml.token_type", "int[]") or [1] * len(tokens)
    if len(tokens) > vocab_size:
        raise SystemExit(f"--vocab-from: {path} has {len(tokens)} tokens, over {vocab_size}")
    pad = range(len(tokens), vocab_size)
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens + [f"[PAD{i}]" for i in pad],
        "tokenizer.ggml.token_type": types + [int(gguf.TokenType.UNUSED)] * len(pad),
        "tokenizer.ggml.merges": field_value(f, "tokenizer.ggml.merges", "str[]"),
    }
    for key, kind in (("pre", "str"), ("eos_token_id", "int"), ("bos_token_id", "int")):
        value = field_value(f, f"tokenizer.ggml.{key}", kind)
        if value is not None:
            meta[f"tokenizer.ggml.{key}"] = value
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--type", default="Q8_0", choices=["Q8_0", "BF16", "Q4_K_M", "Q4_0"])
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
    ap.add_argument(
        "--vocab",
        type=int,
        default=CONFIG.vocab_size,
        help="a smaller vocabulary for a quick check",
    )
    ap.add_argument(
        "--vocab-from",
        metavar="FILE",
        help="a GGUF file whose tokenizer (tokenizer.ggml.*) the file takes, padded to --vocab",
    )
    args = ap.parse_args()
    c = dataclasses.replace(
        CONFIG,
        num_hidden_layers=args.layers,
        num_experts=args.experts,
        vocab_size=args.vocab,
        num_experts_per_tok=min(CONFIG.num_experts_per_tok, args.experts),
    )
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(0)

    def matrix(name: str, *shape: int, rms: float | None = None):
        w = torch.randn(*shape, device=dev, generator=gen, dtype=torch.float32)
        w *= shape[-1] ** -0.5 if rms is None else rms
        if args.type == "BF16":
            return w.to(torch.bfloat16).cpu()
        if args.type == "Q4_K_M":
            return PACKERS[q4_k_m_type(name, c.num_hidden_layers)](w).to("cpu")
        if args.type == "Q4_0":  # llama-quantize's Q4_0: output.weight in Q6_K
            return (PACKERS["Q6_K"](w) if name == "output.weight" else ops.quantize(w, "Q4_0")).to(
                "cpu"
            )
        return ops.quantize(w, "Q8_0").to("cpu")

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.float32)

    h, hd, e, inter = c.hidden_size, c.head_dim, c.num_experts, c.moe_intermediate_size
    tensors = {
        "token_embd.weight": matrix("token_embd.weight", c.vocab_size, h, rms=4.0),
        "output_norm.weight": ones(h),
        "output.weight": matrix("output.weight", c.vocab_size, h),
    }
    for i in tqdm(range(c.num_hidden_layers), desc=f"random {args.type} layers", unit="layer"):
        p = f"blk.{i}."
        tensors |= {
            p + "attn_q.weight": matrix(p + "attn_q.weight", c.num_attention_heads * hd, h),
            p + "attn_k.weight": matrix(p + "attn_k.weight", c.num_key_value_heads * hd, h),
            p + "attn_v.weight": matrix(p + "attn_v.weight", c.num_key_value_heads * hd, h),
            p + "attn_output.weight": matrix(
                p + "attn_output.weight", h, c.num_attention_heads * hd
            ),
            p + "attn_q_norm.weight": ones(hd),
            p + "attn_k_norm.weight": ones(hd),
            p + "attn_norm.weight": ones(h),
            p + "ffn_norm.weight": ones(h),
            p + "ffn_gate_inp.weight": torch.randn(e, h, generator=gen, device=dev).cpu() * h**-0.5,
            p + "ffn_gate_exps.weight": matrix(p + "ffn_gate_exps.weight", e, inter, h),
            p + "ffn_up_exps.weight": matrix(p + "ffn_up_exps.weight", e, inter, h),
            p + "ffn_down_exps.weight": matrix(p + "ffn_down_exps.weight", e, h, inter),
        }
    meta = {f"{GGUF_ARCH}.{key}": getattr(c, field) for field, key in KEYS.items()}
    # llama.cpp takes a value head of embedding_length / head_count (64 here) unless told
    meta[f"{GGUF_ARCH}.attention.value_length"] = c.head_dim
    meta |= {
        "general.name": f"random Qwen3-30B-A3B-shaped ({c.num_hidden_layers} layers, {e} experts)",
        "tokenizer.ggml.model": "none",
    }
    if args.vocab_from:
        meta |= tokenizer_of(args.vocab_from, c.vocab_size)
    # the file's type, as llama-quantize writes it (llama-bench names the model's type from it)
    if args.type in ("Q4_K_M", "Q4_0"):
        ftype = (
            gguf.LlamaFileType.MOSTLY_Q4_K_M
            if args.type == "Q4_K_M"
            else gguf.LlamaFileType.MOSTLY_Q4_0
        )
        meta |= {
            "general.file_type": int(ftype),
            "general.quantization_version": gguf.GGML_QUANT_VERSION,
        }
    print(f"writing {args.out}")
    write_tensors(args.out, tensors, arch=GGUF_ARCH, metadata=meta)


if __name__ == "__main__":
    main()

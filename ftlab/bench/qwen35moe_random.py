"""A Qwen3.6-35B-A3B-shaped (``qwen3_5_moe_text``) model with random weights under the HF names,
made on demand, tensor by tensor, on a device: the same values each time a name is asked for
(one generator a tensor, seeded by its place in the model), so the bench's model and the GGUF
file written of it hold the same weights without the model ever being whole on the host.

Shape (transformers' ``Qwen3_5MoeTextConfig`` defaults, the released Qwen3.5-35B-A3B /
Qwen3.6-35B-A3B text model): 40 layers, every 4th full attention (30 Gated DeltaNet + 10 gated
attention), hidden 2048, attention 16 q / 2 kv heads x 256 with partial rotary 0.25, linear
attention 16 key / 32 value heads x 128 and conv kernel 4, 256 experts top-8 of width 512 and a
shared expert of 512, vocab 248320, rms eps 1e-6, rope theta 1e7, untied lm_head.

Values: every matmul weight (projections, expert banks, shared expert, lm_head) is Q4_0 with
nibbles uniform over 1..15 and one fp16 scale per block so that a row's dot with a unit-RMS
input has unit RMS (``ftlab.bench.model.random_q4_0``); the zero-centred norms are 0 (the model
scales by ``1 + w``), the gated norm 1; the conv kernel Gaussian of RMS ``W^-1/2``; ``A_log``
the log of U(1, 16) and ``dt_bias`` -4 (decays ``g = -A softplus(a + dt_bias)`` around -0.3);
routers and the shared-expert gate Gaussian of RMS ``H^-1/2`` (router logits ~ N(0, 1): the
load spreads over the experts); the embedding Gaussian of RMS 4, rounded to bfloat16.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from ftlab.bench.model import random_q4_0
from ftlab.models.qwen3_next.gguf_layout import hf_shapes
from ftlab.models.qwen3_next.gguf_write import MATMUL
from ftlab.models.tokenizer import Tokenizer
from ftlab.quant import QK


@dataclass(frozen=True)
class Shape:
    """The sizes of the model (HF config names); ``prefill``: the prompt the bench times."""

    layers: int = 40
    hidden: int = 2048
    heads: int = 16
    kv_heads: int = 2
    head_dim: int = 256
    k_heads: int = 16
    v_heads: int = 32
    k_dim: int = 128
    v_dim: int = 128
    experts: int = 256
    top_k: int = 8
    inter: int = 512
    shared: int = 512
    vocab: int = 248320
    prefill: int = 512

    def __post_init__(self) -> None:
        for name in (
            "layers",
            "hidden",
            "heads",
            "kv_heads",
            "head_dim",
            "k_heads",
            "v_heads",
            "k_dim",
            "v_dim",
            "experts",
            "top_k",
            "inter",
            "shared",
            "vocab",
            "prefill",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        for name, k in (
            ("hidden", self.hidden),
            ("heads * head_dim", self.heads * self.head_dim),
            ("v_dim", self.v_dim),
            ("inter", self.inter),
            ("shared", self.shared),
        ):
            if k % QK:
                raise ValueError(f"{name} must be a multiple of {QK} (the Q4_0 block), got {k}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k must be <= experts ({self.experts}), got {self.top_k}")

    def with_overrides(
        self, layers: int | None = None, experts: int | None = None, vocab: int | None = None
    ) -> Shape:
        """This shape with fewer layers / experts (top-k capped at them) / a smaller vocabulary."""
        experts = experts if experts is not None else self.experts
        return replace(
            self,
            layers=layers if layers is not None else self.layers,
            experts=experts,
            top_k=min(self.top_k, experts) if isinstance(experts, int) else self.top_k,
            vocab=vocab if vocab is not None else self.vocab,
        )


QWEN35_35B_A3B = Shape()
#: Every width scaled down, for a CPU run of the whole bench in seconds.
SMALL = Shape(
    layers=4,
    hidden=256,
    heads=4,
    kv_heads=2,
    head_dim=64,
    k_heads=2,
    v_heads=4,
    k_dim=32,
    v_dim=32,
    experts=8,
    top_k=2,
    inter=64,
    shared=64,
    vocab=1024,
    prefill=32,
)


def hf_config(shape: Shape) -> dict:
    """The HF ``config.json`` dict (``qwen3_5_moe_text``) of ``shape``."""
    s = shape
    return {
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "full_attention_interval": 4,
        "layer_types": [
            "linear_attention" if (i + 1) % 4 else "full_attention" for i in range(s.layers)
        ],
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": s.k_dim,
        "linear_value_head_dim": s.v_dim,
        "linear_num_key_heads": s.k_heads,
        "linear_num_value_heads": s.v_heads,
        "num_experts": s.experts,
        "num_experts_per_tok": s.top_k,
        "moe_intermediate_size": s.inter,
        "shared_expert_intermediate_size": s.shared,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "max_position_embeddings": 262144,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
    }


_ZERO_CENTRED = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "q_norm.weight",
    "k_norm.weight",
    "model.norm.weight",
)


class RandomTensors(Mapping):
    """``{HF name: tensor | Q4_0Weight}`` of the model ``config`` describes, each made on
    ``device`` when asked for (module docstring); dense values float32 but the embedding
    (bfloat16)."""

    def __init__(self, config: dict, device: str | torch.device, seed: int = 0):
        self.shapes = hf_shapes("qwen35moe", config)
        self.index = {name: i for i, name in enumerate(self.shapes)}
        self.device, self.seed = torch.device(device), seed

    def __len__(self) -> int:
        return len(self.shapes)

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __getitem__(self, name: str):
        shape, dev = self.shapes[name], self.device
        gen = torch.Generator(device=dev).manual_seed(self.seed * 1_000_003 + self.index[name])
        if name.endswith(MATMUL):
            return random_q4_0(shape, dev, gen)
        if name == "model.embed_tokens.weight":
            return (torch.randn(shape, device=dev, generator=gen) * 4.0).to(torch.bfloat16)
        if name.endswith(_ZERO_CENTRED):
            return torch.zeros(shape, device=dev)
        if name.endswith("linear_attn.norm.weight"):
            return torch.ones(shape, device=dev)
        if name.endswith("A_log"):
            return torch.empty(shape, device=dev).uniform_(1.0, 16.0, generator=gen).log()
        if name.endswith("dt_bias"):
            return torch.full(shape, -4.0, device=dev)
        # the conv kernel, the router, the shared-expert gate
        return torch.randn(shape, device=dev, generator=gen) * shape[-1] ** -0.5


def byte_tokenizer() -> Tokenizer:
    """A byte-level tokenizer of the 256 bytes (a random model's prompts are token ids; the
    pipeline wants a tokenizer all the same)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = HFTokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend)

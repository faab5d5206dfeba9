"""What llama.cpp's converter does to a Qwen3.6 (``qwen35moe``) or Qwen3-Next (``qwen3next``)
checkpoint, as data: the config <-> ``<arch>.*`` metadata keys, the HF <-> ``blk.N.*`` tensor
names and shapes, the V-head permutations (``conversion/qwen.py``: ``Qwen3NextModel``,
``_LinearAttentionVReorderBase``) and the row / column gathers that apply them to float tensors
and packed QuantWeights. Reading (:mod:`~ftlab.models.qwen3_next.gguf`) and writing
(:mod:`~ftlab.models.qwen3_next.gguf_write`) both use these tables, one direction each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ftlab.quant import QTYPES, QuantWeight, quant_weight

#: GGUF architecture -> (transformers class, HF ``model_type``).
ARCHS = {
    "qwen35moe": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
    "qwen3next": ("Qwen3NextForCausalLM", "qwen3_next"),
}
#: The converter's ``tokenizer.ggml.pre`` for the Qwen tokenizers of each architecture.
TOKENIZER_PRE = {"qwen35moe": "qwen35", "qwen3next": "qwen2"}

#: HF config field -> ``<arch>.*`` key: integers, every one required.
INT_KEYS = {
    "num_hidden_layers": "block_count",
    "hidden_size": "embedding_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "num_experts": "expert_count",
    "num_experts_per_tok": "expert_used_count",
    "moe_intermediate_size": "expert_feed_forward_length",
    "shared_expert_intermediate_size": "expert_shared_feed_forward_length",
    "linear_conv_kernel_dim": "ssm.conv_kernel",
    "linear_key_head_dim": "ssm.state_size",
    "linear_num_key_heads": "ssm.group_count",
    "linear_num_value_heads": "ssm.time_step_rank",
    "max_position_embeddings": "context_length",
}
FLOAT_KEYS = {"rms_norm_eps": "attention.layer_norm_rms_epsilon", "rope_theta": "rope.freq_base"}
#: Keys a file may lack, and the value llama.cpp then takes.
DEFAULTS = {"rope.freq_base": 10000.0, "full_attention_interval": 4, "nextn_predict_layers": 0}

#: Stored as ``w + 1`` (the HF norms are zero-centred: ``x * (1 + w)``); the gated norm of the
#: linear attention (``linear_attn.norm``, ``ssm_norm``) is stored as it is.
PLUS_ONE = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
)
_PLUS_ONE_GLOBAL = (
    "model.norm.weight",
    "mtp.norm.weight",
    "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden.weight",
)


def plus_one(name: str) -> bool:
    """Whether HF tensor ``name`` is a zero-centred norm, stored as ``w + 1``."""
    return name.endswith(PLUS_ONE) or name in _PLUS_ONE_GLOBAL


@dataclass(frozen=True)
class Dims:
    """The sizes every tensor shape comes from (HF config names)."""

    hidden: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv: int
    experts: int
    inter: int
    shared: int

    @classmethod
    def of(cls, c: dict) -> Dims:
        return cls(
            c["hidden_size"],
            c["vocab_size"],
            c["num_attention_heads"],
            c["num_key_value_heads"],
            c["head_dim"],
            c["linear_num_key_heads"],
            c["linear_num_value_heads"],
            c["linear_key_head_dim"],
            c["linear_value_head_dim"],
            c["linear_conv_kernel_dim"],
            c["num_experts"],
            c["moe_intermediate_size"],
            c["shared_expert_intermediate_size"],
        )

    @property
    def qk_rows(self) -> int:
        return 2 * self.k_heads * self.k_dim

    @property
    def value_rows(self) -> int:
        return self.v_heads * self.v_dim


def hf_shapes(arch: str, c: dict) -> dict[str, tuple[int, ...]]:
    """``{HF name: shape}`` of every tensor of the model ``c`` describes (transformers' names,
    fused experts ``mlp.experts.gate_up_proj`` ``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]``)."""
    d = Dims.of(c)
    h = d.hidden
    out = {"model.embed_tokens.weight": (d.vocab, h), "model.norm.weight": (h,)}
    if not c.get("tie_word_embeddings", False):
        out["lm_head.weight"] = (d.vocab, h)
    n_mtp = c.get("mtp_num_hidden_layers") or 0
    if n_mtp:
        out |= {
            "mtp.fc.weight": (h, 2 * h),
            "mtp.pre_fc_norm_embedding.weight": (h,),
            "mtp.pre_fc_norm_hidden.weight": (h,),
            "mtp.norm.weight": (h,),
        }
    kinds = [(f"model.layers.{i}.", kind) for i, kind in enumerate(c["layer_types"])]
    for p, kind in kinds + [(f"mtp.layers.{i}.", "full_attention") for i in range(n_mtp)]:
        out |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
        if kind == "linear_attention":
            a = p + "linear_attn."
            out |= {
                a + "conv1d.weight": (d.qk_rows + d.value_rows, 1, d.conv),
                a + "A_log": (d.v_heads,),
                a + "dt_bias": (d.v_heads,),
                a + "norm.weight": (d.v_dim,),
                a + "out_proj.weight": (h, d.value_rows),
            }
            if arch == "qwen3next":
                out |= {
                    a + "in_proj_qkvz.weight": (d.qk_rows + 2 * d.value_rows, h),
                    a + "in_proj_ba.weight": (2 * d.v_heads, h),
                }
            else:
                out |= {
                    a + "in_proj_qkv.weight": (d.qk_rows + d.value_rows, h),
                    a + "in_proj_z.weight": (d.value_rows, h),
                    a + "in_proj_b.weight": (d.v_heads, h),
                    a + "in_proj_a.weight": (d.v_heads, h),
                }
        else:
            a = p + "self_attn."
            out |= {
                a + "q_proj.weight": (2 * d.heads * d.head_dim, h),
                a + "k_proj.weight": (d.kv_heads * d.head_dim, h),
                a + "v_proj.weight": (d.kv_heads * d.head_dim, h),
                a + "o_proj.weight": (h, d.heads * d.head_dim),
                a + "q_norm.weight": (d.head_dim,),
                a + "k_norm.weight": (d.head_dim,),
            }
        m = p + "mlp."
        out |= {
            m + "gate.weight": (d.experts, h),
            m + "experts.gate_up_proj": (d.experts, 2 * d.inter, h),
            m + "experts.down_proj": (d.experts, h, d.inter),
            m + "shared_expert.gate_proj.weight": (d.shared, h),
            m + "shared_expert.up_proj.weight": (d.shared, h),
            m + "shared_expert.down_proj.weight": (h, d.shared),
            m + "shared_expert_gate.weight": (1, h),
        }
    return out


QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
#: HF name suffix -> GGUF ``blk.N`` tensor, for the tensors the converter only renames (and
#: perhaps reorders rows of, or adds one to): the split/fused ones are handled apart.
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
#: The multi-token-prediction head's own tensors -> ``blk.<first MTP block>.*``.
MTP_NAMES = {
    "mtp.fc.weight": "nextn.eh_proj.weight",
    "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
    "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight",
    "mtp.norm.weight": "nextn.shared_head_norm.weight",
}


def block_prefix(hf: str, layers: int) -> str:
    """``blk.N.`` of an HF layer tensor (``model.layers.N.*``; ``mtp.layers.i.*`` and the MTP
    head's tensors are blocks ``layers + i``, after the decoder's ``layers``)."""
    if hf in MTP_NAMES:
        return f"blk.{layers}."
    _, _, i, _ = hf.split(".", 3)
    return f"blk.{int(i) + (layers if hf.startswith('mtp.') else 0)}."


def gguf_name(hf: str, layers: int) -> str:
    """The GGUF tensor of an HF tensor the converter renames one to one (``layers``: the
    decoder layers, before the MTP blocks)."""
    if hf in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf]
    if hf in MTP_NAMES:
        return block_prefix(hf, layers) + MTP_NAMES[hf]
    return block_prefix(hf, layers) + LAYER_NAMES[hf.split(".", 3)[3]]


def v_perm(k_heads: int, v_heads: int, width: int) -> torch.Tensor:
    """The converter's V-head reordering as an index: ``stored = hf[perm]`` along a dimension of
    ``v_heads * width`` entries. HF groups the V heads by K head (``[K0: v0..v(r-1), K1: ...]``);
    the file tiles them (``[v0 of K0, v0 of K1, ..., v1 of K0, ...]``). Identity when
    ``v_heads == k_heads``."""
    r = v_heads // k_heads
    return torch.arange(v_heads * width).reshape(k_heads, r, width).permute(1, 0, 2).reshape(-1)


def inverse(perm: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(perm)
    out[perm] = torch.arange(perm.numel())
    return out


def qkvz_perm(d: Dims) -> torch.Tensor:
    """Qwen3-Next's ``in_proj_qkvz`` rows from the rows of ``cat(attn_qkv, attn_gate)``:
    HF packs per K head ``[q (dk), k (dk), v (r*dv), z (r*dv)]``; the file has all q, all k,
    all v (``attn_qkv``), then all z (``attn_gate``)."""
    dk, rv, hk = d.k_dim, d.v_heads // d.k_heads * d.v_dim, d.k_heads
    q0, k0, v0, z0 = 0, hk * dk, 2 * hk * dk, 2 * hk * dk + hk * rv
    rows = []
    for h in range(hk):
        rows += [
            torch.arange(q0 + h * dk, q0 + (h + 1) * dk),
            torch.arange(k0 + h * dk, k0 + (h + 1) * dk),
            torch.arange(v0 + h * rv, v0 + (h + 1) * rv),
            torch.arange(z0 + h * rv, z0 + (h + 1) * rv),
        ]
    return torch.cat(rows)


def gguf_shapes(
    arch: str, config: dict, fuse_gate_up_exps: bool = False, fuse_qkv: bool = False
) -> dict[str, tuple[int, ...]]:
    """``{GGUF tensor name: shape (PyTorch order)}`` the converter writes for ``config`` (with
    its ``--fuse-gate-up-exps``: ``ffn_gate_up_exps``; ``--fuse-qkv``: the full-attention
    blocks' ``attn_qkv``, rows of q (with its gate), k, v)."""
    d, layers = Dims.of(config), config["num_hidden_layers"]
    out = {}
    for name, shape in hf_shapes(arch, config).items():
        if fuse_qkv and name.endswith(QKV):
            q_rows = 2 * d.heads * d.head_dim
            out[block_prefix(name, layers) + "attn_qkv.weight"] = (
                q_rows + 2 * d.kv_heads * d.head_dim,
                d.hidden,
            )
        elif fuse_gate_up_exps and name.endswith("experts.gate_up_proj"):
            out[block_prefix(name, layers) + "ffn_gate_up_exps.weight"] = shape
        elif name.endswith("in_proj_qkvz.weight"):
            p = block_prefix(name, layers)
            out[p + "attn_qkv.weight"] = (d.qk_rows + d.value_rows, d.hidden)
            out[p + "attn_gate.weight"] = (d.value_rows, d.hidden)
        elif name.endswith("experts.gate_up_proj"):
            p = block_prefix(name, layers)
            out[p + "ffn_gate_exps.weight"] = out[p + "ffn_up_exps.weight"] = (
                d.experts,
                d.inter,
                d.hidden,
            )
        elif name.endswith("conv1d.weight"):
            out[gguf_name(name, layers)] = (shape[0], shape[2])
        else:
            out[gguf_name(name, layers)] = shape
    return out


def row_perm(arch: str, name: str, d: Dims) -> torch.Tensor | None:
    """``stored = hf[perm]`` along the rows of HF tensor ``name`` (None: not reordered)."""
    if arch != "qwen35moe" or d.v_heads == d.k_heads or ".linear_attn." not in name:
        return None
    v = v_perm(d.k_heads, d.v_heads, d.v_dim)
    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        return torch.cat([torch.arange(d.qk_rows), d.qk_rows + v])
    if name.endswith("in_proj_z.weight"):
        return v
    if name.endswith(("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias")):
        return v_perm(d.k_heads, d.v_heads, 1)
    return None


def col_perm(arch: str, name: str, d: Dims) -> torch.Tensor | None:
    """``stored = hf[:, perm]`` for HF tensor ``name`` (only ``out_proj`` of a reordered model)."""
    if (
        arch == "qwen35moe"
        and d.v_heads != d.k_heads
        and name.endswith("linear_attn.out_proj.weight")
    ):
        return v_perm(d.k_heads, d.v_heads, d.v_dim)
    return None


def gather_rows(t, perm: torch.Tensor):
    """``t[perm]`` along the rows (dim -2 of a matrix, dim 0 of a vector or conv kernel); a
    QuantWeight keeps its blocks (whole rows move)."""
    if isinstance(t, QuantWeight):
        return quant_weight(
            t.data.index_select(-2, perm.to(t.device)).contiguous(), t.shape, t.qtype
        )
    return t.index_select(0, perm.to(t.device))


def gather_cols(t, perm: torch.Tensor, width: int):
    """``t[:, perm]`` where ``perm`` moves whole groups of ``width`` columns; None for a
    QuantWeight whose blocks would be split (``width`` not a multiple of its block)."""
    if not isinstance(t, QuantWeight):
        return t.index_select(1, perm.to(t.device))
    block = QTYPES[t.qtype].block
    if width % block:
        return None
    groups = perm.view(-1, width)[:, 0] // width
    rows, cols = t.shape
    data = (
        t.data.view(rows, cols // width, -1).index_select(1, groups.to(t.device)).reshape(rows, -1)
    )
    return quant_weight(data.contiguous(), t.shape, t.qtype)


def row_slice(t, start: int, stop: int):
    """Rows ``start:stop`` of a matrix or QuantWeight (whole rows: the blocks stay)."""
    if isinstance(t, QuantWeight):
        return quant_weight(t.data[start:stop].contiguous(), (stop - start, t.shape[-1]), t.qtype)
    return t[start:stop]

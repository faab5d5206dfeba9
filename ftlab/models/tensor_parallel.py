"""Tensor and expert parallelism over ``torch.distributed`` (NCCL on NVIDIA, RCCL on ROCm under
the same ``"nccl"`` name, gloo on the CPU), for every model class (Qwen3-Next / Qwen3.5-MoE:
:func:`shard_qwen3_next`).

How a Qwen3-MoE layer is cut across ``N`` ranks (rank ``r``)::

    embedding  [V, H]          rows r V/N .. (r+1) V/N; ops.index with the row-range mask
                               (other ranks' tokens read zeros), then all-reduce (sum)
    q/k/v      [heads hd, H]   column-parallel: rank r holds heads r heads/N .. (its kv heads
                               likewise, or, with fewer kv heads than ranks, the one its query
                               heads read, replicated), so q-k norm, RoPE, the KV cache and
                               attention are local
    o_proj     [H, heads hd]   row-parallel: the columns of its heads; partial sums all-reduced
    router     [E, H]          replicated (every rank routes every token the same way)
    experts    [E, 2I, H] ...  expert-parallel: rank r holds experts r E/N .. (r+1) E/N and
                               computes every token's contributions from them (ids of other
                               ranks' experts fall outside its bank and add nothing), then one
                               all-reduce (sum)
    lm_head    [V, H]          vocab-parallel: the rows of its vocabulary shard; the logits
                               all-gathered along the vocabulary

Expert parallelism by all-reduce rather than all-to-all: after attention every rank holds every
token's hidden state anyway (the o_proj all-reduce), so each rank runs its experts on all tokens
and one all-reduce of ``[T, H]`` combines them. At decode (T <= 8) that is one latency-bound
collective a layer and no token exchange; an all-to-all dispatch would need two collectives and
a host-known split per step. Each rank's device holds only its shard: the weights are read on
the host, sliced, and only the slices are moved to the device. The loaders read only the rank's
routed experts and its vocabulary rows (``experts=`` and ``vocab=`` from
:func:`ftlab.models.pipeline.rank_ranges`): the banks arrive already cut, and so do the embedding
and an untied lm_head -- a GGUF file's ``token_embd`` / ``output`` sliced before the embedding is
dequantized, a safetensors slice of a HF one's rows -- and :func:`experts` / :func:`vocab_rows`
keep them as they are. A Qwen3-MoE rank's loader reads only its attention heads too (``heads=``
from :func:`ftlab.models.pipeline.rank_heads`): q/k/v rows and o_proj columns, a GGUF file's
``attn_*`` sliced before any cast (a packed o_proj whole blocks of each row, or read whole when
the cut falls inside a block: :func:`columns` then keeps the share dense, with its warning), a
HF one's safetensors slices; :func:`held` keeps projections of the rank's size as they are.
Every other tensor (norms, the router, a hybrid model's shared expert and its attention, linear
and full) is read whole, so each rank's host memory briefly holds those in full.

The process group the ranks run in and its collectives are :mod:`ftlab.models.tp_group`; its
names are exported here too, so that tensor parallelism is reached from this one module.
"""

from __future__ import annotations

import warnings
from dataclasses import fields, replace

import torch

from ftlab.models.tp_group import TensorParallel, close, process_group
from ftlab.quant import QTYPES, QuantWeight, quant_weight

__all__ = [
    "ShardDequantizedWarning",
    "TensorParallel",
    "close",
    "columns",
    "experts",
    "held",
    "move",
    "process_group",
    "rows",
    "shard_qwen3_moe",
    "shard_qwen3_next",
    "take",
    "unpermute_columns",
    "vocab_rows",
    "whole_blocks",
]


def rows(w, start: int, stop: int):
    """Rows ``start .. stop`` of a ``[N, K]`` weight, or experts ``start .. stop`` of a bank
    ``[E, ...]`` (dense or packed), copied: the full tensor is not kept alive by the slice."""
    if isinstance(w, QuantWeight):
        return quant_weight(w.data[start:stop].clone(), (stop - start, *w.shape[1:]), w.qtype)
    return w[start:stop].clone()


def held(
    w,
    start: int,
    stop: int,
    total: int,
    what: str,
    unit: str,
    dim: int = 0,
    dtype: torch.dtype = torch.float32,
):
    """Rows ``start .. stop`` of ``w [total, ...]`` (dense or packed), copied (:func:`rows`); a
    ``w`` that holds just those already (``shape[0] == stop - start``: loaded with that range, the
    loaders reading only a rank's rows) as it is. ValueError naming ``what`` for any other size.
    ``dim=-1``: columns ``start .. stop`` of ``w [..., total]`` likewise (:func:`columns`, which
    keeps a packed share dense in ``dtype`` when the cut falls inside its blocks)."""
    size = w.shape[dim]
    if size == total:
        return rows(w, start, stop) if dim == 0 else columns(w, start, stop, what, dtype)
    if size == stop - start:
        return w
    raise ValueError(
        f"{what} of {size} {unit} is neither all {total} nor this rank's {stop - start}"
    )


def experts(bank, start: int, stop: int, total: int):
    """Experts ``start .. stop`` of a bank of ``total``, copied (:func:`rows`); a bank that holds
    just those already (loaded with ``experts=(start, stop)``: the loaders read only a rank's
    experts) as it is. ValueError for a bank of any other size."""
    return held(bank, start, stop, total, "an expert bank", "experts")


def vocab_rows(config, weights, tp: TensorParallel, device: torch.device):
    """``(embed, lm_head)`` of this rank on ``device``: rows ``v0 .. v1`` of its vocabulary shard
    of the embedding ``[V, H]`` and lm_head ``[V, H]`` (``[v1 - v0, H]``; packed kept packed),
    copied from a full load or, from one with ``vocab=(v0, v1)`` (the loaders read only a rank's
    rows), kept as they are (:func:`held`); a tied lm_head stays the embedding (``lm_head is
    embed``). ValueError when tp does not divide the vocabulary, or for a tensor of neither size."""
    v0, v1 = tp.shard(config.vocab_size, "vocab_size")
    embed = held(weights.embed, v0, v1, config.vocab_size, "the embedding", "rows")
    tied = weights.lm_head is weights.embed
    lm_head = embed if tied else held(weights.lm_head, v0, v1, config.vocab_size, "lm_head", "rows")
    embed_d = embed.to(device)
    return embed_d, embed_d if tied else move(lm_head, device)


def take(w, index: torch.Tensor):
    """Rows ``index`` (int64 ``[n]``) of a ``[..., N, K]`` weight or bank, copied."""
    if isinstance(w, QuantWeight):
        data = w.data.index_select(-2, index.to(w.device)).contiguous()
        return quant_weight(data, (*w.shape[:-2], len(index), w.shape[-1]), w.qtype)
    return w.index_select(-2, index.to(w.device)).contiguous()


class ShardDequantizedWarning(UserWarning):
    """A packed weight whose rank share is not a whole number of blocks was made dense."""


def whole_blocks(w, start: int, stop: int) -> bool:
    """Whether columns ``start .. stop`` of ``w`` are whole blocks of it (always, for a dense
    ``w``)."""
    block = QTYPES[w.qtype].block if isinstance(w, QuantWeight) else 1
    return start % block == 0 and stop % block == 0


def columns(w, start: int, stop: int, what: str, dtype: torch.dtype = torch.float32):
    """Columns ``start .. stop`` of a ``[..., N, K]`` weight or bank, copied; a packed weight is
    cut between its blocks, or, when the cut falls inside one (a K-quant's 256 columns over more
    ranks than it has blocks), dequantized to ``dtype`` first, with a
    :class:`ShardDequantizedWarning` naming ``what``."""
    if isinstance(w, QuantWeight):
        block = QTYPES[w.qtype].block
        if whole_blocks(w, start, stop):
            part = (
                w.blocks[..., start // block : stop // block, :].reshape(*w.shape[:-1], -1).clone()
            )
            return quant_weight(part, (*w.shape[:-1], stop - start), w.qtype)
        from ftlab import ops

        warnings.warn(
            f"{what}: a {w.qtype} weight cut at columns {start}..{stop}, inside its blocks of "
            f"{block}: this rank keeps its share dense in {dtype}",
            ShardDequantizedWarning,
            stacklevel=2,
        )
        return ops.dequantize(w, torch.float32)[..., start:stop].to(dtype).contiguous()
    return w[..., start:stop].clone()


def unpermute_columns(w, perm: torch.Tensor, what: str):
    """``w`` with its columns back in order, where stored column j is column ``perm[j]``; a
    packed weight moves whole blocks (ValueError naming ``what`` when ``perm`` splits one)."""
    inverse = torch.argsort(perm.cpu())
    if not isinstance(w, QuantWeight):
        return w[..., inverse.to(w.device)].contiguous()
    block = QTYPES[w.qtype].block
    groups = perm.cpu().view(-1, block)
    if bool((groups != groups[:, :1] + torch.arange(block)).any()) or bool(
        (groups[:, 0] % block).any()
    ):
        raise ValueError(
            f"{what}: its column permutation moves parts of {w.qtype} blocks of {block}; tp > 1 "
            "needs whole blocks"
        )
    order = torch.argsort(groups[:, 0] // block)
    data = w.blocks.index_select(-2, order.to(w.device)).reshape(*w.shape[:-1], -1).contiguous()
    return quant_weight(data, w.shape, w.qtype)


def move(obj, device: torch.device):
    """A dataclass of weights (or a list of them) with every tensor and packed weight moved."""
    if isinstance(obj, list):
        return [move(o, device) for o in obj]
    if isinstance(obj, torch.Tensor | QuantWeight):
        return obj.to(device)
    if hasattr(obj, "__dataclass_fields__"):
        return replace(obj, **{f.name: move(getattr(obj, f.name), device) for f in fields(obj)})
    return obj


def shard_qwen3_moe(config, weights, tp: TensorParallel, device: torch.device):
    """This rank's shard of a Qwen3-MoE model's weights (module docstring), on ``device``; banks,
    embedding, lm_head and attention projections loaded with only the rank's experts / rows /
    heads (q/k/v rows, o_proj columns) are kept as they are (:func:`held`).
    ValueError when tp does not divide the heads, the kv heads, the experts or the vocabulary."""
    from ftlab.models.qwen3_moe.model_weights import LayerWeights, ModelWeights

    c = config
    hd = c.head_dim
    q0, q1 = tp.shard(c.num_attention_heads, "num_attention_heads")
    k0, k1 = tp.kv_heads(c.num_key_value_heads, c.num_attention_heads)
    nq, nkv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    e0, e1 = tp.shard(c.num_experts, "num_experts")
    tp.shard(c.vocab_size, "vocab_size")  # refused before any layer is cut
    dt = weights.embed.dtype  # the model's dense dtype
    layers = []
    for i, lw in enumerate(weights.layers):
        layers.append(
            move(
                LayerWeights(
                    q_proj=held(lw.q_proj, q0 * hd, q1 * hd, nq, f"layer {i} q_proj", "rows"),
                    k_proj=held(lw.k_proj, k0 * hd, k1 * hd, nkv, f"layer {i} k_proj", "rows"),
                    v_proj=held(lw.v_proj, k0 * hd, k1 * hd, nkv, f"layer {i} v_proj", "rows"),
                    o_proj=held(
                        lw.o_proj, q0 * hd, q1 * hd, nq, f"layer {i} o_proj", "columns", -1, dt
                    ),
                    q_norm=lw.q_norm,
                    k_norm=lw.k_norm,
                    input_norm=lw.input_norm,
                    post_attention_norm=lw.post_attention_norm,
                    router=lw.router,
                    w_gate_up=experts(lw.w_gate_up, e0, e1, c.num_experts),
                    w_down=experts(lw.w_down, e0, e1, c.num_experts),
                ),
                device,
            )
        )
    embed, lm_head = vocab_rows(c, weights, tp, device)
    return ModelWeights(embed=embed, layers=layers, norm=weights.norm.to(device), lm_head=lm_head)


def shard_qwen3_next(config, weights, tp: TensorParallel, device: torch.device):
    """This rank's shard of a Qwen3-Next / Qwen3.5-MoE model's weights, on ``device``: as
    :func:`shard_qwen3_moe` for embedding, full attention (q and gate rows of its heads), the
    routed experts (a bank loaded with only the rank's experts kept as it is: :func:`experts`)
    and lm_head (likewise: :func:`vocab_rows`); a linear-attention layer keeps its key heads and
    their value heads (q, k, v rows and conv channels, z, b, a, dt_bias, A; out_proj columns, put
    back in HF order first if stored permuted); the shared expert its share of the intermediate
    columns (gate and up rows, down columns), its gate replicated. ValueError when tp does not
    divide a count."""
    from ftlab.models.qwen3_next.model_weights import (
        AttentionWeights,
        DeltaNetWeights,
        MoeWeights,
        NextLayerWeights,
        NextWeights,
    )

    c = config
    hd, dk, dv = c.head_dim, c.linear_key_head_dim, c.linear_value_head_dim
    kd = c.key_dim
    e0, e1 = tp.shard(c.num_experts, "num_experts")
    tp.shard(c.vocab_size, "vocab_size")  # refused before any layer is cut
    i0, i1 = tp.shard(c.shared_expert_intermediate_size, "shared_expert_intermediate_size")
    inter = c.shared_expert_intermediate_size
    span = lambda a, b: torch.arange(a, b)
    dt = weights.embed.dtype  # the model's dense dtype
    layers = []
    for i, lw in enumerate(weights.layers):
        m = lw.mixer
        if isinstance(m, DeltaNetWeights):
            k0, k1 = tp.shard(c.linear_num_key_heads, "linear_num_key_heads")
            h0, h1 = tp.shard(c.linear_num_value_heads, "linear_num_value_heads")
            channels = torch.cat(
                [
                    span(k0 * dk, k1 * dk),
                    kd + span(k0 * dk, k1 * dk),
                    2 * kd + span(h0 * dv, h1 * dv),
                ]
            )
            out = (
                m.out_proj
                if m.out_perm is None
                else unpermute_columns(m.out_proj, m.out_perm, f"layer {i} out_proj")
            )
            mixer = DeltaNetWeights(
                in_proj_qkv=take(m.in_proj_qkv, channels),
                in_proj_z=take(m.in_proj_z, span(h0 * dv, h1 * dv)),
                in_proj_b=take(m.in_proj_b, span(h0, h1)),
                in_proj_a=take(m.in_proj_a, span(h0, h1)),
                conv=m.conv[channels.to(m.conv.device)].clone(),
                dt_bias=m.dt_bias[h0:h1].clone(),
                a_neg=m.a_neg[h0:h1].clone(),
                norm=m.norm,
                out_proj=columns(out, h0 * dv, h1 * dv, f"layer {i} out_proj", dt),
            )
        else:
            q0, q1 = tp.shard(c.num_attention_heads, "num_attention_heads")
            a0, a1 = tp.kv_heads(c.num_key_value_heads, c.num_attention_heads)
            mixer = AttentionWeights(
                q_proj=rows(m.q_proj, q0 * hd, q1 * hd),
                gate_proj=rows(m.gate_proj, q0 * hd, q1 * hd),
                k_proj=rows(m.k_proj, a0 * hd, a1 * hd),
                v_proj=rows(m.v_proj, a0 * hd, a1 * hd),
                o_proj=columns(m.o_proj, q0 * hd, q1 * hd, f"layer {i} o_proj", dt),
                q_norm=m.q_norm,
                k_norm=m.k_norm,
            )
        mw = lw.moe
        shared_rows = torch.cat([span(i0, i1), inter + span(i0, i1)])
        shared_down = columns(mw.shared_down, i0, i1, f"layer {i} shared expert down", dt)
        shared_gate_up = take(mw.shared_gate_up, shared_rows)
        if isinstance(shared_gate_up, QuantWeight) and not isinstance(shared_down, QuantWeight):
            from ftlab import ops  # the expert op takes two packed banks or two dense ones

            shared_gate_up = ops.dequantize(shared_gate_up, torch.float32).to(dt)
        moe = MoeWeights(
            router=mw.router,
            w_gate_up=experts(mw.w_gate_up, e0, e1, c.num_experts),
            w_down=experts(mw.w_down, e0, e1, c.num_experts),
            shared_gate_up=shared_gate_up,
            shared_down=shared_down,
            shared_gate=mw.shared_gate,
        )
        layers.append(
            move(NextLayerWeights(lw.input_norm, lw.post_attention_norm, mixer, moe), device)
        )
    embed, lm_head = vocab_rows(c, weights, tp, device)
    return NextWeights(embed=embed, layers=layers, norm=weights.norm.to(device), lm_head=lm_head)

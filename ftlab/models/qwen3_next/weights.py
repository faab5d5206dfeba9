"""A Qwen3-Next / Qwen3.5-MoE model's weights
(:class:`~ftlab.models.qwen3_next.model_weights.NextWeights`) from tensors under their HF names,
whatever file they came from (a HF directory, a GGUF file whose tensors were renamed and
un-transformed back to HF form).

The names are the text model's, prefixed ``model.`` (a ``Qwen3_5MoeForConditionalGeneration``
checkpoint's ``model.language_model.`` is renamed before): ``model.embed_tokens.weight``,
``model.norm.weight``, ``lm_head.weight`` (absent when tied), and per layer ``model.layers.N.``
``input_layernorm.weight``, ``post_attention_layernorm.weight``,

- linear-attention layers: ``linear_attn.`` ``in_proj_qkvz.weight`` + ``in_proj_ba.weight``
  (Qwen3-Next: rows grouped per key head) or ``in_proj_qkv.weight``, ``in_proj_z.weight``,
  ``in_proj_b.weight``, ``in_proj_a.weight`` (Qwen3.5), ``conv1d.weight`` ``[C, 1, W]`` or ``[C,
  W]``, ``dt_bias``, ``A_log``, ``norm.weight``, ``out_proj.weight``;
- full-attention layers: ``self_attn.`` ``q_proj.weight`` (``[heads * 2 * hd, H]``, each head's
  query rows then its gate rows), ``k_proj.weight``, ``v_proj.weight``, ``o_proj.weight``,
  ``q_norm.weight``, ``k_norm.weight``;
- MoE: ``mlp.gate.weight``, the experts per expert (``mlp.experts.J.{gate,up,down}_proj.weight``)
  or as banks (``mlp.experts.gate_up_proj [E, 2I, H]`` or ``mlp.experts.gate_proj`` and
  ``mlp.experts.up_proj [E, I, H]``; ``mlp.experts.down_proj [E, H, I]``),
  ``mlp.shared_expert.{gate,up,down}_proj.weight``, ``mlp.shared_expert_gate.weight``.

``experts=(start, stop)`` builds banks of only those routed experts (a tensor-parallel rank's
share): per-expert tensors are read for those experts alone, and a bank tensor must already hold
just them (``[stop - start, ...]``: the readers cut it as they read, ``read_gguf_hf`` and
``HFTensors`` with ``experts``); the router and the shared expert are whole. ``vocab=(start,
stop)`` likewise builds the embedding and an untied ``lm_head`` of only those vocabulary rows
(``[stop - start, H]``), from tensors that hold just them (cut as read: ``read_gguf_hf`` and
``HFTensors`` with ``vocab``).

``input_perms`` may give, for a ``linear_attn.out_proj.weight``, the permutation ``p``
(``[value_dim]`` int) of its stored columns: column j is HF's column ``p[j]`` (a GGUF file's
value heads in another order). A dense weight is put back in HF order at load; a Q4_0 one stays
as stored and the model permutes its input instead.

Values are HF's: the zero-centred norms (``input_layernorm``, ``post_attention_layernorm``,
``model.norm``, ``q_norm``, ``k_norm``) hold ``w`` of ``(1 + w)``, ``A_log`` is the log of A.
Each tensor is a float tensor or a :class:`~ftlab.quant.QuantWeight`: Q4_0 projections and
expert banks stay packed, other quant types and every norm, conv, router and gate are made dense
in the model's dtype.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ftlab import ops
from ftlab.formats import CheckpointError
from ftlab.models.checkpoint_checks import expert_range, row_range
from ftlab.models.qwen3_next.config import Qwen3NextConfig
from ftlab.models.qwen3_next.model_weights import (
    AttentionWeights,
    DeltaNetWeights,
    MoeWeights,
    NextLayerWeights,
    NextWeights,
    Weight,
)
from ftlab.quant import Q4_0Weight, QuantWeight


class _Reader:
    """Checked access to the named tensors: shape, float type, device and dtype."""

    def __init__(self, tensors: Mapping, where: str, device: torch.device, dtype: torch.dtype):
        self.tensors, self.where, self.device, self.dtype = tensors, where, device, dtype

    def has(self, name: str) -> bool:
        return name in self.tensors

    def raw(self, name: str, *shape: int) -> torch.Tensor | QuantWeight:
        if name not in self.tensors:
            raise CheckpointError(f"{self.where}: missing tensor {name!r}")
        t = self.tensors[name]
        if isinstance(t, torch.Tensor) and not t.dtype.is_floating_point:
            raise CheckpointError(
                f"{self.where}: tensor {name!r} has dtype {t.dtype}, expected a floating-point "
                "dtype"
            )
        if not isinstance(t, (torch.Tensor, QuantWeight)):
            raise CheckpointError(
                f"{self.where}: tensor {name!r} must be a tensor or a QuantWeight, got "
                f"{type(t).__name__}"
            )
        if tuple(t.shape) != shape:
            raise CheckpointError(
                f"{self.where}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape}"
            )
        return t

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.tensors:
            raise CheckpointError(f"{self.where}: missing tensor {name!r}")
        return tuple(self.tensors[name].shape)

    def dense(self, name: str, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Tensor ``name`` of ``shape``, dense in ``dtype`` (the model's) on the device."""
        t = self.raw(name, *shape)
        if isinstance(t, QuantWeight):
            t = ops.dequantize(t.to(self.device), torch.float32)
        return t.to(device=self.device, dtype=dtype or self.dtype)

    def weight(self, name: str, *shape: int) -> Weight:
        """A projection: Q4_0 kept packed, anything else dense."""
        t = self.raw(name, *shape)
        return t.to(self.device) if isinstance(t, Q4_0Weight) else self.dense(name, *shape)

    def norm(self, name: str, n: int, zero_centred: bool) -> torch.Tensor:
        """A norm's scale ``[n]``: a zero-centred one's ``1 + w`` in fp32 (rounded to a 16-bit
        dtype, ``1 + w`` loses the low bits of a small ``w``), any other the model's dtype's values
        held in fp32 (the gated norm reads it in fp32: no cast a decode step)."""
        w = self.dense(name, n, dtype=torch.float32)
        return w + 1 if zero_centred else w.to(self.dtype).float()


def take_rows(w: Weight, rows: torch.Tensor) -> Weight:
    """Rows ``rows`` of ``w [N, K]`` (a Q4_0 weight's blocks move with their rows)."""
    if isinstance(w, Q4_0Weight):
        return Q4_0Weight(w.data[rows.to(w.device)].contiguous(), (len(rows), w.shape[-1]))
    return w[rows.to(w.device)].contiguous()


def _dense(ws: list[Weight]) -> list[torch.Tensor]:
    """Q4_0 weights among dense ones (of one dtype) dequantized to that dtype."""
    dtype = next((w.dtype for w in ws if isinstance(w, torch.Tensor)), torch.float32)
    return [ops.dequantize(w, dtype) if isinstance(w, QuantWeight) else w for w in ws]


def stack_rows(ws: list[Weight]) -> Weight:
    """``[N_i, K]`` weights stacked along N, or expert banks ``[E, N_i, K]`` along their N; all
    Q4_0 or else dense (the Q4_0 ones dequantized)."""
    if all(isinstance(w, Q4_0Weight) for w in ws):
        data = torch.cat([w.data for w in ws], dim=-2)
        return Q4_0Weight(data, (*data.shape[:-1], ws[0].shape[-1]))
    return torch.cat(_dense(ws), dim=-2)


def _qkvz_rows(c: Qwen3NextConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Qwen3-Next's ``in_proj_qkvz`` / ``in_proj_ba`` rows per key-head group (``[q, k, v, z]`` and
    ``[b, a]`` of each group, r = Hv / Hk value heads a group) -> the rows of qkv (all q, all k,
    all v), z, b and a."""
    hk, dk, dv = c.linear_num_key_heads, c.linear_key_head_dim, c.linear_value_head_dim
    r = c.linear_num_value_heads // hk
    group = 2 * dk + 2 * r * dv
    base = torch.arange(hk)[:, None] * group
    q = (base + torch.arange(dk)).flatten()
    k = (base + dk + torch.arange(dk)).flatten()
    v = (base + 2 * dk + torch.arange(r * dv)).flatten()
    z = (base + 2 * dk + r * dv + torch.arange(r * dv)).flatten()
    ba = torch.arange(hk)[:, None] * 2 * r
    return (
        torch.cat([q, k, v]),
        z,
        (ba + torch.arange(r)).flatten(),
        (ba + r + torch.arange(r)).flatten(),
    )


def _out_proj(
    rd: _Reader, c: Qwen3NextConfig, name: str, perm: object
) -> tuple[Weight, torch.Tensor | None]:
    """out_proj in HF column order when dense; a packed one with the permutation it needs."""
    w = rd.weight(name, c.hidden_size, c.value_dim)
    if perm is None:
        return w, None
    perm = torch.as_tensor(perm)
    if (
        perm.dtype.is_floating_point
        or tuple(perm.shape) != (c.value_dim,)
        or not torch.equal(perm.sort().values.cpu(), torch.arange(c.value_dim))
    ):
        raise CheckpointError(
            f"{rd.where}: the input permutation of {name!r} must be a permutation of "
            f"range({c.value_dim}), got {perm!r:.80}"
        )
    perm = perm.to(device=rd.device, dtype=torch.long)
    if isinstance(w, Q4_0Weight):
        return w, perm
    return w[:, perm.argsort()].contiguous(), None


def _delta_net(rd: _Reader, c: Qwen3NextConfig, p: str, perms: Mapping) -> DeltaNetWeights:
    h, hv = c.hidden_size, c.linear_num_value_heads
    if rd.has(p + "in_proj_qkvz.weight"):
        qkvz = rd.weight(p + "in_proj_qkvz.weight", c.conv_dim + c.value_dim, h)
        ba = rd.weight(p + "in_proj_ba.weight", 2 * hv, h)
        qkv_rows, z_rows, b_rows, a_rows = _qkvz_rows(c)
        qkv, z, b, a = (
            take_rows(qkvz, qkv_rows),
            take_rows(qkvz, z_rows),
            take_rows(ba, b_rows),
            take_rows(ba, a_rows),
        )
    else:
        qkv = rd.weight(p + "in_proj_qkv.weight", c.conv_dim, h)
        z = rd.weight(p + "in_proj_z.weight", c.value_dim, h)
        b, a = rd.weight(p + "in_proj_b.weight", hv, h), rd.weight(p + "in_proj_a.weight", hv, h)
    width = c.linear_conv_kernel_dim
    conv_shape = (
        (c.conv_dim, 1, width) if len(rd.shape(p + "conv1d.weight")) == 3 else (c.conv_dim, width)
    )
    # held in fp32 (the values of the model's dtype), as the conv reads it: no cast a decode step
    conv = rd.dense(p + "conv1d.weight", *conv_shape).reshape(c.conv_dim, width).float()
    a_log = rd.dense(p + "A_log", hv, dtype=torch.float32)
    out_proj, out_perm = _out_proj(rd, c, p + "out_proj.weight", perms.get(p + "out_proj.weight"))
    return DeltaNetWeights(
        qkv,
        z,
        b,
        a,
        conv,
        rd.dense(p + "dt_bias", hv, dtype=torch.float32),
        -a_log.exp(),
        rd.norm(p + "norm.weight", c.linear_value_head_dim, False),
        out_proj,
        out_perm,
    )


def _attention(rd: _Reader, c: Qwen3NextConfig, p: str) -> AttentionWeights:
    h, nh, hd = c.hidden_size, c.num_attention_heads, c.head_dim
    kv = c.num_key_value_heads * hd
    q_full = rd.weight(p + "q_proj.weight", 2 * nh * hd, h)
    rows = torch.arange(nh)[:, None] * 2 * hd + torch.arange(hd)
    return AttentionWeights(
        take_rows(q_full, rows.flatten()),
        take_rows(q_full, (rows + hd).flatten()),
        rd.weight(p + "k_proj.weight", kv, h),
        rd.weight(p + "v_proj.weight", kv, h),
        rd.weight(p + "o_proj.weight", h, nh * hd),
        rd.norm(p + "q_norm.weight", hd, True),
        rd.norm(p + "k_norm.weight", hd, True),
    )


def _moe(rd: _Reader, c: Qwen3NextConfig, p: str, banks: tuple[int, int]) -> MoeWeights:
    """The MoE block: routed banks of experts ``banks = (start, stop)`` (``[stop - start, ...]``),
    the router ``[E, H]`` and the shared expert."""
    h, e, inter, si = (
        c.hidden_size,
        c.num_experts,
        c.moe_intermediate_size,
        c.shared_expert_intermediate_size,
    )
    held = banks[1] - banks[0]  # the experts a bank holds
    x = p + "experts."
    if rd.has(x + "gate_up_proj"):
        gate_up = rd.weight(x + "gate_up_proj", held, 2 * inter, h)
        down = rd.weight(x + "down_proj", held, h, inter)
    elif rd.has(x + "gate_proj"):
        gate_up = stack_rows(
            [rd.weight(x + "gate_proj", held, inter, h), rd.weight(x + "up_proj", held, inter, h)]
        )
        down = rd.weight(x + "down_proj", held, h, inter)
    else:
        per = [
            [rd.weight(f"{x}{j}.{n}_proj.weight", *s) for j in range(*banks)]
            for n, s in (("gate", (inter, h)), ("up", (inter, h)), ("down", (h, inter)))
        ]
        gate, up, down = (_stack(ws) for ws in per)
        gate_up = stack_rows([gate, up])
    # the expert kernels take one kind
    if isinstance(gate_up, Q4_0Weight) != isinstance(down, Q4_0Weight):
        gate_up, down = _dense([gate_up, down])
    s = p + "shared_expert."
    shared_gate_up = stack_rows(
        [rd.weight(s + "gate_proj.weight", si, h), rd.weight(s + "up_proj.weight", si, h)]
    )
    shared_down = rd.weight(s + "down_proj.weight", h, si)
    if isinstance(shared_gate_up, Q4_0Weight) != isinstance(shared_down, Q4_0Weight):
        shared_gate_up, shared_down = _dense([shared_gate_up, shared_down])
    return MoeWeights(
        rd.dense(p + "gate.weight", e, h),
        gate_up,
        down,
        _bank(shared_gate_up),
        _bank(shared_down),
        rd.dense(p + "shared_expert_gate.weight", 1, h),
    )


def _stack(ws: list[Weight]) -> Weight:
    """Per-expert ``[N, K]`` weights -> a bank ``[E, N, K]`` (all Q4_0, else dense)."""
    if all(isinstance(w, Q4_0Weight) for w in ws):
        return Q4_0Weight(torch.stack([w.data for w in ws]), (len(ws), *ws[0].shape))
    return torch.stack(_dense(ws))


def _bank(w: Weight) -> Weight:
    """``[N, K]`` -> a one-expert bank ``[1, N, K]``."""
    if isinstance(w, Q4_0Weight):
        return Q4_0Weight(w.data[None], (1, *w.shape))
    return w[None]


def build_weights(
    config: Qwen3NextConfig,
    tensors: Mapping,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    where: str = "checkpoint",
    input_perms: Mapping | None = None,
    progress=None,
    experts: tuple[int, int] | None = None,
    vocab: tuple[int, int] | None = None,
) -> NextWeights:
    """:class:`NextWeights` of ``config`` from ``tensors`` (HF name -> float tensor or
    :class:`~ftlab.quant.QuantWeight`; module docstring) on ``device``, dense weights in
    ``dtype``; ``input_perms``: ``{out_proj name: permutation}`` (module docstring). CheckpointError
    naming ``where`` and the tensor for one missing or misshapen.
    ``progress``: wraps the range of layers (a tqdm), or None. ``experts``: ``(start, stop)``
    (None: all) -- each layer's routed banks ``w_gate_up [stop - start, 2I, H]`` and ``w_down
    [stop - start, H, I]`` of only those experts (module docstring: a bank tensor of ``tensors``
    must hold just them). ``vocab``: ``(start, stop)`` (None: all) -- the embedding ``[stop -
    start, H]`` (dense in ``dtype``) and an untied ``lm_head`` of only those vocabulary rows
    (``model.embed_tokens.weight`` and ``lm_head.weight`` of ``tensors`` must hold just them; a
    tied lm_head is the embedding). ValueError naming ``experts`` or ``vocab`` for a range that
    is not ``0 <= start < stop <= count``."""
    c, device = config, torch.device(device)
    banks = expert_range(experts, c.num_experts)
    v0, v1 = row_range(vocab, c.vocab_size, "vocab")
    rd = _Reader(tensors, where, device, dtype)
    h = c.hidden_size
    layers = []
    for i in progress(range(c.num_hidden_layers)) if progress else range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        if c.layer_types[i] == "linear_attention":
            mixer = _delta_net(rd, c, p + "linear_attn.", input_perms or {})
        else:
            mixer = _attention(rd, c, p + "self_attn.")
        layers.append(
            NextLayerWeights(
                rd.norm(p + "input_layernorm.weight", h, True),
                rd.norm(p + "post_attention_layernorm.weight", h, True),
                mixer,
                _moe(rd, c, p + "mlp.", banks),
            )
        )
    embed = rd.dense("model.embed_tokens.weight", v1 - v0, h)
    lm_head = embed if c.tie_word_embeddings else rd.weight("lm_head.weight", v1 - v0, h)
    return NextWeights(embed, layers, rd.norm("model.norm.weight", h, True), lm_head)

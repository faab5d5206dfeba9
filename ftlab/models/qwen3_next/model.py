"""The hybrid Qwen MoE models -- Qwen3-Next and Qwen3.5-MoE / Qwen3.6 (one config,
:class:`~ftlab.models.qwen3_next.config.Qwen3NextConfig`, ``arch`` tells them apart) -- as plain
PyTorch over ftlab ops.

Per layer: RMSNorm -> a token mixer -> residual -> RMSNorm -> MoE -> residual. The mixer is
either a gated-deltanet linear attention (``linear_attention`` layers: one input projection to
q, k, v, z, b, a; the causal depthwise conv1d with SiLU over q, k, v (``ops.causal_conv1d``);
the gated delta rule (``ops.gated_delta_rule``, one token at a time ``ops.gated_delta_step``)
with ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, q and k
L2-normalised; ``ops.gated_rmsnorm`` by z; out_proj) or a gated full attention
(``full_attention`` layers: q with a per-head output gate, per-head RMSNorm of q and k and
partial RoPE (``ops.qk_norm_rope``), GQA over the static KV cache, ``attn * sigmoid(gate)``
(``ops.output_gate``), o_proj). The MoE: softmax top-k routed SwiGLU experts (``ops.route_topk``,
``ops.moe_experts``) plus a shared SwiGLU expert scaled by ``sigmoid(shared_expert_gate(x))``
(``ops.moe_experts`` over a one-expert bank, the gate as its routing weight). With hybrid CPU/GPU
experts (:mod:`ftlab.hybrid`) a layer's routed experts run through its ``HybridDecodeExecutor``
(some in GPU slots, the rest on the CPU) and the shared expert stays on the GPU.

The weights it reads are :mod:`~ftlab.models.qwen3_next.model_weights`; what it keeps between
forward passes (KV cache, conv and delta state), allocated at construction, is
:class:`~ftlab.models.qwen3_next.state.NextState`.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import torch
import torch.nn.functional as F

from ftlab import ops
from ftlab.backends import DECODE_MAX_TOKENS
from ftlab.models.decode_plan import DecodePlan, Planned, plan_of
from ftlab.models.layers import (
    Stage,
    add_norm,
    check_hybrid,
    embed,
    experts,
    gather_logits,
    hybrid_end_step,
    linear,
    rms_norm,
    route,
    routed_experts,
)
from ftlab.models.pipeline_args import MODEL_OPS
from ftlab.models.qwen3_next.config import Qwen3NextConfig
from ftlab.models.qwen3_next.model_weights import MoeWeights, NextWeights, Weight
from ftlab.models.qwen3_next.state import NextState
from ftlab.reference.gated_delta_rule import step_gates

__all__ = ["Qwen3Next"]


class Qwen3Next(Planned):
    """The model over ftlab ops. ``plan``: its :class:`~ftlab.models.decode_plan.DecodePlan` (the
    backend of each op of ``pipeline_args.MODEL_OPS``, the quantized weights' path, fusions; without
    one, the default plan of ``backends`` and ``q4_0_path``). ``static=True`` keeps every shape
    fixed and the host out of the forward pass (what graph capture of a decode step needs).
    ``q4_0_path``: the path of Q4_0 weights (see ops.q4_0_matmul and ops.moe_experts). ``hybrid``:
    one ``ftlab.hybrid.HybridDecodeExecutor`` a layer (or None), which then runs that layer's routed
    experts, some on the GPU's expert slots and the rest on the CPU (the shared expert stays on the
    GPU); :meth:`end_step` moves their residency between steps. ``tp``: this rank's
    :class:`ftlab.models.tensor_parallel.TensorParallel` when ``weights`` is its shard
    (:func:`~ftlab.models.tensor_parallel.shard_qwen3_next`): heads of both mixers, routed experts,
    the shared expert's intermediate columns and the vocabulary split across the ranks, partial
    results all-reduced (the vocabulary's logits all-gathered)."""

    OPS = MODEL_OPS  # the ops of its backends map that it runs

    def __init__(
        self,
        config: Qwen3NextConfig,
        weights: NextWeights,
        *,
        max_batch: int = 1,
        max_seq_len: int = 512,
        plan: DecodePlan | None = None,
        backends: dict[str, str] | None = None,
        q4_0_path: str = "auto",
        static: bool = False,
        hybrid: list | None = None,
        tp=None,
    ):
        c = self.config = config
        self.plan = plan_of(plan, backends, q4_0_path)
        self.tp = tp
        check_hybrid(hybrid, tp, c.num_hidden_layers)
        n = tp.world if tp is not None else 1
        if tp is not None:
            tp.check_divides(
                num_attention_heads=c.num_attention_heads,
                linear_num_key_heads=c.linear_num_key_heads,
                linear_num_value_heads=c.linear_num_value_heads,
                num_experts=c.num_experts,
                vocab_size=c.vocab_size,
            )
        # this rank's heads (all of them without tp): full attention, then linear attention
        self.heads, self.kv_heads = c.num_attention_heads // n, max(1, c.num_key_value_heads // n)
        self.lin_k_heads, self.lin_v_heads = (
            c.linear_num_key_heads // n,
            c.linear_num_value_heads // n,
        )
        self.hybrid = hybrid
        # the last forward pass's ids of each hybrid layer
        self.routed: dict[int, torch.Tensor] = {}
        self._id_cols: dict[tuple, torch.Tensor] = {}  # _ids' columns of decode steps
        self.weights, self.max_batch, self.max_seq_len = weights, max_batch, max_seq_len
        self.static = static
        device, dtype = weights.embed.device, weights.embed.dtype
        heads = (self.kv_heads, self.lin_k_heads, self.lin_v_heads)
        self.state = NextState(c, *heads, max_batch, max_seq_len, static, device, dtype)
        self.cache = self.state.cache  # the name every model gives its KV cache (callers fill it)
        # the layers whose routed and shared experts run as one moe_experts call
        # (MoeWeights.shared_in_banks):
        # not a hybrid layer's (its routed experts go through the executor), not a tensor-parallel
        # shard's
        self.one_call = (
            set()
            if tp is not None
            else {
                i
                for i, lw in enumerate(weights.layers)
                if not (hybrid and hybrid[i]) and lw.moe.shared_in_banks()
            }
        )

    def recurrent_state(self) -> list[torch.Tensor]:
        """Every conv and delta state buffer (what a decode graph's warm-up saves and restores)."""
        return self.state.recurrent()

    def end_step(self) -> None:
        """Between steps (never inside a captured graph): each hybrid layer's residency follows
        the routes of the last forward pass (one synchronization for all layers); nothing to do
        without hybrid layers."""
        hybrid_end_step(self.hybrid, self.routed)

    def linear(self, x: torch.Tensor, w: Weight) -> torch.Tensor:
        b, p = self.backends, self.plan
        return linear(x, w, b["q4_0_matmul"], p.quant_path, checks=p.checks, plans=self.op_plans)

    def _proj(
        self, x: torch.Tensor, fused: Weight | None, parts: list[Weight]
    ) -> list[torch.Tensor]:
        """``x`` through each of ``parts``: one matmul over ``fused`` (their rows stacked) when it
        exists."""
        if fused is None:
            return [self.linear(x, w) for w in parts]
        return list(self.linear(x, fused).split([w.shape[0] for w in parts], dim=-1))

    def delta_net(
        self, i: int, x: torch.Tensor, fresh: torch.Tensor, snapshot: bool
    ) -> Generator[Stage, None, torch.Tensor]:
        """Linear-attention layer ``i`` on normed ``x [B, T, H]``; ``fresh [B]`` bool: the
        sequences whose state starts afresh. Yields its stages, returns ``[B, T, H]``."""
        c, lw = self.config, self.weights.layers[i].mixer
        b, t, _ = x.shape
        hk, hv = self.lin_k_heads, self.lin_v_heads
        dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
        kd, vd = hk * dk, hv * dv
        qkv, z, beta_in, a = self._proj(
            x, lw.in_proj(), [lw.in_proj_qkv, lw.in_proj_z, lw.in_proj_b, lw.in_proj_a]
        )
        yield Stage(f"layer {i} in_proj", {"qkv": qkv, "z": z, "b": beta_in, "a": a}, "qkv")
        conv_state = self.state.conv[i][:b]
        if t == 1:  # decode: the state updated in place, the fresh rows' reset inside the op
            mixed = ops.causal_conv1d_update(
                qkv[:, 0],
                lw.conv,
                None,
                conv_state,
                activation="silu",
                reset=fresh,
                backend=self.backends["causal_conv1d_update"],
            )[:, None]
        else:
            start = torch.where(
                fresh[:, None, None], torch.zeros((), dtype=x.dtype, device=x.device), conv_state
            )
            mixed, new = ops.causal_conv1d(
                qkv,
                lw.conv,
                None,
                state=start,
                activation="silu",
                backend=self.backends["causal_conv1d"],
            )
            conv_state.copy_(new)
        yield Stage(
            f"layer {i} conv", {"qkv": mixed, **self._state("state", conv_state, snapshot)}, "qkv"
        )
        q, k, v = mixed.split([kd, kd, vd], dim=-1)
        q, k, v = q.reshape(b, t, hk, dk), k.reshape(b, t, hk, dk), v.reshape(b, t, hv, dv)
        state = self.state.delta[i][:b]
        gates = {}
        # the gates g and beta from a and b inside the step's kernel, the fresh rows reset there
        if t == 1:
            o = ops.gated_delta_step(
                q[:, 0],
                k[:, 0],
                v[:, 0],
                a[:, 0],
                beta_in[:, 0],
                state,
                gates=(lw.a_neg, lw.dt_bias),
                reset=fresh,
                backend=self.backends["gated_delta_step"],
            )[:, None]
            if snapshot:  # the stage shows them as a prefill's does
                gates = dict(
                    zip(("g", "beta"), step_gates(a, beta_in, lw.a_neg, lw.dt_bias), strict=True)
                )
        else:
            g, beta = step_gates(a, beta_in, lw.a_neg, lw.dt_bias)
            start = torch.where(fresh[:, None, None, None], torch.zeros((), device=x.device), state)
            o, final = ops.gated_delta_rule(
                q, k, v, g, beta, state=start, backend=self.backends["gated_delta_rule"]
            )
            state.copy_(final)
            gates = {"g": g, "beta": beta}
        yield Stage(
            f"layer {i} delta_rule",
            {"out": o, **gates, **self._state("state", state, snapshot)},
            "out",
        )
        y = ops.gated_rmsnorm(
            o.reshape(b * t, hv, dv),
            z.reshape(b * t, hv, dv),
            lw.norm,
            c.rms_norm_eps,
            backend=self.backends["gated_rmsnorm"],
        )
        yield Stage(f"layer {i} gated_norm", {"out": y}, "out")
        y = y.view(b, t, vd)
        return self._reduce(
            self.linear(y if lw.out_perm is None else y[..., lw.out_perm], lw.out_proj)
        )

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks of a row-parallel projection's (or experts') part; x without
        tp."""
        return x if self.tp is None else self.tp.all_reduce(x)

    @staticmethod
    def _state(name: str, state: torch.Tensor, snapshot: bool) -> dict[str, torch.Tensor]:
        return {name: state.clone()} if snapshot else {}

    def attention(self, i: int, x: torch.Tensor, geo: dict) -> Generator[Stage, None, torch.Tensor]:
        """Full-attention layer ``i`` on normed ``x [B, T, H]`` (``geo``: the KV cache's geometry of
        the positions). Yields its stages, returns ``[B, T, H]``."""
        c, lw = self.config, self.weights.layers[i].mixer
        b, t, _ = x.shape
        nh, nkv, hd = self.heads, self.kv_heads, c.head_dim
        q, gate, k, v = self._proj(x, lw.qgkv(), [lw.q_proj, lw.gate_proj, lw.k_proj, lw.v_proj])
        yield Stage(f"layer {i} q_gate", {"q": q, "gate": gate, "k": k, "v": v}, "q")
        wide = lw.q_norm.dtype  # fp32 scales 1 + w: the op casts its weights to q's dtype
        q, k = ops.qk_norm_rope(
            q.reshape(b * t, nh, hd).to(wide),
            k.reshape(b * t, nkv, hd).to(wide),
            lw.q_norm,
            lw.k_norm,
            geo["cos"],
            geo["sin"],
            c.rms_norm_eps,
            rotary_dim=c.rotary_dim,
            backend=self.backends["qk_norm_rope"],
        )
        q, k = q.to(x.dtype), k.to(x.dtype)
        yield Stage(f"layer {i} qk_norm_rope", {"q": q, "k": k}, "q")
        att = self.cache.attend(
            self.state.slot[i],
            q.view(b, t, nh, hd),
            k.view(b, t, nkv, hd),
            v.reshape(b, t, nkv, hd),
            geo,
            self.plan,
        ).reshape(b * t, nh * hd)
        yield Stage(f"layer {i} attention", {"attention": att}, "attention")
        gated = ops.output_gate(
            att, gate.reshape(b * t, nh * hd), backend=self.backends["output_gate"]
        )
        yield Stage(f"layer {i} output_gate", {"attention": gated}, "attention")
        return self._reduce(self.linear(gated.view(b, t, -1), lw.o_proj))

    def moe(self, i: int, h: torch.Tensor) -> Generator[Stage, None, torch.Tensor]:
        """The MoE of layer ``i`` on normed ``h [N, H]``: router, routed experts, shared expert.
        Yields their stages, returns ``[N, H]``."""
        c, mw = self.config, self.weights.layers[i].moe
        logits, weights, ids = route(
            h, mw.router, c.num_experts_per_tok, c.norm_topk_prob, self.backends
        )
        yield Stage(
            f"layer {i} router", {"logits": logits, "weights": weights, "ids": ids}, "weights"
        )
        kw = {
            "backend": self.backends["moe_experts"],
            "path": self.q4_0_path,
            "checks": True,
            "plans": self.op_plans,
        }
        # [N, 1]: the shared expert's weight
        gate = torch.sigmoid(F.linear(h, mw.shared_gate).float())
        # routed and shared experts in one call: the shared one as slot k, expert E
        if i in self.one_call:
            both = experts(
                h,
                *mw.banks,
                torch.cat([weights, gate], 1),
                torch.cat([ids, self._ids(h, mw)], 1),
                **kw,
            )
            yield Stage(f"layer {i} experts", {"experts": both}, "experts")
            yield Stage(f"layer {i} shared_expert", {"gate": gate}, "gate")
            return both
        routed = self._reduce(self.routed_experts(i, h, weights, ids))
        yield Stage(f"layer {i} experts", {"experts": routed}, "experts")
        shared = self._reduce(
            experts(h, mw.shared_gate_up, mw.shared_down, gate, self._ids(h), **kw)
        )
        yield Stage(
            f"layer {i} shared_expert", {"shared_expert": shared, "gate": gate}, "shared_expert"
        )
        return routed + shared

    def _ids(self, h: torch.Tensor, mw: MoeWeights | None = None) -> torch.Tensor:
        """The shared expert's ids ``[N, 1]`` int32 for ``h [N, H]``: 0 in its own bank, or E in the
        banks of ``mw.shared_in_banks()``; for a decode step's row counts made once and kept (never
        written), not filled again every layer of every step."""
        e = 0 if mw is None else mw.w_gate_up.shape[0]
        # a prefill's: made each call (kept, every prompt length would stay)
        if h.shape[0] > DECODE_MAX_TOKENS:
            return torch.full((h.shape[0], 1), e, dtype=torch.int32, device=h.device)
        key = (h.shape[0], e, h.device)
        if key not in self._id_cols:
            self._id_cols[key] = torch.full((h.shape[0], 1), e, dtype=torch.int32, device=h.device)
        return self._id_cols[key]

    def routed_experts(
        self, i: int, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """Layer ``i``'s routed experts on ``h [N, H]`` with the router's top-k ``weights`` and
        ``ids [N, k]``: ``ops.moe_experts`` over the layer's banks, or its hybrid executor -- a
        decode step (up to ``DECODE_MAX_TOKENS`` rows) through the executor's handshake
        (graph-capturable), a longer pass (prefill) through its eager schedule."""
        ex = self.hybrid[i] if self.hybrid else None
        if ex is not None:
            self.routed[i] = ids  # what end_step moves the residency by
        return routed_experts(
            h,
            self.weights.layers[i].moe,
            weights,
            ids,
            ex,
            self.tp,
            self.backends["moe_experts"],
            self.q4_0_path,
            True,
            self.op_plans,
        )

    def stages(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        last_only: bool = False,
        snapshot: bool = True,
    ) -> Iterator[Stage]:
        """The forward pass of tokens ``[B, T]`` at positions ``[B, T]`` (consecutive in each
        sequence), one named stage at a time: embed; per layer its input norm, the mixer's stages
        (linear: in_proj, conv, delta_rule, gated_norm, out_proj; full: q_gate, qk_norm_rope,
        attention, output_gate, o_proj -- these two with the residual added), the post-attention
        norm, router, experts, shared_expert, residual; then norm and logits. ``last_only``: the
        final norm and logits of the last position only (``[B, 1, V]``). ``snapshot``: the conv and
        delta states are copied into their stages (as they were after that stage)."""
        c, w = self.config, self.weights
        x = embed(w.embed, tokens, self.tp, not self.static, self.backends["index"])
        yield Stage("embed", {"hidden": x}, "hidden")
        fresh = positions[:, 0] == 0
        geo = (
            self.cache.geometry(positions, c.rotary_dim, c.rope_theta, x.dtype)
            if self.state.slot
            else None
        )
        eps, nb = c.rms_norm_eps, self.backends["add_rmsnorm"]
        # each residual add is fused with the norm after it (ops.add_rmsnorm): the mixer's with the
        # post-attention norm, the experts' with the next layer's input norm
        h, _ = add_norm(x, None, w.layers[0].input_norm, eps, nb)
        for i, kind in enumerate(c.layer_types):
            lw = w.layers[i]
            yield Stage(f"layer {i} input_norm", {"hidden": h}, "hidden")
            if kind == "linear_attention":
                out = yield from self.delta_net(i, h, fresh, snapshot)
                name = "out_proj"
            else:
                out = yield from self.attention(i, h, geo)
                name = "o_proj"
            h, x = add_norm(x, out, lw.post_attention_norm, eps, nb)
            yield Stage(f"layer {i} {name}", {name: out, "hidden": x}, name)
            yield Stage(f"layer {i} post_attention_norm", {"hidden": h}, "hidden")
            moe = yield from self.moe(i, h.reshape(-1, h.shape[-1]))
            if i + 1 < len(c.layer_types):
                h, x = add_norm(x, moe.view_as(x), w.layers[i + 1].input_norm, eps, nb)
            else:
                x = x + moe.view_as(x)
            yield Stage(f"layer {i} residual", {"hidden": x}, "hidden")
        if last_only:
            x = x[:, -1:]
        x = rms_norm(x, w.norm, c.rms_norm_eps)
        yield Stage("norm", {"hidden": x}, "hidden")
        yield Stage(
            "logits",
            {"logits": gather_logits(self.linear(x, w.lm_head).float(), self.tp)},
            "logits",
        )

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, last_only: bool = False
    ) -> torch.Tensor:
        """tokens ``[B, T]`` at positions ``[B, T]`` -> logits fp32 ``[B, T, V]`` (``[B, 1, V]``
        with ``last_only``)."""
        *_, last = self.stages(tokens, positions, last_only, snapshot=False)
        return last.tensors["logits"]

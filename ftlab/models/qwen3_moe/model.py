"""Qwen3-MoE (the ``qwen3_moe`` architecture of Qwen3-30B-A3B) as plain PyTorch over ftlab ops.

Per layer: RMSNorm -> attention (q/k/v projections, per-head RMSNorm on q and k, RoPE, GQA,
the KV cache written with ``ops.store`` -- or by ``ops.qk_norm_rope`` in the same pass under
the plan's ``kv_store_in_rope`` -- and read with ``ops.index``) -> residual -> RMSNorm
-> MoE (``ops.route_topk`` then the SwiGLU experts of ``ops.moe_experts``, which together are
``ops.fused_moe``; no shared expert) -> residual.
Embedding through ``ops.index``, final RMSNorm, lm_head (tied or not).

The KV cache is static and slot-indexed (:class:`ftlab.models.kv_cache.KVCache`), so a decode step
has fixed shapes and addresses (what a captured graph needs). The weights it reads are
:mod:`~ftlab.models.qwen3_moe.model_weights`.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import torch

from ftlab import ops
from ftlab.backends import DECODE_MAX_TOKENS
from ftlab.models.decode_plan import DecodePlan, Planned, plan_of
from ftlab.models.kv_cache import KVCache
from ftlab.models.layers import (
    Stage,
    add_norm,
    check_hybrid,
    embed,
    gather_logits,
    hybrid_end_step,
    linear,
    route,
    routed_experts,
)
from ftlab.models.pipeline_args import QWEN3_MOE_OPS
from ftlab.models.qwen3_moe.config import Qwen3MoeConfig
from ftlab.models.qwen3_moe.model_weights import LayerWeights, ModelWeights
from ftlab.quant import Q8_1, Q4_0Weight

__all__ = ["Qwen3Moe"]


class Qwen3Moe(Planned):
    """The model over ftlab ops. ``plan``: its :class:`~ftlab.models.decode_plan.DecodePlan` --
    the backend of each op it runs (``OPS``: "index", "store", "router_topk", "route_topk",
    "moe_experts", "q4_0_matmul", "quant_matmul", "qk_norm_rope", "decode_attention",
    "add_rmsnorm"), the path of quantized weights, the fusions and how a decode step attends;
    without one, a default plan of ``backends`` and ``q4_0_path``. ``static=True`` keeps every
    shape fixed and the host out of the forward pass (what graph capture of a decode step
    needs). ``hybrid``: one ``ftlab.hybrid.HybridDecodeExecutor`` a layer (or None), which then
    runs that layer's experts, some on the GPU's expert slots and the rest on the CPU;
    :meth:`end_step` moves their residency between steps. ``tp``: this rank's
    :class:`ftlab.models.tensor_parallel.TensorParallel` when ``weights`` is its shard
    (:func:`~ftlab.models.tensor_parallel.shard_qwen3_moe`): heads, experts and vocabulary split
    across the ranks, the partial results combined by collectives (that module's docstring)."""

    OPS = QWEN3_MOE_OPS  # the ops of its backends map that it runs

    def __init__(
        self,
        config: Qwen3MoeConfig,
        weights: ModelWeights,
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
        self.config = config
        self.tp = tp
        check_hybrid(hybrid, tp, config.num_hidden_layers)
        self.plan = plan_of(plan, backends, q4_0_path)
        self.hybrid = hybrid
        # the last forward pass's ids of each hybrid layer
        self.routed: dict[int, torch.Tensor] = {}
        # static: no host synchronization in a forward pass (attention reads all max_seq_len
        # slots under a mask, index checks off), so a decode step can be captured in a graph
        self.static = static
        self.weights = weights
        self.max_batch = max_batch
        self.max_seq_len = max_seq_len
        c = config
        world = tp.world if tp is not None else 1
        if tp is not None:
            tp.check_divides(
                num_attention_heads=c.num_attention_heads,
                num_experts=c.num_experts,
                vocab_size=c.vocab_size,
            )
        # this rank's heads (all of them without tp)
        self.heads, self.kv_heads = (
            c.num_attention_heads // world,
            max(1, c.num_key_value_heads // world),
        )
        self.cache = KVCache(
            c.num_hidden_layers,
            self.kv_heads * c.head_dim,
            max_batch,
            max_seq_len,
            static,
            weights.embed.device,
            weights.embed.dtype,
        )
        self.k_cache, self.v_cache = self.cache.k, self.cache.v
        # every layer's q/k/v one stacked Q4_0 weight (_norm_in_qkv)
        self._qkv_q4: bool | None = None

    def linear(
        self, x: torch.Tensor, w: torch.Tensor | Q4_0Weight, x_q8: Q8_1 | None = None
    ) -> torch.Tensor:
        b, p = self.backends, self.plan
        return linear(
            x, w, b["q4_0_matmul"], p.quant_path, b["quant_matmul"], x_q8, p.checks, self.op_plans
        )

    def slots(self, batch: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cache slots of (sequence, position) pairs: ``b * max_seq_len + p``."""
        return self.cache.slots(batch, positions)

    def geometry(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """What every layer's attention needs of ``positions [B, T]``, computed once a forward
        pass: rope tables, the cache slots written, the slots read and the causal mask."""
        return self.cache.geometry(positions, self.config.head_dim, self.config.rope_theta, dtype)

    def attention(
        self,
        i: int,
        x: torch.Tensor,
        positions: torch.Tensor,
        geo: dict | None = None,
        qkv: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x ``[B, T, H]`` at ``positions [B, T]`` -> ``[B, T, H]``; writes the layer's KV cache.
        ``geo``: :meth:`geometry` of the positions (computed here when not given). ``qkv``: the
        output ``[B * T, N]`` of the layer's one stacked q/k/v projection, when the caller made
        it (``ops.add_rmsnorm_q4_0_matmul``, under the plan's ``norm_in_qkv``)."""
        c, lw = self.config, self.weights.layers[i]
        geo = geo or self.geometry(positions, x.dtype)
        b, t, _ = x.shape
        hd, nh, nkvh = c.head_dim, self.heads, self.kv_heads
        q, k, v = self._project_qkv(i, x, qkv)
        v = v.reshape(b, t, nkvh, hd)
        # per-head RMSNorm of q and k, then RoPE: one pass (ops.qk_norm_rope), which may also
        # write k and v into the cache
        plan = self.plan
        fused = self._kv_store_in_rope()
        cache = dict(
            k_cache=self.cache.k[i],
            v_cache=self.cache.v[i],
            slots=geo["write"],
            v=v.reshape(b * t, -1),
        )
        q, k = ops.qk_norm_rope(
            q.reshape(b * t, nh, hd),
            k.reshape(b * t, nkvh, hd),
            lw.q_norm,
            lw.k_norm,
            geo["cos"],
            geo["sin"],
            c.rms_norm_eps,
            backend=self.backends["qk_norm_rope"],
            validate=plan.checks,
            **(cache if fused else {}),
        )
        q8 = self._o_proj_q8(lw, t)
        out = self.cache.attend(
            i, q.view(b, t, nh, hd), k.view(b, t, nkvh, hd), v, geo, plan, stored=fused, quantize=q8
        )
        out, out_q8 = out if q8 else (out, None)
        out = self.linear(out.reshape(b, t, -1), lw.o_proj, x_q8=out_q8)
        # row-parallel o_proj: partial sums
        return out if self.tp is None else self.tp.all_reduce(out)

    def _project_qkv(self, i: int, x: torch.Tensor, qkv: torch.Tensor | None) -> tuple:
        """Layer i's q, k and v ``[B, T, width]`` of ``x [B, T, H]``: the output of each of its
        stacked projections (:meth:`LayerWeights.qkv`) split into the projections it stacks;
        ``qkv``: the one stacked projection's output ``[B * T, N]``, when the caller made it."""
        b, t, _ = x.shape
        parts = self.weights.layers[i].qkv()
        if qkv is not None:
            return qkv.view(b, t, -1).split_with_sizes(parts[0][1], dim=-1)
        outs = (self.linear(x, w).split_with_sizes(widths, dim=-1) for w, widths in parts)
        return tuple(out for split in outs for out in split)

    def _kv_store_in_rope(self) -> bool:
        """Whether ``ops.qk_norm_rope`` also writes k and v into the cache (the plan's
        ``kv_store_in_rope``), which it does unless "store" names a backend of its own."""
        b = self.backends
        return self.plan.kv_store_in_rope and b["store"] in ("auto", b["qk_norm_rope"])

    def _o_proj_q8(self, lw: LayerWeights, tokens: int) -> bool:
        """Whether the attention of a step of ``tokens`` hands the o_proj matvec its input's Q8_1
        (the plan's ``attention_q8``, on hip's attention kernel): a decode step, a Q4_0 o_proj,
        the int8 path (the dequant path would not use it)."""
        q8 = self.plan.attention_q8 and tokens == 1 and isinstance(lw.o_proj, Q4_0Weight)
        return q8 and self.q4_0_path in ("auto", "int8")

    def _norm_in_qkv(self, rows: int) -> bool:
        """Whether each layer's input residual add and norm run inside its q/k/v matvec
        (``ops.add_rmsnorm_q4_0_matmul``, under the plan's ``norm_in_qkv``): decode rows, every
        layer's q/k/v one stacked Q4_0 weight on the int8 path ("auto" at decode), one backend name
        for add_rmsnorm and q4_0_matmul ("auto" for both included: both then resolve to the same
        backend's kernels)."""
        b = self.backends
        wanted = self.plan.now("norm_in_qkv", self.weights.embed.device)
        if not (
            wanted
            and rows <= DECODE_MAX_TOKENS
            and b["add_rmsnorm"] == b["q4_0_matmul"]
            and self.q4_0_path in ("auto", "int8")
        ):
            return False
        if self._qkv_q4 is None:  # the weights' layout: once
            self._qkv_q4 = all(
                len(lw.qkv()) == 1 and isinstance(lw.qkv()[0][0], Q4_0Weight)
                for lw in self.weights.layers
            )
        return self._qkv_q4

    def _norm_qkv(self, i: int, x: torch.Tensor, residual: torch.Tensor | None, eps: float):
        """Layer i's input add and norm with its q/k/v matvec: (h, s, qkv) of ``x [B, T, H]``."""
        lw, flat = self.weights.layers[i], x.shape[-1]
        h, s, qkv = ops.add_rmsnorm_q4_0_matmul(
            x.reshape(-1, flat),
            None if residual is None else residual.reshape(-1, flat),
            lw.input_norm,
            eps,
            lw.qkv()[0][0],
            path=self.q4_0_path,
            backend=self.backends["q4_0_matmul"],
        )
        return h.view(x.shape), s.view(x.shape), qkv

    def _norm_in_router(self) -> bool:
        """Whether the post-attention residual add and norm run inside the router's op
        (``ops.add_rmsnorm_router_topk``, under the plan's ``norm_in_router``): one backend name for
        add_rmsnorm and router_topk ("auto" for both included), route_topk that one or "auto"."""
        b = self.backends
        same = b["add_rmsnorm"] == b["router_topk"] and b["route_topk"] in (
            "auto",
            b["router_topk"],
        )
        return self.plan.norm_in_router and same

    def _input_norm(self, i: int, x: torch.Tensor, out: torch.Tensor | None, into_qkv: bool):
        """Layer i's input residual add and norm of the residual stream ``x [B, T, H]`` and the
        last layer's output ``out`` (None before the first layer): ``(h, s, qkv)``, ``h`` the
        norm of ``s``, the stream after the add, both ``[B, T, H]``; ``qkv`` the layer's stacked
        q/k/v projection ``[B * T, N]`` when the add and norm run inside its matvec
        (``into_qkv``: :meth:`_norm_in_qkv`), else None."""
        eps, lw = self.config.rms_norm_eps, self.weights.layers[i]
        if into_qkv:
            x, residual = (x, None) if out is None else (out, x)
            return self._norm_qkv(i, x, residual, eps)
        h, s = add_norm(x, out, lw.input_norm, eps, self.backends["add_rmsnorm"], self.plan.checks)
        return h, s, None

    def _post_attention_norm(self, i: int, x: torch.Tensor, attn: torch.Tensor, into_router: bool):
        """Layer i's post-attention residual add and norm of the stream ``x`` and the attention's
        output ``attn`` (both ``[B, T, H]``): ``(h, s, routes)``, ``h [B * T, H]`` the norm of
        ``s [B, T, H]``, the stream after the add; ``routes`` the router's (logits, top-k
        weights, top-k ids) when the add and norm run inside its op (``into_router``:
        :meth:`_norm_in_router`), else None."""
        c, lw, b = self.config, self.weights.layers[i], self.backends
        eps, checks = c.rms_norm_eps, self.plan.checks
        if not into_router:
            h, s = add_norm(x, attn, lw.post_attention_norm, eps, b["add_rmsnorm"], checks)
            return h.reshape(-1, s.shape[-1]), s, None
        flat = x.shape[-1]
        h, s, logits, weights, ids = ops.add_rmsnorm_router_topk(
            x.reshape(-1, flat),
            attn.reshape(-1, flat),
            lw.post_attention_norm,
            eps,
            lw.router,
            c.num_experts_per_tok,
            c.norm_topk_prob,
            backend=b["router_topk"],
            validate=checks,
        )
        return h, s.view(attn.shape), (logits, weights, ids)

    def router(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``[N, H]`` -> (router logits ``[N, E]``, top-k weights fp32, top-k ids int32)."""
        c, lw = self.config, self.weights.layers[i]
        return route(x, lw.router, c.num_experts_per_tok, c.norm_topk_prob, self.backends)

    def experts(
        self, i: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """Layer ``i``'s routed experts on ``x [N, H]``
        (:func:`~ftlab.models.layers.routed_experts`), summed over the ranks under tensor
        parallelism."""
        ex = self.hybrid[i] if self.hybrid else None
        if ex is not None:
            self.routed[i] = ids  # what end_step moves the residency by
        y = routed_experts(
            x,
            self.weights.layers[i],
            weights,
            ids,
            ex,
            self.tp,
            self.backends["moe_experts"],
            self.q4_0_path,
            self.plan.checks,
            self.op_plans,
        )
        return y if self.tp is None else self.tp.all_reduce(y)

    def recurrent_state(self) -> list[torch.Tensor]:
        """No recurrent buffers ([]): attention only, its state is the KV cache (as Qwen3Next's
        attention layers'; its linear-attention layers add conv and delta buffers)."""
        return []

    def end_step(self) -> None:
        """Between steps (never inside a captured graph): each hybrid layer's residency follows
        the routes of the last forward pass (one synchronization for all layers)."""
        hybrid_end_step(self.hybrid, self.routed)

    def stages(
        self, tokens: torch.Tensor, positions: torch.Tensor, last_only: bool = False
    ) -> Iterator[Stage]:
        """The forward pass of tokens ``[B, T]`` at positions ``[B, T]``, one named stage at a
        time: embed, layer i attention / router / experts, norm, logits. Each stage's
        ``main`` tensor is what comparisons between backends look at. ``last_only``: the final
        norm and the logits for the last position only (``[B, 1, V]``), as a prefill needs."""
        x = self.embed(tokens)
        yield Stage("embed", {"hidden": x}, "hidden")
        x, moe = yield from self.layer_stages(x, positions, self.geometry(positions, x.dtype))
        h, x = self.final_norm(x, moe)
        yield Stage(
            f"layer {self.config.num_hidden_layers - 1} experts",
            {"experts": moe, "hidden": x},
            "experts",
        )
        if last_only:
            h = h[:, -1:]
        yield Stage("norm", {"hidden": h}, "hidden")
        yield Stage("logits", {"logits": self.logits(h)}, "logits")

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The embedding rows of tokens ``[B, T]``: ``[B, T, H]``."""
        return embed(self.weights.embed, tokens, self.tp, not self.static, self.backends["index"])

    def layer_stages(
        self, x: torch.Tensor, positions: torch.Tensor, geo: dict
    ) -> Generator[Stage, None, tuple]:
        """Every layer over the embedded tokens ``x [B, T, H]`` (``geo``: :meth:`geometry` of
        ``positions``), stage by stage up to the last layer's experts, whose stage is the caller's:
        returns ``(x, moe)``, the last layer's residual stream and its experts' output, both
        ``[B, T, H]``, not yet added. A decode step's layers are what
        :class:`ftlab.models.decode_steps.DecodeLaunches` records."""
        # each residual add is fused with the norm after it (ops.add_rmsnorm): the attention's
        # with the post-attention norm (into_router: inside the router's launch too), the
        # experts' with the next layer's input norm (into_qkv: inside its q/k/v matvec too)
        into_router = self._norm_in_router()
        into_qkv = self._norm_in_qkv(positions.numel())
        h, _, qkv = self._input_norm(0, x, None, into_qkv)
        for i in range(self.config.num_hidden_layers):
            attn = self.attention(i, h, positions, geo, qkv=qkv)
            h, x, routes = self._post_attention_norm(i, x, attn, into_router)
            yield Stage(f"layer {i} attention", {"attention": attn, "hidden": x}, "attention")
            logits, weights, ids = routes or self.router(i, h)
            yield Stage(
                f"layer {i} router", {"logits": logits, "weights": weights, "ids": ids}, "weights"
            )
            moe = self.experts(i, h, weights, ids).view_as(x)
            if i + 1 == self.config.num_hidden_layers:
                return x, moe
            h, x, qkv = self._input_norm(i + 1, x, moe, into_qkv)
            yield Stage(f"layer {i} experts", {"experts": moe, "hidden": x}, "experts")

    def final_norm(self, x: torch.Tensor, moe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer's residual add with the final norm (``ops.add_rmsnorm``): ``(norm(x +
        moe), x + moe)`` of ``x, moe [B, T, H]``."""
        return add_norm(
            x,
            moe,
            self.weights.norm,
            self.config.rms_norm_eps,
            self.backends["add_rmsnorm"],
            self.plan.checks,
        )

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[B, T, V]`` of the final norm's output ``h [B, T, H]`` (the lm_head)."""
        return gather_logits(self.linear(h, self.weights.lm_head).float(), self.tp)

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, last_only: bool = False
    ) -> torch.Tensor:
        """tokens ``[B, T]`` at positions ``[B, T]`` -> logits fp32 ``[B, T, V]`` (``[B, 1, V]``
        with ``last_only``)."""
        *_, last = self.stages(tokens, positions, last_only)
        return last.tensors["logits"]

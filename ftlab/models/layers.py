"""What the Qwen models of :mod:`ftlab.models` share: the named stage of a forward pass, config
field checks, RMSNorm (and the residual add fused with it), linears over dense or Q4_0 weights,
RoPE tables, and attention over a static slot-indexed KV cache.

The KV cache is static and slot-indexed: sequence b's position p lives in slot
``b * max_seq_len + p`` of every attention layer's ``[slots, kv_heads * head_dim]`` buffer, so a
decode step has fixed shapes and addresses (what a captured graph needs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ftlab import backends as ftbackends
from ftlab import ops
from ftlab import platform as ftplatform
from ftlab.backends import calls
from ftlab.models.decode_plan import DecodePlan
from ftlab.quant import Q8_1, Q4_0Weight, QuantWeight
from ftlab.reference.norm import rms_norm  # noqa: F401 (the models' RMSNorm, re-exported)


@dataclass
class Stage:
    """One named step of a forward pass and the tensors it produced."""

    name: str
    tensors: dict[str, torch.Tensor]
    main: str  # the tensor that backend comparisons look at


BOOL_FIELDS = ("norm_topk_prob", "tie_word_embeddings")
FLOAT_FIELDS = ("rms_norm_eps", "rope_theta")
#: The largest count a config field may hold: fp32 holds every int up to it (RoPE takes positions
#: through fp32), no model comes near it, and what a loader builds per count before it reads a
#: shard (the layer pattern, the layers and experts the shards must hold) stays small.
MAX_COUNT = 2**24


def check_field(name: str, value: object) -> None:
    """ValueError naming config field ``name`` unless ``value`` is of its kind: a count (an
    int in [1, :data:`MAX_COUNT`], not a bool), a bool, or a finite float > 0 (``rope_theta``
    > 1: the RoPE frequencies ``theta^(-2i/d)`` must fall with i; a base <= 1 makes them grow,
    and a subnormal base makes them overflow to inf)."""
    if name in BOOL_FIELDS:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {value!r}")
    elif name in FLOAT_FIELDS:
        least = 1.0 if name == "rope_theta" else 0.0
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value <= least:
            raise ValueError(f"{name} must be a finite number > {least:g}, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    elif value > MAX_COUNT:
        raise ValueError(f"{name} must be an int <= 2^24 = {MAX_COUNT}, got {value!r}")


def concat_rows(ws: list[torch.Tensor | Q4_0Weight]) -> torch.Tensor | Q4_0Weight | None:
    """Weights ``[N_i, K]`` (or banks ``[E_i, N, K]``) stacked along the first dim when all are
    Q4_0 or all dense of one dtype; None for a mix (they then stay separate, each on its own
    path)."""
    if all(isinstance(w, Q4_0Weight) for w in ws):
        data = torch.cat([w.data for w in ws])
        return Q4_0Weight(data, (data.shape[0], *ws[0].shape[1:]))
    if all(isinstance(w, torch.Tensor) and w.dtype == ws[0].dtype for w in ws):
        return torch.cat(ws)
    return None


def add_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    backend: str = "auto",
    checks: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)`` for ``x [..., H]`` (``residual`` of x's shape, or
    None: ``(rms_norm(x), x)``) through ``ops.add_rmsnorm``: the residual add of a layer and the
    norm after it in one pass (each rounded once to x's dtype, as the add and :func:`rms_norm`
    round); ``checks``: the op's argument checks (a model's :class:`DecodePlan` ``checks``)."""
    shape = x.shape
    flat = None if residual is None else residual.reshape(-1, shape[-1])
    h, s = ops.add_rmsnorm(
        x.reshape(-1, shape[-1]), flat, weight, eps, backend=backend, validate=checks
    )
    return h.view(shape), s.view(shape)


def route(
    x: torch.Tensor,
    router: torch.Tensor,
    top_k: int,
    renormalize: bool,
    backends: Mapping[str, str],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The router of a MoE layer: x ``[N, H]`` -> (logits ``[N, E]``, top-k weights fp32, ids
    int32), by ``ops.router_topk`` (the linear layer and the top-k in one op: one launch in
    hip); when ``backends["route_topk"]`` names a backend that ``backends["router_topk"]`` does
    not (one backend for every op names both), ``F.linear`` then ``ops.route_topk`` through it."""
    if backends["route_topk"] not in ("auto", backends["router_topk"]):
        logits = F.linear(x, router)
        weights, ids = ops.route_topk(logits, top_k, renormalize, backend=backends["route_topk"])
        return logits, weights, ids
    return ops.router_topk(x, router, top_k, renormalize, backend=backends["router_topk"])


def linear(
    x: torch.Tensor,
    w: torch.Tensor | QuantWeight,
    backend: str = "auto",
    path: str = "auto",
    quant_backend: str | None = None,
    x_q8: Q8_1 | None = None,
    checks: bool = False,
    plans: dict | None = None,
) -> torch.Tensor:
    """``x [..., K] @ w[N, K].T``; Q4_0 weights through ``ops.q4_0_matmul`` (``backend``; ``x_q8``:
    x's Q8_1 when the caller has it, e.g. from ``ops.decode_attention(quantize=True)``), Q8_0 and
    K-quant weights through ``ops.quant_matmul`` (``quant_backend``, else ``backend``), both on
    ``path`` (the planner picks backend, path and kernel for "auto"); dense weights through
    ``F.linear``. ``checks``: the ops' argument checks. ``plans``: a model's plans, kept by
    weight and row count (:func:`op_plan`): each call planned once."""
    if isinstance(w, QuantWeight):
        flat = x.reshape(-1, x.shape[-1])
        q4 = isinstance(w, Q4_0Weight)
        op, name = ("q4_0_matmul", backend) if q4 else ("quant_matmul", quant_backend or backend)
        key = (op, id(w), flat.shape[0], flat.dtype, name, path)
        plan = op_plan(plans, key, op, lambda: calls.matmul(flat, w), name, path)
        if q4:
            out = ops.q4_0_matmul(
                flat, w, path=path, backend=name, x_q8=x_q8, validate=checks, plan=plan
            )
        else:
            out = ops.quant_matmul(flat, w, path=path, backend=name, validate=checks, plan=plan)
        return out.view(*x.shape[:-1], -1)
    return F.linear(x, w)


def experts(
    x: torch.Tensor,
    w_gate_up,
    w_down,
    weights: torch.Tensor,
    ids: torch.Tensor,
    backend: str,
    path: str,
    checks: bool = False,
    plans: dict | None = None,
) -> torch.Tensor:
    """``ops.moe_experts`` of ``x [N, H]`` over a layer's banks with the router's ``weights`` and
    ``ids [N, k]``, planned once a bank, row count and slot count where the model keeps
    ``plans``."""
    key = (
        "moe_experts",
        id(w_gate_up),
        id(w_down),
        x.shape[0],
        ids.shape[1],
        x.dtype,
        backend,
        path,
    )
    plan = op_plan(
        plans,
        key,
        "moe_experts",
        lambda: calls.experts(x, w_gate_up, w_down, ids.shape[1]),
        backend,
        path,
    )
    return ops.moe_experts(
        x, w_gate_up, w_down, weights, ids, path=path, backend=backend, validate=checks, plan=plan
    )


def op_plan(plans: dict | None, key: tuple, op: str, call_of, backend: str, path: str | None):
    """The plan of a model's call of ``op`` (``call_of()`` its :class:`~ftlab.backends.Call`),
    made once and kept in ``plans`` by ``key`` (what the plan depends on: the weights, the row
    count, the dtype, the backend and path asked for); None without ``plans`` (the op plans)."""
    if plans is None:
        return None
    got = plans.get(key)
    if got is None:
        got = plans[key] = ftbackends.plan(op, call_of(), backend=backend, path=path)
    return got


def hybrid_end_step(hybrid: list, routed: dict[int, torch.Tensor]) -> None:
    """Between steps (never inside a captured graph): move each hybrid layer's residency after
    the ids ``routed[i]`` its executor ``hybrid[i]`` saw in the last forward pass, with one
    synchronization for all layers; nothing to do when ``routed`` is empty."""
    if not routed:
        return
    layers = sorted(routed)
    rows = torch.stack([routed[i].reshape(-1) for i in layers]).cpu()
    for row, i in zip(rows, layers, strict=True):
        hybrid[i].end_step(row)


def rope_tables(
    positions: torch.Tensor, hd: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin ``[B, T, 1, hd]`` in ``dtype`` of the rotary angles at ``positions
    [B, T]`` (computed once a forward pass, shared by the layers); ``hd`` is the rotary dim (the
    head dim, or its rotated part under partial rotary): ``sin`` carries the sign of
    rotate-half, -sin on the first half."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, hd, 2, device=positions.device, dtype=torch.float32) / hd)
    )
    angles = positions.float()[..., None] * inv_freq  # [B, T, hd/2]
    emb = torch.cat([angles, angles], dim=-1)[:, :, None, :]  # [B, T, 1, hd]
    sign = torch.cat(
        [
            -torch.ones(hd // 2, device=positions.device),
            torch.ones(hd // 2, device=positions.device),
        ]
    )
    return emb.cos().to(dtype), (emb.sin() * sign).to(dtype)


def hip_attention(
    plan: DecodePlan, name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, geo: dict
) -> str:
    """The backend a decode step's attention takes: ``name`` when named; under "auto" "hip" on a
    GPU where ``plan.hip_attention`` holds now and the planner gives the call hip's one-launch
    kernel ("tiles"), else "auto" (SDPA). ``q [B, H, D]``, ``k, v [B, S, KVH, D]``. Once a
    forward pass (kept in ``geo``)."""
    if name != "auto" or q.device.type != "cuda":
        return name
    if "attention_backend" not in geo:
        chosen = "auto"
        if plan.now("hip_attention", q.device):
            try:
                got = ftbackends.plan("decode_attention", calls.attention(q, k, v))
                chosen = "hip" if (got.backend, got.variant) == ("hip", "tiles") else "auto"
            except ftbackends.BackendUnavailable:
                chosen = "auto"
        geo["attention_backend"] = chosen
    return geo["attention_backend"]


class KVCache:
    """The static KV cache of ``layers`` attention layers (module docstring): ``k[j]``, ``v[j]``
    ``[max_batch * max_seq_len, kv_width]``. ``static``: no host synchronization in a forward
    pass (attention reads all max_seq_len slots under a mask, index checks off)."""

    def __init__(
        self,
        layers: int,
        kv_width: int,
        max_batch: int,
        max_seq_len: int,
        static: bool,
        device: torch.device,
        dtype: torch.dtype,
    ):
        slots = max_batch * max_seq_len
        self.k = [torch.zeros(slots, kv_width, device=device, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros(slots, kv_width, device=device, dtype=dtype) for _ in range(layers)]
        self.max_batch, self.max_seq_len, self.static = max_batch, max_seq_len, static
        self._views: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._tables: dict[
            tuple, object
        ] = {}  # update_geometry's rope tables and aranges, made once

    def views(self, j: int, b: int, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``j``'s static cache as ``[b, max_seq_len, kv_heads, hd]`` views of the first ``b``
        sequences (made once per (layer, batch): a decode step asks for them every layer)."""
        key = (j, b, kv_heads)
        got = self._views.get(key)
        if got is None:
            shape = (self.max_batch, self.max_seq_len, kv_heads, -1)
            got = self._views[key] = (self.k[j].view(shape)[:b], self.v[j].view(shape)[:b])
        return got

    def slots(self, batch: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cache slots of (sequence, position) pairs: ``b * max_seq_len + p``."""
        return batch * self.max_seq_len + positions

    def geometry(
        self, positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype
    ) -> dict:
        """What every attention layer needs of ``positions [B, T]``, computed once a forward
        pass: rope tables (``rotary_dim`` wide), the cache slots written, the slots read, the
        causal mask (boolean; :meth:`attend` makes its additive form once when captured, in this
        dict: one forward pass's, not to be reused across captures), the positions, and for one
        token a sequence (decode) each sequence's live positions (``lengths``, int32 ``[B]``)."""
        b, t = positions.shape
        dev = positions.device
        cos, sin = rope_tables(positions, rotary_dim, theta, dtype)
        seq = torch.arange(b, device=dev)[:, None].expand(b, t)
        # read back every position up to the last one written, for every sequence
        span = self.max_seq_len if self.static else int(positions.max()) + 1
        read = self.slots(
            torch.arange(b, device=dev)[:, None], torch.arange(span, device=dev)[None, :]
        )
        visible = (
            torch.arange(span, device=dev)[None, None, :] <= positions[:, :, None]
        )  # [B, T, S]
        geo = {
            "cos": cos,
            "sin": sin,
            "write": self.slots(seq, positions).reshape(-1),
            "read": read.reshape(-1),
            "mask": visible[:, None],
            "span": span,
            "positions": positions,
            "rope": (rotary_dim, theta),
        }
        if t == 1:  # a decode step: each sequence's live positions, for ops.decode_attention
            geo["lengths"] = (positions[:, -1] + 1).to(torch.int32)
        return geo

    def update_geometry(self, geo: dict, positions: torch.Tensor, keys: list[str]) -> None:
        """Rewrite the entries ``keys`` of ``geo``, a static cache's :meth:`geometry` of a decode
        step (``[B, 1]`` positions), in place for new ``positions [B, 1]``: the values
        ``geometry(positions)`` gives, bit for bit, in a launch or two each (the rope rows gathered
        from tables of every position, made at the first call), for positions in ``[0,
        max_seq_len)``; one outside (which no caller checked on the device) gets the rope row of the
        nearest position instead of a failed gather. What
        :class:`ftlab.models.decode_steps.DecodeLaunches` runs before each step."""
        if not self.static or positions.shape != geo["positions"].shape or positions.shape[1] != 1:
            raise ValueError(
                "update_geometry takes a static cache's decode geometry and positions of its "
                "shape "
                f"{tuple(geo['positions'].shape)}, got {tuple(positions.shape)}"
            )
        flat = positions.reshape(-1)
        rows = None
        for key in keys:
            if key in ("cos", "sin"):
                table = self._rope_table(key, geo["rope"], geo[key].dtype, positions.device)
                if (
                    rows is None
                ):  # a position past the tables gathers the last row, never outside them
                    rows = flat.clamp(0, self.max_seq_len - 1)
                torch.index_select(table, 0, rows, out=geo[key].view(-1, *table.shape[1:]))
            elif key == "write":  # slot b * max_seq_len + p
                torch.add(
                    self._arange(flat.numel(), flat.device, self.max_seq_len), flat, out=geo[key]
                )
            elif key == "lengths":
                geo[key].copy_(flat + 1)
            elif key == "mask":
                torch.le(
                    self._arange(geo["span"], flat.device),
                    positions[:, :, None],
                    out=geo[key][:, 0],
                )
            elif key == "positions":
                geo[key].copy_(positions)
            elif key != "read":  # every slot of each sequence: the same for any positions
                raise ValueError(f"update_geometry cannot rewrite geometry entry {key!r}")

    def _rope_table(
        self, key: str, rope: tuple[int, float], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """``rope_tables``' cos or sin of every position ``[max_seq_len, 1, rotary_dim]``, made
        once."""
        if (rope, dtype) not in self._tables:
            every = torch.arange(self.max_seq_len, device=device)[None]
            cos, sin = rope_tables(every, rope[0], rope[1], dtype)
            self._tables[(rope, dtype)] = {"cos": cos[0], "sin": sin[0]}
        return self._tables[(rope, dtype)][key]

    def _arange(self, n: int, device: torch.device, step: int = 1) -> torch.Tensor:
        """``arange(n) * step`` (int64), made once."""
        if (n, step) not in self._tables:
            self._tables[(n, step)] = torch.arange(n, device=device) * step
        return self._tables[(n, step)]

    def attend(
        self,
        j: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        geo: dict,
        plan: DecodePlan,
        stored: bool = False,
        quantize: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, Q8_1 | None]:
        """Write ``k, v [B, T, kv_heads, hd]`` into layer ``j``'s cache at ``geo``'s slots (not when
        ``stored``: the caller's ``ops.qk_norm_rope`` wrote them), then
        attend ``q [B, T, heads, hd]`` (GQA, causal under ``geo``'s mask) over the cached
        positions; returns ``[B, T, heads, hd]``. Through torch's SDPA under the mask, except one
        token a sequence (decode) when ``plan.backends["decode_attention"]`` names a backend, or is
        "auto" on a GPU where :func:`hip_attention` picks hip's one-launch kernel: then
        ``ops.decode_attention`` over the live positions only. ``quantize``: returns ``(out,
        out_q8)``, ``out_q8`` the Q8_1 of ``out`` viewed ``[B * T, heads * hd]`` where the op path
        made it (``ops.decode_attention(quantize=True)``), else None (SDPA's path makes none)."""
        b, t, kvh, hd = k.shape
        backends = plan.backends
        if not stored:
            ops.store(
                self.k[j],
                self.v[j],
                geo["write"],
                k.reshape(b * t, -1),
                v.reshape(b * t, -1),
                check=False,
                backend=backends["store"],
            )
        span = geo["span"]
        if self.static:  # every slot of each sequence, in order: the cache itself, no copy
            keys, vals = self.views(j, b, kvh)
        else:
            keys = ops.index(self.k[j], geo["read"], check=False, backend=backends["index"])
            vals = ops.index(self.v[j], geo["read"], check=False, backend=backends["index"])
            keys, vals = keys.view(b, span, kvh, hd), vals.view(b, span, kvh, hd)
        if t == 1:  # a decode step through the op, when named (or plan.hip_attention)
            q1 = q.view(b, -1, hd)
            op = hip_attention(plan, backends["decode_attention"], q1, keys, vals, geo)
            if op != "auto":
                res = ops.decode_attention(
                    q1,
                    keys,
                    vals,
                    geo["lengths"],
                    backend=op,
                    quantize=quantize,
                    validate=plan.checks,
                )
                if quantize:
                    return res[0].view(b, 1, -1, hd), res[1]
                return res.view(b, 1, -1, hd)
        keys = keys.reshape(b, span, kvh, hd).transpose(1, 2)  # [B, kvh, S, hd]
        vals = vals.reshape(b, span, kvh, hd).transpose(1, 2)
        mask = geo["mask"]
        if ftplatform.capturing(q.device):
            # replayed from a graph: SDPA given the additive mask takes cuDNN's kernel, the fastest
            # on
            # the device (a decode layer 8.0 us against 11.2 us with the boolean mask, which SDPA
            # turns
            # into an additive one in every layer); launched eagerly, cuDNN's host cost a call
            # outweighs that, so the boolean mask stays (benchmarks/NOTES.md, "Router, mask"). The
            # two
            # paths are different kernels: in fp16 / bf16 a replayed step and an eager one differ in
            # the last bits of the attention (fp32 takes the math kernel both ways).
            if "bias" not in geo:  # once a captured forward pass (geo is one forward pass's)
                geo["bias"] = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
                    ~mask, float("-inf")
                )
            mask = geo["bias"]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, vals, attn_mask=mask, enable_gqa=True
        )
        out = out.transpose(1, 2)  # [B, T, heads, hd]
        return (out, None) if quantize else out


def embed(table: torch.Tensor, tokens: torch.Tensor, tp, check: bool, backend: str) -> torch.Tensor:
    """The embedding rows of ``tokens [B, T]`` -> ``[B, T, H]``; with ``tp`` (a
    :class:`~ftlab.models.tensor_parallel.TensorParallel`) ``table`` is this rank's vocabulary
    shard: the other shards' tokens read zeros (``ops.index``'s row-range mask) and the ranks'
    rows are summed."""
    if tp is None:
        x = ops.index(table, tokens.reshape(-1), check=check, backend=backend)
    else:
        n = table.shape[0]
        x = tp.all_reduce(
            ops.index(table, tokens.reshape(-1), mask=(tp.rank * n, n), backend=backend)
        )
    return x.view(*tokens.shape, -1)


def gather_logits(logits: torch.Tensor, tp) -> torch.Tensor:
    """Logits ``[..., V]``; with ``tp`` each rank's ``[..., V / tp]`` of its vocabulary shard,
    all-gathered in rank order."""
    return logits if tp is None else tp.all_gather_last(logits)

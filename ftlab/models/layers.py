"""What the Qwen models of :mod:`ftlab.models` share: the named stage of a forward pass, config
field checks, RMSNorm (and the residual add fused with it), linears over dense or Q4_0 weights,
the router and the experts of a MoE layer, RoPE tables, and the embedding and logits of a
vocabulary split across tensor-parallel ranks. The static KV cache and attention over it are
:mod:`ftlab.models.kv_cache`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ftlab import backends as ftbackends
from ftlab import ops
from ftlab.backends import DECODE_MAX_TOKENS, calls
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


def check_hybrid(hybrid: list | None, tp, layers: int) -> None:
    """A model's ``hybrid`` executors: one (or None) a layer of ``layers``, never with ``tp``."""
    if tp is not None and hybrid is not None:
        raise ValueError("hybrid experts and tp > 1 do not combine yet: pick one")
    if hybrid is not None and len(hybrid) != layers:
        raise ValueError(
            f"hybrid must hold one executor (or None) a layer: {layers}, got {len(hybrid)}"
        )


def routed_experts(
    x: torch.Tensor,
    bank,
    weights: torch.Tensor,
    ids: torch.Tensor,
    executor,
    tp,
    backend: str,
    path: str,
    checks: bool,
    plans: dict | None,
) -> torch.Tensor:
    """A layer's routed experts on ``x [N, H]`` with the router's top-k ``weights`` and ``ids
    [N, k]``: ``ops.moe_experts`` over ``bank`` (its ``w_gate_up`` and ``w_down``; under ``tp``
    this rank's share, so the other ranks' ids are shifted out of it), or the layer's hybrid
    ``executor`` -- a decode step (up to ``DECODE_MAX_TOKENS`` rows) through its handshake
    (graph-capturable), a longer pass (prefill) through its eager schedule, with no channel per
    prompt length. Returns ``[N, H]``, this rank's partial sum under ``tp``."""
    if executor is not None:
        if x.shape[0] <= DECODE_MAX_TOKENS:
            return executor(x, weights, ids)
        return executor.eager(x, weights, ids)
    if tp is not None:
        ids = ids - tp.rank * bank.w_gate_up.shape[0]
    return experts(x, bank.w_gate_up, bank.w_down, weights, ids, backend, path, checks, plans)


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

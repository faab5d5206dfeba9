"""Cross-backend case functions of the routed-MoE ops (docs/OPS.md section 3).

route_topk: kernels compute exp() with their own rounding, so probabilities may differ in
the last bits from the reference's; a backend's choice is accepted when it is a top-k of the
reference probabilities within ``ROUTE_SLACK`` and exact ties (equal logits) went to the
lower expert id. moe_align must match exactly.

router_topk: the logits within :func:`router_logits_tolerance` of the reference's, and the
routes held to the route_topk rule on the backend's own logits.

moe_experts: every backend within the bound derived in :mod:`ftlab.testing.experts_bounds` of the
reference of the same path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftlab import ops
from ftlab.backends import BackendUnavailable, resolve, resolve_path
from ftlab.quant import QTYPES, QuantWeight
from ftlab.testing.common import assert_within, backends_for, restride, ulp
from ftlab.testing.experts_bounds import experts_tolerance

ROUTE_SLACK = 1e-6  # relative, on probabilities


def check_route_case(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> None:
    device = torch.device(device)
    logits = logits.to(device)
    _, ref_ids = ops.route_topk(logits, top_k, renormalize, backend="reference")
    for name in backends_for("route_topk", device, logits.dtype, backends):
        w, ids = ops.route_topk(logits, top_k, renormalize, backend=name)
        _check_routes(name, logits, top_k, renormalize, w, ids, ref_ids)


def _check_routes(
    name: str,
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    w: torch.Tensor,
    ids: torch.Tensor,
    ref_ids: torch.Tensor,
) -> None:
    """(w, ids) a top-k of softmax(logits) by the route_topk rule: the reference's ids, or a
    near-tie resolved differently with exact ties still to the lower id; w its probabilities."""
    probs = torch.softmax(logits.float(), -1).cpu()
    w, ids = w.cpu(), ids.cpu().long()
    assert ids.dtype == torch.long and w.shape == (logits.shape[0], top_k)
    chosen = probs.gather(1, ids)
    taken = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, ids, True)
    assert bool((taken.sum(1) == top_k).all()), f"{name}: repeated expert ids"
    best_left = probs.masked_fill(taken, -1.0).amax(1)
    assert bool((chosen.amin(1) >= best_left * (1 - ROUTE_SLACK)).all()), (
        f"{name}: not a top-{top_k}"
    )
    exact = torch.equal(ids, ref_ids.cpu().long())
    if not exact:  # only near-ties may differ: check the tie rule on equal logits
        lg = logits.float().cpu()
        for t in range(ids.shape[0]):
            for c in ids[t].tolist():
                passed = [x for x in range(lg.shape[1]) if not taken[t, x] and lg[t, x] == lg[t, c]]
                assert all(x > c for x in passed), (
                    f"{name}: token {t} took {c} over the lower tied id"
                )
    want = chosen / chosen.sum(1, keepdim=True) if renormalize else chosen
    torch.testing.assert_close(w, want, rtol=1e-5, atol=1e-7)


def router_logits_tolerance(
    x: torch.Tensor, weight: torch.Tensor, reference: torch.Tensor
) -> torch.Tensor:
    """Bound on ``|logits - reference|`` (``[T, E]``, fp32, on the CPU) for router_topk: each side's
    fp32 dot of H products is within gamma_H * sum|x||w| of the exact dot (any summation
    order, gamma_H = H u / (1 - H u), u = 2^-24), and the two are rounded to x's dtype, which
    moves them apart by at most one ulp of that dtype more."""
    h = x.shape[1]
    u = 2.0**-24
    gamma = h * u / (1 - h * u)
    spread = 2 * gamma * (x.float().abs() @ weight.float().abs().T).cpu()
    return spread + ulp(reference.float().cpu().abs() + spread, x.dtype)


def check_router_case(
    x: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    renormalize: bool,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> None:
    """Every backend's router_topk: logits within :func:`router_logits_tolerance` of the
    reference's, in x's dtype; weights and ids the route_topk of those logits."""
    device = torch.device(device)
    x, weight = restride(x, device), weight.to(device)  # a row-strided x keeps its stride
    ref, _, _ = ops.router_topk(x, weight, top_k, renormalize, backend="reference")
    bound = router_logits_tolerance(x, weight, ref)
    for name in backends_for("router_topk", device, x.dtype, backends):
        logits, w, ids = ops.router_topk(x, weight, top_k, renormalize, backend=name)
        assert logits.dtype == x.dtype and logits.shape == ref.shape, (
            f"{name}: logits {logits.dtype} {logits.shape}"
        )
        assert ids.dtype == torch.int32 and w.dtype == torch.float32
        assert_within(name, "logits", logits, ref, bound)
        _, own_ids = ops.route_topk(logits, top_k, renormalize, backend="reference")
        _check_routes(name, logits, top_k, renormalize, w, ids, own_ids)


def check_norm_router_case(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_w: torch.Tensor,
    eps: float,
    w: torch.Tensor,
    k: int,
    renorm: bool,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> None:
    """Each backend's ``add_rmsnorm_router_topk`` against its own ``add_rmsnorm`` then
    ``router_topk``:
    all five outputs equal, bit for bit (the op's contract: hip's one launch repeats the two
    kernels' arithmetic); s is x itself without a residual."""
    dev = torch.device(device)
    x, norm_w, w = x.to(dev), norm_w.to(dev), w.to(dev)
    residual = None if residual is None else residual.to(dev)
    for name in backends_for("add_rmsnorm_router_topk", dev, x.dtype, backends):
        got = ops.add_rmsnorm_router_topk(x, residual, norm_w, eps, w, k, renorm, backend=name)
        y, s = ops.add_rmsnorm(x, residual, norm_w, eps, backend=name)
        want = (y, s, *ops.router_topk(y, w, k, renorm, backend=name))
        for part, a, b in zip(("y", "s", "logits", "weights", "ids"), got, want, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype, (name, part)
            assert torch.equal(a.cpu(), b.cpu()), (
                f"{name}: {part} differs from add_rmsnorm then router_topk"
            )
        assert (got[1] is x) == (residual is None), name


def check_align_case(
    ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> None:
    device = torch.device(device)
    ids = ids.to(device)
    expected = ops.moe_align(ids, num_experts, block_m, backend="reference")
    for name in backends_for("moe_align", device, None, backends):
        got = ops.moe_align(ids, num_experts, block_m, backend=name)
        for part, g, e in zip(
            ("sorted_token_ids", "expert_ids", "num_tokens_post_padded"), got, expected, strict=True
        ):
            assert torch.equal(g.cpu(), e.cpu()), f"{name}: moe_align {part} differs"


#: the largest |integer weight| a unit fp16 scale multiplies, by type (sub-block scale times q)
_INT_RANGE = {"Q8_0": 128, "Q4_K": 63 * 15, "Q5_K": 63 * 31, "Q6_K": 128 * 32}


def random_quant_bank(
    seed: int, qtype: str, experts: int, n: int, k: int, magnitude: float = 0.1
) -> QuantWeight:
    """An expert bank ``[E, N, K]`` of random ``qtype`` blocks (Q8_0 or a K-quant; every byte
    pattern is a block) whose fp16 scales are drawn so that weights stay within about
    ``magnitude`` (a quarter of them a tenth of that, some zero)."""
    import numpy as np

    from ftlab.testing.quant_matmul import random_quant_weight
    from ftlab.testing.quants import SCALE_OFFSETS

    w = random_quant_weight(seed, qtype, experts * n, k, specials=(0x0000,), zero_rows=0.0)
    rng = np.random.default_rng(seed + 1)
    blocks = w.data.numpy().reshape(-1, QTYPES[qtype].nbytes)
    top = magnitude / _INT_RANGE[qtype]
    for off in SCALE_OFFSETS[qtype]:
        scale = rng.uniform(0.05, 1.0, blocks.shape[0]) * np.where(
            rng.random(blocks.shape[0]) < 0.25, 0.1, 1.0
        )
        scale = np.where(rng.random(blocks.shape[0]) < 0.05, 0.0, scale * top).astype(np.float16)
        blocks[:, off : off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return QuantWeight(w.data.view(experts, n, -1), (experts, n, k), qtype)


def check_experts_case(
    x: torch.Tensor,
    w_gate_up,
    w_down,
    weights: torch.Tensor,
    ids: torch.Tensor,
    path: str = "auto",
    device: torch.device | str = "cpu",
    backends: Sequence[str] | None = None,
) -> None:
    """Every backend's moe_experts against the reference of the same path, within
    :func:`experts_tolerance`. Backends lacking the path for quantized banks, or the banks'
    types, are skipped when ``backends`` is None."""
    device = torch.device(device)
    q4 = isinstance(w_gate_up, QuantWeight)
    args = (
        x.to(device),
        w_gate_up.to(device),
        w_down.to(device),
        weights.to(device),
        ids.to(device),
    )
    names = backends_for("moe_experts", device, x.dtype, backends)
    for name in names:
        if name == "reference":
            continue
        chosen = "dequant"  # dense banks: the path is moot, the dequant bound applies
        if q4:
            try:
                chosen = resolve_path("moe_experts", name, device, x.dtype, x.shape[0], path)[1]
            except BackendUnavailable:
                if backends is None:  # all backends: those that implement this path
                    continue
                raise
        expected = ops.moe_experts(*args, path=chosen, backend="reference").float().cpu()
        bound = experts_tolerance(x, w_gate_up, w_down, weights, ids, chosen, expected)
        got = ops.moe_experts(*args, path=chosen, backend=name)
        assert got.shape == x.shape and got.dtype == x.dtype, f"{name}: {got.shape} {got.dtype}"
        assert_within(name, f"moe_experts ({chosen})", got, expected, bound)


def check_invalid_ids_read_nothing(
    backend: str, device: torch.device | str = "cpu", dims: tuple[int, int] = (64, 64)
) -> None:
    """Slots with id -1 or >= E contribute exactly nothing and read no expert memory: the
    experts only invalid slots name hold NaN (dense) or NaN scales (Q4_0), on every path
    (decode: 3 tokens; prefill: 12) of ``backend``, with hidden and intermediate sizes
    ``dims``."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    e, (h, inter) = 6, dims
    gu = torch.randn(e, 2 * inter, h, generator=gen) * 0.1
    dn = torch.randn(e, h, inter, generator=gen) * 0.1
    q_gu, q_dn = ops.quantize_q4_0(gu), ops.quantize_q4_0(dn)
    gu[2:4], dn[2:4] = float("nan"), float("nan")  # named only by invalid slots
    q_gu.data[2:4], q_dn.data[2:4] = 0xFF, 0xFF  # fp16 scale 0xFFFF: NaN
    paths = resolve("moe_experts", backend, device, torch.float32).caps.paths
    for t in (3, 12):
        ids = torch.tensor([[0, -1], [6, 1], [-1, -1]] * (t // 3), dtype=torch.int32)
        ids[ids == 6] = e + 3 if t > 3 else e  # >= E
        weights = torch.full((t, 2), 0.5)
        x = torch.randn(t, h, generator=gen)
        banks = [(gu, dn, "dequant")] + [(q_gu, q_dn, p) for p in paths]
        for w_gu, w_dn, path in banks:
            args = (
                x.to(device),
                w_gu.to(device),
                w_dn.to(device),
                weights.to(device),
                ids.to(device),
            )
            y = ops.moe_experts(*args, path=path, backend=backend).cpu()
            assert bool(torch.isfinite(y).all()), (
                f"{backend} {path} T={t}: an invalid slot read expert memory"
            )
            assert bool((y[2::3] == 0).all()), f"{backend} {path} T={t}: invalid slots contributed"

"""Cross-backend case functions of the routed-MoE ops (docs/OPS.md section 3).

route_topk: kernels compute exp() with their own rounding, so probabilities may differ in
the last bits from the reference's; a backend's choice is accepted when it is a top-k of the
reference probabilities within ``ROUTE_SLACK`` and exact ties (equal logits) went to the
lower expert id. moe_align must match exactly.

router_topk: the logits within :func:`router_logits_tolerance` of the reference's, and the
routes held to the route_topk rule on the backend's own logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftlab import ops
from ftlab.backends import BackendUnavailable, resolve, resolve_path
from ftlab.quant import QTYPES, Q4_0Weight, QuantWeight
from ftlab.testing.common import assert_within, backends_for, restride, ulp

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


EPS32 = 2.0**-23
#: relative rounding of a backend's dot operands on the dequant path, by x's dtype: Q4_0
#: weights (fp16 scale times a nibble) and the SwiGLU output h rounded to nearest in x's
#: dtype for the matrix units; fp32 operands as 3xTF32. (The Triton grouped GEMM keeps bf16
#: operands in fp32 under the CPU interpreter, whose bf16 casts truncate.)
OPERAND_ROUNDING = {torch.float32: 2.0**-22, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def _round_half_away(r: torch.Tensor) -> torch.Tensor:
    return torch.sign(r) * torch.floor(r.abs() + 0.5)


def _q8_1_range(h: torch.Tensor, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds ``[a_lo, a_hi]`` (f64, h's shape ``[R, I]``) on the dequantized Q8_1 values
    ``d8 * q`` of any fp32 vector within ``eta`` of ``h``: the block scale ``d8 = amax / 127``
    ranges with amax, and ``q = round(v / d8)`` may round either way near a half."""
    r_, i_ = h.shape
    hb, eb = h.view(r_, i_ // 32, 32), eta.view(r_, i_ // 32, 32)
    amax_lo = (hb.abs() - eb).clamp(min=0).amax(-1, keepdim=True)
    amax_hi = (hb.abs() + eb).amax(-1, keepdim=True)
    d_lo = amax_lo / 127 * (1 - 2 * EPS32)
    d_hi = amax_hi / 127 * (1 + 2 * EPS32)
    corners = torch.stack([(hb - eb) / d_lo, (hb - eb) / d_hi, (hb + eb) / d_lo, (hb + eb) / d_hi])
    corners = corners.nan_to_num(nan=0.0, posinf=127.0, neginf=-127.0)
    slack = corners.abs().amax(0) * 2 * EPS32 + 1e-12
    q_lo = _round_half_away(corners.amin(0) - slack).clamp(-127, 127)
    q_hi = _round_half_away(corners.amax(0) + slack).clamp(-127, 127)
    q_lo = torch.where(amax_hi == 0, 0.0, q_lo)
    q_hi = torch.where(amax_hi == 0, 0.0, q_hi)
    prods = torch.stack([d_lo * q_lo, d_hi * q_lo, d_lo * q_hi, d_hi * q_hi])
    return prods.amin(0).view(r_, i_), prods.amax(0).view(r_, i_)


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


def _block_terms(x8, w) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 path's sub-block terms of ``w [N, K]`` (any quantized type) and their parts."""
    from ftlab.reference import q4_0 as ref
    from ftlab.reference.quant_matmul import block_terms

    return ref.q4_0_block_terms(x8, w) if isinstance(w, Q4_0Weight) else block_terms(x8, w)


def _weight_parts(w: QuantWeight) -> tuple[torch.Tensor, int]:
    """(f64 ``[N, K]`` bound on the magnitude of each weight's parts in the int8 dot, the number
    of sub-block terms a row sums): Q4_0 ``|w| + 16 |d|`` (the nibble and the 8 * s8 shift), Q4_K
    / Q5_K ``|d sc q| + |dmin m|``, Q8_0 / Q6_K ``|w|``."""
    from ftlab.reference import q4_0 as ref
    from ftlab.reference.quant_matmul import unpack_ints

    n, k = w.shape
    if isinstance(w, Q4_0Weight):
        d4 = ref.unpack_q4_0(w)[0].double().abs()  # [N, K/32]
        wabs = ops.dequantize(w, torch.float32, backend="reference").double().abs()
        wabs = wabs + 16 * d4.repeat_interleave(32, dim=1)
        return wabs, k // 32
    f = unpack_ints(w)
    q = f["q"].double()  # [N, S, L]
    wabs = (f["d"].double() * f["sc"].double()).abs()[..., None] * q.abs()
    if "dmin" in f:
        wabs = wabs + (f["dmin"].double() * f["m"].double()).abs()[..., None]
    return wabs.reshape(n, k), q.shape[1]


def experts_tolerance(
    x: torch.Tensor,
    w_gate_up,
    w_down,
    weights: torch.Tensor,
    ids: torch.Tensor,
    path: str,
    expected: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-element bound ``[T, H]`` on |backend - reference| for moe_experts, derived in f64.

    Both compute, per valid (token, slot), g and u (dots over H), h = silu(g) * u, the down
    dot over I, then the weighted sum over the slots, each within a rounding bound of the
    exact value (Higham's ``(n + 4) * eps32 * sum |parts|``, for any order and fused or not):
    - dequant path (and dense banks): dot operands may be rounded to x's dtype
      (``OPERAND_ROUNDING``): Q4_0 weights, h, and fp32 operands of 3xTF32 dots; the h error
      is carried through SwiGLU to first order, plus the second-order terms (|silu'| <= 1.1,
      |silu''| <= 0.5) and 8 fp32 roundings of h itself.
    - int8 path: x's Q8_1 is the same in every backend; g and u are sums of S exact integer
      sub-block terms scaled in fp32 (S = K/32, K/16 for Q6_K): ``2 (S + 5) eps32 sum |parts|``
      (parts of ``q4_0_block_terms`` / ``quant_matmul.block_terms``); h is quantized to Q8_1
      again, and a q of h within its error may round the other way or see another block scale:
      ``_q8_1_range`` bounds the dequantized activations, and the down dot of any two choices
      differs by at most ``sum |W_d| (a_hi - a_lo)``; its own rounding is bounded with the
      magnitude of each weight's parts (``_weight_parts``).
    One ulp of the output dtype is added: the two fp32 results may round to neighbours (the
    ulp at ``|expected| + bound``, the reference's output, when given).
    """
    from ftlab.reference import q4_0 as ref

    q4 = isinstance(w_gate_up, QuantWeight)
    if path == "auto":  # the reference's choice
        path = resolve_path("moe_experts", "reference", torch.device("cpu"), None, x.shape[0])[1]
    int8 = q4 and path == "int8"
    cpu = torch.device("cpu")
    xf = x.float().to(cpu)
    gu, dn = w_gate_up.to(cpu), w_down.to(cpu)  # tensors and Q4_0Weight alike
    num_experts, inter, hidden = gu.shape[0], w_down.shape[-1], x.shape[1]
    u_op = OPERAND_ROUNDING[x.dtype]
    u_w = u_op if (q4 or x.dtype == torch.float32) and not int8 else 0.0
    u_h = u_op if x.dtype != torch.float32 and not int8 else 0.0
    ids_c, w_c = ids.to(cpu).long(), weights.to(cpu).double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    exact = torch.zeros(x.shape, dtype=torch.float64)

    def dense(w):
        if isinstance(w, QuantWeight):
            return ops.dequantize(w, torch.float32, backend="reference").double()
        return w.double()

    for e in ids_c.unique().tolist():
        if not 0 <= e < num_experts:
            continue
        tok, slot = (ids_c == e).nonzero(as_tuple=True)
        wg = dense(gu[e])  # [2I, H]
        wd = dense(dn[e])  # [H, I]
        if int8:
            xs = ref.quantize_q8_1(xf[tok])
            a = (xs.q.view(len(tok), -1, 32).double() * xs.d.double()[..., None]).view(
                len(tok), hidden
            )
            gu_exact = a @ wg.T
            _, parts = _block_terms(xs, gu[e])
            eta = (
                2 * (parts.shape[-1] + 5) * EPS32 * parts.double().sum(-1)
            )  # backend and reference
        else:
            xa = xf[tok].double()
            gu_exact = xa @ wg.T
            absdot = xa.abs() @ wg.abs().T
            eta = (u_w + 2 * (hidden + 4) * EPS32) * absdot
        g, u = gu_exact[:, :inter], gu_exact[:, inter:]
        eg, eu = eta[:, :inter], eta[:, inter:]
        sig = torch.sigmoid(g)
        silu = g * sig
        h = silu * u
        dsilu = (sig * (1 + g * (1 - sig))).abs()
        eh = dsilu * u.abs() * eg + silu.abs() * eu + 1.1 * eg * eu + 0.5 * u.abs() * eg**2
        eh = eh + 8 * EPS32 * h.abs()
        if int8:
            a_lo, a_hi = _q8_1_range(h, eh)
            amag = torch.maximum(a_lo.abs(), a_hi.abs())
            wabs, terms = _weight_parts(dn[e])
            y_exact = h @ wd.T
            ey = (a_hi - a_lo) @ wd.abs().T + 2 * (terms + 5) * EPS32 * (amag @ wabs.T)
        else:
            eh = eh + u_h * (h.abs() + eh)
            y_exact = h @ wd.T
            habs = h.abs() + eh
            ey = eh @ wd.abs().T + (u_w + 2 * (inter + 4) * EPS32) * (habs @ wd.abs().T)
        wj = w_c[tok, slot][:, None]
        out.index_add_(0, tok, wj.abs() * (ey + (ids.shape[1] + 4) * 2 * EPS32 * y_exact.abs()))
        exact.index_add_(0, tok, wj * y_exact)
    bound = out
    if x.dtype != torch.float32:
        centre = exact.abs() if expected is None else expected.double().abs().cpu()
        bound = bound + ulp((centre + bound).float(), x.dtype).double()  # the upper binade's ulp
    return bound.float()


def hybrid_tolerance(
    x: torch.Tensor,
    w_gate_up,
    w_down,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gpu_ids: torch.Tensor,
    path: str,
    expected: torch.Tensor,
) -> torch.Tensor:
    """:func:`experts_tolerance` for a hybrid step ``y = y_gpu + y_cpu`` in x's dtype: the GPU part
    (the routes whose ``gpu_ids`` slot is >= 0) and the CPU part (the other valid routes) are each
    rounded to x's dtype before their sum is, so a 16-bit x adds one ulp at each part's magnitude
    (its reference plus the bound). fp32 x adds nothing (the parts are fp32 already)."""
    bound = experts_tolerance(x, w_gate_up, w_down, weights, ids, path, expected)
    if x.dtype == torch.float32:
        return bound
    cpu = torch.device("cpu")
    ids_c, gpu_c = ids.to(cpu).long(), gpu_ids.to(cpu)
    on_gpu = torch.where(gpu_c >= 0, ids_c, -1)
    on_cpu = torch.where(gpu_c >= 0, -1, ids_c)
    xf, wf = x.to(cpu).float(), weights.to(cpu).float()
    for part in (on_gpu, on_cpu):
        y = ops.moe_experts(
            xf, w_gate_up.to(cpu), w_down.to(cpu), wf, part, path=path, backend="reference"
        )
        bound = bound + ulp(y.abs() + bound, x.dtype)
    return bound


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

"""Cross-backend case functions of the routed-MoE ops (OPS.md section 3).

route_topk: kernels compute exp() with their own rounding, so probabilities may differ in
the last bits from the reference's; a backend's choice is accepted when it is a top-k of the
reference probabilities within ``ROUTE_SLACK`` and exact ties (equal logits) went to the
lower expert id. moe_align must match exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftlab import ops
from ftlab.testing.common import backends_for

ROUTE_SLACK = 1e-6  # relative, on probabilities


def check_route_case(logits: torch.Tensor, top_k: int, renormalize: bool, device: torch.device | str = "cpu",
                     backends: Sequence[str] | None = None) -> None:  # fmt: skip
    device = torch.device(device)
    logits = logits.to(device)
    probs = torch.softmax(logits.float(), -1).cpu()
    _, ref_ids = ops.route_topk(logits, top_k, renormalize, backend="reference")
    for name in backends_for("route_topk", device, logits.dtype, backends):
        w, ids = ops.route_topk(logits, top_k, renormalize, backend=name)
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
                    passed = [
                        x for x in range(lg.shape[1]) if not taken[t, x] and lg[t, x] == lg[t, c]
                    ]
                    assert all(x > c for x in passed), (
                        f"{name}: token {t} took {c} over the lower tied id"
                    )
        want = chosen / chosen.sum(1, keepdim=True) if renormalize else chosen
        torch.testing.assert_close(w, want, rtol=1e-5, atol=1e-7)


def check_align_case(ids: torch.Tensor, num_experts: int, block_m: int, device: torch.device | str = "cpu",
                     backends: Sequence[str] | None = None) -> None:  # fmt: skip
    device = torch.device(device)
    ids = ids.to(device)
    expected = ops.moe_align(ids, num_experts, block_m, backend="reference")
    for name in backends_for("moe_align", device, None, backends):
        got = ops.moe_align(ids, num_experts, block_m, backend=name)
        for part, g, e in zip(("sorted_token_ids", "expert_ids", "num_tokens_post_padded"), got, expected,
                              strict=True):  # fmt: skip
            assert torch.equal(g.cpu(), e.cpu()), f"{name}: moe_align {part} differs"


def check_experts_case(x: torch.Tensor, w_gate_up, w_down, weights: torch.Tensor, ids: torch.Tensor,
                       path: str = "dequant", device: torch.device | str = "cpu",
                       backends: Sequence[str] | None = None) -> None:  # fmt: skip
    """Every backend's moe_experts against the reference: fp32 sums over H and I in another
    order (bound ``2e-5 * max |y|``), plus one ulp of the output dtype."""
    from ftlab.quant import Q4_0Weight

    device = torch.device(device)

    def move(w):
        return w.to(device) if isinstance(w, Q4_0Weight) else w.to(device)

    args = (x.to(device), move(w_gate_up), move(w_down), weights.to(device), ids.to(device))
    expected = ops.moe_experts(*args, path=path, backend="reference").float().cpu()
    bound = 2e-5 * expected.abs().max() + expected.abs() * {torch.float32: 0.0, torch.float16: 2.0**-10,
                                                            torch.bfloat16: 2.0**-7}[x.dtype]  # fmt: skip
    for name in backends_for("moe_experts", device, x.dtype, backends):
        if name == "reference":
            continue
        got = ops.moe_experts(*args, path=path, backend=name).float().cpu()
        err = (got - expected).abs()
        assert bool((err <= bound).all()), (
            f"{name}: moe_experts off by {float(err.max()):.3g} (bound {float(bound.max()):.3g})"
        )

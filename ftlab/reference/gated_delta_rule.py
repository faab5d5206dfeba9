"""The gated delta rule, the reference (docs/OPS.md section 9: Gated DeltaNet linear attention).

Per batch row and value head ``h`` (key head ``h // (Hv // Hk)``), with the fp32 state ``S
[Dk, Dv]`` and, for each token, ``q, k [Dk]`` (L2-normalised first when asked: ``x *
rsqrt(sum x^2 + 1e-6)``), ``v [Dv]``, the log decay ``g`` and the write strength ``beta``::

    S = S * exp(g)
    delta = (v - k^T S) * beta
    S = S + outer(k, delta)
    o = (scale * q)^T S

:func:`gated_delta_rule_recurrent` is that loop, token by token (transformers'
``torch_recurrent_gated_delta_rule``). :func:`gated_delta_rule` computes the same in chunks of
``chunk_size`` tokens: inside a chunk, with ``c`` the cumulative log decay from the chunk's
start, the deltas solve the unit lower-triangular system ``(I + L) X = beta * (V - K_dec S0)``
with ``L[i, j] = beta_i (k_i . k_j) exp(c_i - c_j)`` (j < i) and ``K_dec[i] = exp(c_i) k_i``;
then ``O = (Q exp(c)) S0 + (Q K^T * D) X`` with ``D[i, j] = exp(c_i - c_j)`` (j <= i), and
``S1 = exp(c_last) S0 + K^T (exp(c_last - c) X)``. All in fp32; outputs rounded once to v's
dtype. Both read tensors on the host only as PyTorch does: not for graph capture.

Hostile decays, in both forms (the chunked one as the recurrence computes them):

- ``g`` below :data:`G_FLOOR` (``-inf`` or ``-1e30`` included) is a full forget: the state
  before that token's update is multiplied by exactly 0, as fp32 ``exp(g)`` is 0 for every
  ``g < -103.97``. The chunked form takes such a ``g`` as ``G_FLOOR`` (``exp(G_FLOOR)`` is 0 in
  fp32 too), so that a chunk's cumulative sums stay finite and within ``64 |G_FLOOR|`` rather
  than losing the small decays after the forget to fp32 cancellation (or becoming ``-inf -
  -inf``).
- A NaN (or ``+inf``) ``g`` at token ``p`` of a (sequence, value head): ``o`` from ``p`` on and
  the final state are NaN there (not finite, for ``+inf``), and everything else -- ``o`` before
  ``p``, the other heads -- is exactly what it is without it. The chunked form keeps the NaN in
  ``c``, where it reaches the start state's factors ``exp(c)`` (into the outputs) and
  ``exp(c_last)`` (into the next state); the two operands that carry a row's decay into a sum
  over the chunk's rows, ``L`` and ``K_dec``, are selected to 0 on the rows whose ``c`` is not
  finite (a select, not a multiply: ``NaN * 0`` is NaN), so that a row's NaN never meets an
  earlier row's zero coefficient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6
#: The floor of a token's log decay in the chunked forms: fp32 ``exp`` is 0 below ``-150 ln 2 =
#: -103.97`` (half the smallest subnormal, 2^-150, rounds to 0), and ``e^-110 ~ 2^-158.7`` is 0
#: from any exp within a factor of 2^8 of exact, so a g below the floor and the floor itself
#: decay the state alike, to 0. Not lower: after a forget a chunk's cumulative sums sit near the
#: floor, where fp32's step (2^-17 up to 128, 2^-16 past it) rounds the decays that follow.
G_FLOOR = -110.0


def _prepare(q, k, v, g, beta, scale: float, l2norm_qk: bool):
    """fp32 ``[B, Hv, T, *]`` views of the inputs, keys and queries per value head, q scaled."""
    rep = v.shape[2] // k.shape[2]
    q, k = q.float(), k.float()
    if l2norm_qk:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2NORM_EPS)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS)
    q = q * scale
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    return (
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.float().transpose(1, 2),
        g.float().transpose(1, 2),
        beta.float().transpose(1, 2),
    )


def _initial(state: torch.Tensor | None, v: torch.Tensor, dk: int) -> torch.Tensor:
    b, _, hv, dv = v.shape
    if state is None:
        return torch.zeros(b, hv, dk, dv, dtype=torch.float32, device=v.device)
    return state.float().clone()


def gated_delta_rule_recurrent(q, k, v, g, beta, state, scale: float, l2norm_qk: bool):
    """The recurrence token by token; same arguments and results as :func:`gated_delta_rule`."""
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta, scale, l2norm_qk)
    s = _initial(state, v, k.shape[-1])
    out = torch.empty_like(vf)
    for t in range(vf.shape[2]):
        s = s * gf[:, :, t].exp()[..., None, None]
        kt = kf[:, :, t]
        delta = (vf[:, :, t] - (s * kt[..., None]).sum(-2)) * bf[:, :, t, None]
        s = s + kt[..., None] * delta[..., None, :]
        out[:, :, t] = (s * qf[:, :, t, :, None]).sum(-2)
    return out.transpose(1, 2).to(v.dtype).contiguous(), s


def gated_delta_rule(
    q, k, v, g, beta, state, scale: float, l2norm_qk: bool, chunk_size: int, precision: str = "fp32"
):
    """Backend entry of :func:`ftlab.ops.gated_delta_rule`: ``(o [B, T, Hv, Dv] in v's dtype,
    final_state [B, Hv, Dk, Dv] fp32)``, the chunked form in fp32 whatever ``precision`` allows."""
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta, scale, l2norm_qk)
    b, hv, t, dv = vf.shape
    dk = kf.shape[-1]
    c = chunk_size
    pad = (c - t % c) % c
    qf, kf, vf = (F.pad(x, (0, 0, 0, pad)) for x in (qf, kf, vf))
    gf, bf = F.pad(gf, (0, pad)), F.pad(bf, (0, pad))
    n = (t + pad) // c
    qf, kf, vf = (x.reshape(b, hv, n, c, x.shape[-1]) for x in (qf, kf, vf))
    gf, bf = gf.reshape(b, hv, n, c), bf.reshape(b, hv, n, c)
    cum = torch.where(gf < G_FLOOR, G_FLOOR, gf).cumsum(-1)  # a NaN stays, from its token on
    ok = cum.isfinite()[..., None]  # the rows whose decays may enter a sum over the chunk's rows
    causal = torch.ones(c, c, dtype=torch.bool, device=v.device).tril()
    gap = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    lower = torch.where(ok, (kf @ kf.transpose(-1, -2)) * gap * bf[..., None], 0.0).tril(-1)
    system = lower + torch.eye(c, dtype=torch.float32, device=v.device)
    attn = (qf @ kf.transpose(-1, -2)) * gap
    k_dec = torch.where(ok, kf * cum.exp()[..., None], 0.0)
    q_dec = qf * cum.exp()[..., None]
    k_end = kf * (cum[..., -1:] - cum).exp()[..., None]
    s = _initial(state, v, dk)
    out = torch.empty_like(vf)
    for i in range(n):
        rhs = (vf[:, :, i] - k_dec[:, :, i] @ s) * bf[:, :, i, :, None]
        x = torch.linalg.solve_triangular(system[:, :, i], rhs, upper=False, unitriangular=True)
        out[:, :, i] = q_dec[:, :, i] @ s + attn[:, :, i] @ x
        s = s * cum[:, :, i, -1].exp()[..., None, None] + k_end[:, :, i].transpose(-1, -2) @ x
    o = out.reshape(b, hv, n * c, dv)[:, :, :t].transpose(1, 2).to(v.dtype).contiguous()
    return o, s


def step_gates(
    a: torch.Tensor, b: torch.Tensor, a_neg: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet's gates from its raw projections ``a, b [..., Hv]``: ``(g, beta)`` fp32,
    ``g = a_neg * softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` (``a_neg = -exp(A_log)``,
    ``dt_bias`` fp32 ``[Hv]``), as transformers' Qwen3-Next / Qwen3.5 layers compute them."""
    return a_neg * F.softplus(a.float() + dt_bias), torch.sigmoid(b.float())


def gated_delta_step(
    q, k, v, g, beta, state, scale: float, l2norm_qk: bool, gates=None, reset=None
):
    """Backend entry of :func:`ftlab.ops.gated_delta_step`: one token per row, ``state``
    updated in place; returns ``o [B, Hv, Dv]`` in v's dtype. ``gates``: g and beta are the
    raw projections (:func:`step_gates`); ``reset`` rows start from a zero state."""
    if gates is not None:
        g, beta = step_gates(g, beta, *gates)
    start = (
        state
        if reset is None
        else torch.where(reset[:, None, None, None], torch.zeros((), device=state.device), state)
    )
    o, s = gated_delta_rule_recurrent(
        q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], start, scale, l2norm_qk
    )
    state.copy_(s)
    return o[:, 0]

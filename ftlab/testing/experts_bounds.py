"""The error bound of moe_experts (docs/OPS.md section 3), derived in f64 from the op's
arithmetic: :func:`experts_tolerance`, a backend against the reference of the same path
(dequant or int8), and :func:`hybrid_tolerance`, a hybrid step whose GPU and CPU parts are
rounded apart. The case functions that hold every backend to them: :mod:`ftlab.testing.moe`."""

from __future__ import annotations

import torch

from ftlab import ops
from ftlab.backends import resolve_path
from ftlab.quant import Q4_0Weight, QuantWeight
from ftlab.testing.common import ulp

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
            # backend and reference
            eta = 2 * (parts.shape[-1] + 5) * EPS32 * parts.double().sum(-1)
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

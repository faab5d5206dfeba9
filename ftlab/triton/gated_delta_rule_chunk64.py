"""The chunked prefill of the gated delta rule in Triton for chunks of 64 tokens, the models'
chunk size (reference: ftlab/reference/gated_delta_rule.py; other chunk sizes:
:mod:`ftlab.triton.gated_delta_rule_chunk`): the launches of its four kernels, their
configurations and compile specs. With a chunk's keys ``K`` (L2-normalised when asked),
cumulative log decays ``c`` from its start and ``L = beta_i (k_i . k_j) exp(c_i - c_j)`` (j < i):

- :mod:`~ftlab.triton.gated_delta_rule_chunk64_wy` (chunks in parallel): ``inverse_kernel``,
  ``A = (I + L)^-1`` (fp32 ``[64, 64]`` a chunk), ``c`` and the keys' norm factors; then
  ``wy_kernel``, ``W = A (beta exp(c) K)`` and ``U = A (beta V)``;
- :mod:`~ftlab.triton.gated_delta_rule_chunk64_scan`: ``scan_kernel`` (chunk after chunk, the
  state slice in registers), a chunk's deltas ``X = U - W S`` over U and every chunk's starting
  state in ``h``; then ``out_kernel`` (chunks in parallel), ``O = diag(exp(c)) Q S +
  (Q K^T * D) X`` with ``D[i, j] = exp(c_i - c_j)`` (j <= i);
- :mod:`~ftlab.triton.gated_delta_rule_chunk64_tiles`: the tiles and dots they share.

The products of two input rows (``K K^T``, ``Q K^T``) take the inputs' own dtype into the dot
(bf16 / fp16 products are exact in the fp32 accumulator); every dot with an fp32 operand is
IEEE, or tf32x3 on NVIDIA (three tf32 products, fp32 accuracy), so the bound of
:func:`ftlab.testing.gated_delta_tolerance` (fp32 dots) holds for these kernels as for the
reference. With ``precision="bf16"`` (bf16 inputs) the WY, scan and output kernels' fp32
operands are each rounded to bf16 once and every such dot is one bf16 product with fp32 sums, as
fla's kernels compute (the inverse and the state in registers stay fp32; W, U / X and h are kept
in bf16), within ``gated_delta_tolerance(..., operands="bf16")``. Hostile decays as in
:mod:`ftlab.triton.gated_delta_rule_chunk`: ``floor_decay`` at load, ``L`` and the keys' factor
selected by ``finite`` (:mod:`ftlab.triton.gated_delta_rule_chunk_inputs`).
"""

from __future__ import annotations

import torch
import triton

from ftlab.backends import tuning
from ftlab.platform import current, platform_from_arch
from ftlab.triton.gated_delta_rule_chunk import precision as dot_precision
from ftlab.triton.gated_delta_rule_chunk64_scan import out_kernel, scan_kernel
from ftlab.triton.gated_delta_rule_chunk64_wy import inverse_kernel, wy_kernel
from ftlab.triton.q4_0_common import interpreted

C = 64
CONFIGS = tuning.TRITON_DELTA_RULE_CHUNK64


def _config(dev: torch.device) -> dict[str, int]:
    return CONFIGS.get(current(dev).arch if dev.type != "cpu" else "default", CONFIGS["default"])


def gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    state,
    scale: float,
    l2norm_qk: bool,
    config: dict | None = None,
    precision: str = "fp32",
):
    """Chunks of 64: backend entry below :func:`ftlab.triton.gated_delta_rule.gated_delta_rule`
    (contiguous q, k, v ``[B, T, H, D]``; g and beta fp32 ``[B, T, Hv]``; state fp32 ``[B, Hv, Dk,
    Dv]`` or None). Returns ``(o [B, T, Hv, Dv] in v's dtype, final state fp32)``; ``config``
    overrides entries of :data:`CONFIGS` (benchmark sweeps). ``precision="bf16"`` with bf16
    inputs: the WY, scan and output kernels round each fp32 operand to bf16 once and take one bf16
    product (fp32 sums; the inverse and the state in registers stay at fp32 accuracy), and W, U /
    X and the chunks' start states are kept in bf16 -- the WY form of
    ``ftlab.testing.gated_delta_bounds.bf16_operand_terms``; otherwise (and for other dtypes) fp32
    dots and fp32 scratch."""
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2:]
    nt = triton.cdiv(t, C)
    bhv = b * hv
    dev = q.device
    cfg = {**_config(dev), **(config or {})}
    prec = dot_precision(dev)
    native = not interpreted()
    bf16 = precision == "bf16" and q.dtype == torch.bfloat16
    bk = max(16, triton.next_power_of_2(dk))
    heads = dict(HK=hk, HV=hv, DK=dk)
    a = torch.empty(bhv, nt * C, C, dtype=torch.float32, device=dev)
    keep = torch.bfloat16 if bf16 else torch.float32  # W, U / X and the chunks' start states
    w = torch.empty(bhv, nt * C, dk, dtype=keep, device=dev)
    u = torch.empty(bhv, nt * C, dv, dtype=keep, device=dev)
    hs = torch.empty(bhv, nt, dk, dv, dtype=keep, device=dev)
    st = (
        state.reshape(bhv, dk, dv).clone()
        if state is not None
        else torch.zeros(bhv, dk, dv, device=dev)
    )
    rk = torch.empty(bhv, nt * C, dtype=torch.float32, device=dev)
    cs = torch.empty(bhv, nt * C, dtype=torch.float32, device=dev)
    inverse_kernel[(nt, bhv)](
        k,
        g,
        beta,
        a,
        cs,
        rk,
        t,
        nt,
        **heads,
        BS=min(cfg["INV_BS"], bk),
        L2NORM=l2norm_qk,
        PRECISION=prec,
        NATIVE=native,
        num_warps=cfg["INV_WARPS"],
    )
    wbs = min(cfg["WY_BS"], max(16, triton.next_power_of_2(max(dk, dv))))
    wy_kernel[(nt, bhv)](
        k,
        v,
        beta,
        a,
        cs,
        rk,
        w,
        u,
        t,
        nt,
        **heads,
        DV=dv,
        BS=wbs,
        PRECISION=prec,
        BF16=bf16,
        NATIVE=native,
        num_warps=cfg["WY_WARPS"],
    )
    nq = max(1, min(cfg["SCAN_NQ"], bk // 16))
    bq = bk // nq
    sbv = min(cfg["SCAN_BV"], max(16, triton.next_power_of_2(dv)))
    scan_kernel[(triton.cdiv(dv, sbv), bhv)](
        k,
        cs,
        rk,
        w,
        u,
        hs,
        st,
        t,
        nt,
        **heads,
        DV=dv,
        BQ=bq,
        NQ=nq,
        BV=sbv,
        PRECISION=prec,
        STAGES=cfg["SCAN_STAGES"],
        BF16=bf16,
        NATIVE=native,
        num_warps=cfg["SCAN_WARPS"],
    )
    obs = min(cfg["OUT_BS"], bk)
    obv = min(
        cfg["OUT_BV_F32" if q.dtype == torch.float32 else "OUT_BV"],
        max(16, triton.next_power_of_2(dv)),
    )
    o = torch.empty(b, t, hv, dv, dtype=v.dtype, device=dev)
    out_kernel[(triton.cdiv(dv, obv), nt, bhv)](
        q,
        k,
        cs,
        rk,
        u,
        hs,
        o,
        float(scale),
        t,
        nt,
        **heads,
        DV=dv,
        BS=obs,
        BV=obv,
        L2NORM=l2norm_qk,
        PRECISION=prec,
        NATIVE=native,
        BF16=bf16,
        num_warps=cfg["OUT_WARPS"],
    )
    return o, st.reshape(b, hv, dk, dv)


def compile_specs(target: str) -> list:
    """The configurations compile-checked for ``target`` (see ftlab.compile_check): Qwen3-Next's
    16 key / 32 value heads of 128 in chunks of 64, in each float dtype, and for bf16 also with
    bf16 operands (``precision="bf16"``: the WY, scan and output kernels)."""
    from ftlab.triton.compile_spec import spec

    if platform_from_arch(target).rdna:  # the general kernels serve RDNA (the planner's rules)
        return []
    cfg = CONFIGS.get(target, CONFIGS["default"])
    prec = "tf32x3" if platform_from_arch(target).tf32 else "ieee"
    heads = {"HK": 16, "HV": 32, "DK": 128}
    f32 = "*fp32"
    specs = []
    for dt, bf16 in (("fp32", False), ("fp16", False), ("bf16", False), ("bf16", True)):
        x = f"*{dt}"
        ops16 = {"BF16": bf16, "NATIVE": True}
        keep = "*bf16" if bf16 else f32  # the scratch W, U / X and start states
        kernels = [
            (
                inverse_kernel,
                {
                    "k_ptr": x,
                    "g_ptr": f32,
                    "beta_ptr": f32,
                    "a_ptr": f32,
                    "c_ptr": f32,
                    "rk_ptr": f32,
                },
                {"BS": cfg["INV_BS"], "L2NORM": True, "NATIVE": True},
                cfg["INV_WARPS"],
            ),
            (
                wy_kernel,
                {
                    "k_ptr": x,
                    "v_ptr": x,
                    "beta_ptr": f32,
                    "a_ptr": f32,
                    "c_ptr": f32,
                    "rk_ptr": f32,
                    "w_ptr": keep,
                    "u_ptr": keep,
                },
                {"DV": 128, "BS": cfg["WY_BS"], **ops16},
                cfg["WY_WARPS"],
            ),
            (
                scan_kernel,
                {
                    "k_ptr": x,
                    "c_ptr": f32,
                    "rk_ptr": f32,
                    "w_ptr": keep,
                    "u_ptr": keep,
                    "h_ptr": keep,
                    "st_ptr": f32,
                },
                {
                    "DV": 128,
                    "BQ": 128 // cfg["SCAN_NQ"],
                    "NQ": cfg["SCAN_NQ"],
                    "BV": cfg["SCAN_BV"],
                    "STAGES": cfg["SCAN_STAGES"],
                    **ops16,
                },
                cfg["SCAN_WARPS"],
            ),
            (
                out_kernel,
                {
                    "q_ptr": x,
                    "k_ptr": x,
                    "c_ptr": f32,
                    "rk_ptr": f32,
                    "u_ptr": keep,
                    "h_ptr": keep,
                    "o_ptr": x,
                    "scale": "fp32",
                },
                {
                    "DV": 128,
                    "BS": cfg["OUT_BS"],
                    "BV": cfg["OUT_BV_F32" if dt == "fp32" else "OUT_BV"],
                    "L2NORM": True,
                    **ops16,
                },
                cfg["OUT_WARPS"],
            ),
        ]
        if bf16:  # the inverse does not change with the operands' precision
            kernels = kernels[1:]
        for kernel, types, extra, warps in kernels:
            name = kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__
            what = f"{dt}, bf16 operands" if bf16 else dt
            specs.append(
                spec(
                    kernel,
                    f"{name}[{what}, chunk 64, 16/32 heads of 128]",
                    types=types,
                    constexprs={**heads, "PRECISION": prec, **extra},
                    num_warps=warps,
                )
            )
    return specs

"""The gated delta rule in Triton (reference: ftlab/reference/gated_delta_rule.py).

Decode (:func:`gated_delta_step`): one program per (sequence, value head, block of BLOCK_V
state columns) holds its ``[Dk, BLOCK_V]`` slice of the fp32 state in registers, L2-normalises
its query and key head (the key head ``h // (Hv // Hk)``), decays, reads, writes and reads out
the state, and stores it back in place: one pass over the state, no host work, capturable.

Prefill (:func:`gated_delta_rule`): in chunks of 64 (the models' size) with key heads up to 128,
except on RDNA, the kernels of :mod:`ftlab.triton.gated_delta_rule_chunk64` (the state kept in
registers across chunks, each chunk's triangle inverted once); other chunk sizes the general kernels
of :mod:`ftlab.triton.gated_delta_rule_chunk`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ftlab import backends
from ftlab.backends import calls
from ftlab.triton import gated_delta_rule_chunk, gated_delta_rule_chunk64


@triton.jit
def _unit(x, L2NORM: tl.constexpr):
    """``x [D]`` (fp32) times rsqrt(sum x^2 + 1e-6) when L2NORM."""
    if L2NORM:
        x = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) + 1e-6))
    return x


@triton.jit
def gated_delta_step_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    s_ptr,
    o_ptr,
    scale,
    a_neg_ptr,
    dt_bias_ptr,
    reset_ptr,
    HK: tl.constexpr,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    L2NORM: tl.constexpr,
    GATES: tl.constexpr,
    RESET: tl.constexpr,
):
    bh = tl.program_id(0)
    b = bh // HV
    h = bh % HV
    kh = h // (HV // HK)
    dk = tl.arange(0, BLOCK_K)
    dv = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mk = dk < DK
    mv = dv < DV
    q = tl.load(q_ptr + (b * HK + kh) * DK + dk, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + (b * HK + kh) * DK + dk, mask=mk, other=0.0).to(tl.float32)
    q = _unit(q, L2NORM) * scale
    k = _unit(k, L2NORM)
    v = tl.load(v_ptr + bh * DV + dv, mask=mv, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + bh).to(tl.float32)
    beta = tl.load(beta_ptr + bh).to(tl.float32)
    # g and beta are the raw projections a and b: the layer's gates, as torch computes them
    if GATES:
        x = g + tl.load(dt_bias_ptr + h)
        g = tl.load(a_neg_ptr + h) * tl.where(
            x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0)))
        )
        beta = 1.0 / (1.0 + tl.exp(-beta))
    decay = tl.exp(g)
    offs = bh.to(tl.int64) * DK * DV + dk[:, None] * DV + dv[None, :]
    smask = mk[:, None] & mv[None, :]
    if RESET:  # a fresh row's state is zeros, never read (its flag loaded along dk: a tensor mask)
        smask_in = smask & (tl.load(reset_ptr + b + 0 * dk) == 0)[:, None]
    else:
        smask_in = smask
    s = tl.load(s_ptr + offs, mask=smask_in, other=0.0) * decay
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
    s = s + k[:, None] * delta[None, :]
    tl.store(s_ptr + offs, s, mask=smask)
    o = tl.sum(s * q[:, None], axis=0)
    tl.store(o_ptr + bh * DV + dv, o.to(o_ptr.dtype.element_ty), mask=mv)


def gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    state,
    scale: float,
    l2norm_qk: bool,
    chunk_size: int,
    variant: str | None = None,
    precision: str = "fp32",
    call=None,
):
    """Backend entry of :func:`ftlab.ops.gated_delta_rule`. ``variant``: ``"chunk64"`` (the
    chunk-64 kernels, the state kept in registers across chunks; bf16 operands for bf16 inputs
    when ``precision`` is "bf16") or ``"chunk"`` (the general chunked kernels, fp32 accuracy
    whatever ``precision`` allows); None: the planner's default; one that cannot serve raises
    ``BackendUnavailable``."""
    call = call or calls.delta_rule(q, v, chunk_size, precision)  # a plan passes its own
    variant = backends.variant_for("gated_delta_rule", "triton", call, variant)
    if variant == "chunk64":
        return gated_delta_rule_chunk64.gated_delta_rule(
            q, k, v, g, beta, state, scale, l2norm_qk, precision=precision
        )
    return gated_delta_rule_chunk.gated_delta_rule(
        q, k, v, g, beta, state, scale, l2norm_qk, chunk_size
    )


def gated_delta_step(
    q, k, v, g, beta, state, scale: float, l2norm_qk: bool, gates=None, reset=None
):
    """Backend entry of :func:`ftlab.ops.gated_delta_step` (``state`` contiguous fp32, updated in
    place; ``gates``: g and beta are the raw projections; ``reset``: rows from a zero state)."""
    b, hk, dk = q.shape
    hv, dv = v.shape[1:]
    o = torch.empty(b, hv, dv, dtype=v.dtype, device=v.device)
    bk = max(16, triton.next_power_of_2(dk))
    bv = min(max(16, triton.next_power_of_2(dv)), max(16, 4096 // bk))
    a_neg, dt_bias = gates if gates is not None else (g, g)  # placeholders when unused
    flags = reset.contiguous().view(torch.uint8) if reset is not None else g
    gated_delta_step_kernel[(b * hv, triton.cdiv(dv, bv))](
        q,
        k,
        v,
        g,
        beta,
        state,
        o,
        float(scale),
        a_neg,
        dt_bias,
        flags,
        HK=hk,
        HV=hv,
        DK=dk,
        DV=dv,
        BLOCK_K=bk,
        BLOCK_V=bv,
        L2NORM=l2norm_qk,
        GATES=gates is not None,
        RESET=reset is not None,
        num_warps=4,
    )
    return o


def compile_specs(target: str) -> list:
    """The decode configurations compile-checked for ``target`` (see ftlab.compile_check):
    Qwen3-Next's 16 key / 32 value heads of 128, in each float dtype (the prefill's:
    ftlab.triton.gated_delta_rule_chunk)."""
    from ftlab.triton.compile_spec import spec

    heads = {"HK": 16, "HV": 32, "DK": 128, "DV": 128, "BLOCK_K": 128, "L2NORM": True}
    specs = []
    for dt in ("fp32", "fp16", "bf16"):
        specs.append(
            spec(
                gated_delta_step_kernel,
                f"gated_delta_step_kernel[{dt}, 16/32 heads of 128]",
                types={
                    "q_ptr": f"*{dt}",
                    "k_ptr": f"*{dt}",
                    "v_ptr": f"*{dt}",
                    "g_ptr": "*fp32",
                    "beta_ptr": "*fp32",
                    "s_ptr": "*fp32",
                    "o_ptr": f"*{dt}",
                    "scale": "fp32",
                    "a_neg_ptr": "*fp32",
                    "dt_bias_ptr": "*fp32",
                    "reset_ptr": "*u8",
                },
                constexprs={**heads, "BLOCK_V": 32, "GATES": False, "RESET": False},
            )
        )
    # the models' decode: the gates from a and b in the activations' dtype, fresh rows reset
    specs.append(
        spec(
            gated_delta_step_kernel,
            "gated_delta_step_kernel[bf16, gates from a and b, reset]",
            types={
                "q_ptr": "*bf16",
                "k_ptr": "*bf16",
                "v_ptr": "*bf16",
                "g_ptr": "*bf16",
                "beta_ptr": "*bf16",
                "s_ptr": "*fp32",
                "o_ptr": "*bf16",
                "scale": "fp32",
                "a_neg_ptr": "*fp32",
                "dt_bias_ptr": "*fp32",
                "reset_ptr": "*u8",
            },
            constexprs={**heads, "BLOCK_V": 32, "GATES": True, "RESET": True},
        )
    )
    return specs

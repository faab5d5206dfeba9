"""Routed MoE through the HIP kernels of ``csrc/moe.hip`` (JIT-built, cached).

- ``route_topk``: a 32-lane group per token, the probabilities in registers (softmax in
  fp32, k rounds of argmax by shuffles, lower id wins a tie, renormalization); at most 1024
  experts and top_k <= 32.
- ``router_topk``: one launch, grid (E / 8, T): a 32-lane group a logit (fp32 dot, 16-byte
  loads), and the last block of a token to finish (a per-token counter, reset by that block)
  routes it as ``route_topk`` does. The counters live in one zeroed int32 buffer per device
  (65535 of them, 256 KiB), made by the first call and kept for the process (graphs hold its
  address): a first call inside a graph capture is an error, and calls on two streams of one
  device must not overlap. Past ``ROUTER_GEMM_TOKENS`` tokens of fp16 / bf16 (a prefill) the
  logits are one GEMM of the vendor BLAS instead (fp32 sums and output, rounded to x's dtype:
  ``torch.mm(..., out_dtype=torch.float32)``, where the build has it), then ``route_topk``'s
  kernel: the one-launch grid reads every weight row once a token.
- ``moe_align``: a count kernel and a scatter kernel, one block per expert, deterministic
  and without host synchronization (graph-safe).
- ``moe_experts``: up to ``DECODE_MAX_TOKENS`` tokens, per (token, slot) matvecs in two
  launches (gate/up + SwiGLU, then down weighted and summed over the slots in order); for
  Q4_0 banks (the int8 path) x is quantized to Q8_1 in LDS, the weights are read as 144-byte
  superblocks where rows allow, and the gate/up kernel writes h as Q8_1 blocks (32 rows of
  h per thread block); dense banks keep h in fp32; beyond, moe_align (block_m 64; 32 for
  16-bit banks under 16 rows an expert: ``gemm_block_m``) and the grouped GEMMs (Q4_0: dp4a
  tiles over Q8_1 rows; fp16 / bf16 banks: the matrix cores, ``csrc/mma.h``, K in steps of 64,
  h in the bank's dtype, fp32 sums; fp32 banks: fp32 FMA tiles), the routing weight applied
  after down, then the sum over the k slots.
  Q4_0 banks take the int8 path only; dense banks in another dtype than x are cast per call.
- ``moe_experts`` on Q8_0 / K-quant banks (a Q4_0 bank beside one too), int8 path, any T:
  ``csrc/moe_kquant.hip`` -- x and h quantized to Q8_1 by the Q4_0 family's kernel, a 32-thread
  group per weight row through quant_matmul.hip's block types, h in fp32 between the launches.
  Up to ``DECODE_MAX_TOKENS`` tokens on Q4_K / Q5_K / Q6_K banks of both kinds (any mix: Q4_K_M's
  Q4_K gate/up with Q6_K down), 16-byte aligned (variant ``"vec"``): two launches as for
  Q4_0 -- x quantized in every gate/up block, the weights read as quant_vec.h's 16-byte pieces
  (eight lanes a super-block), h written as Q8_1 by the gate/up kernel, y in x's dtype.

Which kernels run (variants ``"decode"`` / ``"gemm"`` for Q4_0 and dense banks, ``"vec"`` /
``"lanes"`` for the others) is the planner's (``ftlab.backends.rules``).
"""

from __future__ import annotations

import torch

from ftlab import backends, jit
from ftlab.backends import DECODE_MAX_TOKENS, calls
from ftlab.backends.calls import Call
from ftlab.hip.counters import zeroed_counters
from ftlab.hip.norm import add_rmsnorm
from ftlab.quant import Q4_0Weight, QuantWeight
from ftlab.reference.moe import align_capacity

MAX_EXPERTS = 1024  # kMaxExperts: the router's LDS row
MAX_TOP_K = 32  # a slot per lane of the router's 32-lane group
ROUTER_MAX_TOKENS = 65535  # router_topk: tokens a launch (grid y)
GEMM_BLOCK_M = 64  # kGemmTile: the grouped GEMM's rows per block, moe_align's block_m
#: router_topk: tokens past which fp16 / bf16 logits are one BLAS GEMM (module docstring): at
#: prefill lengths the one-launch kernel's logits were a visible share of a Qwen3.6 prefill
#: (benchmarks/NOTES.md, "Qwen3.6 step by step").
ROUTER_GEMM_TOKENS = DECODE_MAX_TOKENS
_FP32_OUT_MM: dict[tuple[torch.device, torch.dtype], bool] = {}


def _module(device: torch.device):
    return jit.module_for("moe", device)


def route_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.route_topk`."""
    t, e = logits.shape
    if e > MAX_EXPERTS or top_k > MAX_TOP_K:
        raise ValueError(
            f"the hip router takes at most {MAX_EXPERTS} experts and top_k <= {MAX_TOP_K}, got E = "
            f"{e}, top_k = {top_k}"
        )
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=logits.device)
    logits = logits if logits.shape[1] <= 1 or logits.stride(1) == 1 else logits.contiguous()
    module = _module(logits.device)
    jit.on_device(
        logits.device, lambda: module.moe_route_topk(logits, weights, ids, top_k, renormalize)
    )
    return weights, ids


def router_topk(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.router_topk`."""
    t, e = x.shape[0], weight.shape[0]
    if e > MAX_EXPERTS or top_k > MAX_TOP_K:
        raise ValueError(
            f"the hip router takes at most {MAX_EXPERTS} experts and top_k <= {MAX_TOP_K}, got E = "
            f"{e}, top_k = {top_k}"
        )
    dev = x.device
    if t > ROUTER_GEMM_TOKENS and x.dtype != torch.float32 and _fp32_out_mm(dev, x.dtype):
        logits = torch.mm(x, weight.t(), out_dtype=torch.float32).to(x.dtype)
        weights, ids = route_topk(logits, top_k, renormalize)
        return logits, weights, ids
    logits = x.new_empty((t, e))
    weights = x.new_empty((t, top_k), dtype=torch.float32)
    ids = x.new_empty((t, top_k), dtype=torch.int32)
    if t == 0:
        return logits, weights, ids
    x = x if x.shape[1] <= 1 or x.stride(1) == 1 else x.contiguous()
    weight = weight if weight.shape[1] <= 1 or weight.stride(1) == 1 else weight.contiguous()
    counters = zeroed_counters("router_topk", dev, ROUTER_MAX_TOKENS)
    module = _module(dev)
    for a in range(0, t, ROUTER_MAX_TOKENS):  # the grid's y dimension holds 65535 tokens a launch
        b = min(a + ROUTER_MAX_TOKENS, t)
        jit.on_device(
            dev,
            lambda a=a, b=b: module.moe_router_topk(
                x[a:b], weight, logits[a:b], weights[a:b], ids[a:b], counters, top_k, renormalize
            ),
        )
    return logits, weights, ids


def _fp32_out_mm(dev: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch's GEMM of ``dtype`` (fp16 / bf16) with fp32 output (``torch.mm(...,
    out_dtype=)``) runs on ``dev`` (asked once a device and dtype, on two small matrices: not inside
    a graph capture, as the router's counters are made at its first call too)."""
    key = (dev, dtype)
    if key not in _FP32_OUT_MM:
        a = torch.ones((2, 8), dtype=dtype, device=dev)
        try:
            _FP32_OUT_MM[key] = torch.mm(a, a.t(), out_dtype=torch.float32).dtype == torch.float32
        except (RuntimeError, NotImplementedError, TypeError):
            _FP32_OUT_MM[key] = False
    return _FP32_OUT_MM[key]


def _rows16(t: torch.Tensor) -> bool:
    """Rows that start 16-byte aligned (the base and the row stride)."""
    return t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def add_rmsnorm_router_topk(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    top_k: int,
    renormalize: bool,
) -> tuple:
    """Backend entry of :func:`ftlab.ops.add_rmsnorm_router_topk`: one launch
    (``csrc/moe_route.hip``, add_rmsnorm's and router_topk's arithmetic) for up to
    ``DECODE_MAX_TOKENS`` tokens with the norm weight in x's dtype and 16-byte aligned rows of H a
    multiple of 16 bytes (at most 1024 such pieces); otherwise hip's add_rmsnorm then hip's
    router_topk (the same bits)."""
    t, h = x.shape
    e = weight.shape[0]
    elems = 16 // x.element_size()
    fused = (
        0 < t <= DECODE_MAX_TOKENS
        and norm_weight.dtype == x.dtype
        and h % elems == 0
        and h <= 1024 * elems
        and e <= MAX_EXPERTS
        and top_k <= MAX_TOP_K
        and norm_weight.is_contiguous()
        and norm_weight.data_ptr() % 16 == 0
        and residual is not None
        and _rows16(x)
        and _rows16(residual)
    )
    if not fused:
        y, s = add_rmsnorm(x, residual, norm_weight, eps)
        return (y, s, *router_topk(y, weight, top_k, renormalize))
    dev = x.device
    y = x.new_empty((t, h))
    s = x.new_empty((t, h))
    logits = x.new_empty((t, e))
    weights = x.new_empty((t, top_k), dtype=torch.float32)
    ids = x.new_empty((t, top_k), dtype=torch.int32)
    weight = weight if h <= 1 or weight.stride(1) == 1 else weight.contiguous()
    counters = zeroed_counters("router_topk", dev, ROUTER_MAX_TOKENS)
    module = _module(dev)
    jit.on_device(
        dev,
        lambda: module.moe_norm_router_topk(
            x,
            residual,
            norm_weight,
            s,
            y,
            float(eps),
            weight,
            logits,
            weights,
            ids,
            counters,
            top_k,
            renormalize,
        ),
    )
    return y, s, logits, weights, ids


def moe_align(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backend entry of :func:`ftlab.ops.moe_align`."""
    flat = ids.reshape(-1).to(torch.int32).contiguous()
    capacity = align_capacity(flat.numel(), num_experts, block_m)
    dev = ids.device
    sorted_ids = torch.empty((capacity,), dtype=torch.int32, device=dev)
    expert_ids = torch.empty((capacity // block_m,), dtype=torch.int32, device=dev)
    npad = torch.empty((1,), dtype=torch.int32, device=dev)
    counts = torch.empty((num_experts,), dtype=torch.int32, device=dev)
    module = _module(dev)
    jit.on_device(
        dev, lambda: module.moe_align(flat, counts, sorted_ids, expert_ids, npad, block_m)
    )
    return sorted_ids, expert_ids, npad


def _bank(w, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(w, Q4_0Weight):
        return w.data if w.data.is_contiguous() else w.data.contiguous()
    return w.to(dtype).contiguous()


#: the bank type codes of ``csrc/moe_kquant_launch.hip``
KQ_CODES = {"Q8_0": 0, "Q4_K": 1, "Q5_K": 2, "Q6_K": 3, "Q4_0": 4}


def _experts_kquant(x, w_gate_up, w_down, ids, wts, variant: str) -> torch.Tensor:
    """The int8 path on Q8_0 / K-quant banks (``csrc/moe_kquant.hip``), any T: Q8_1 x -> gate/up
    + SwiGLU (a 32-thread group a row) -> Q8_1 h -> down + the weighted sum over the slots."""
    from ftlab.hip.q4_0 import quantize_q8_1

    t, hidden = x.shape
    top_k, inter, dev = ids.shape[1], w_down.shape[-1], x.device
    module = jit.module_for("moe_kquant", dev)
    if variant == "vec":
        hq = torch.empty((t * top_k, inter), dtype=torch.int8, device=dev)
        hd = torch.empty((t * top_k, inter // 32), dtype=torch.float32, device=dev)
        hs = torch.empty_like(hd)
        y = x.new_empty((t, hidden))
        jit.on_device(
            dev,
            lambda: module.moe_experts_decode_kq(
                x,
                w_gate_up.data,
                KQ_CODES[w_gate_up.qtype],
                w_down.data,
                KQ_CODES[w_down.qtype],
                ids,
                wts,
                hq,
                hd,
                hs,
                y,
            ),
        )
        return y
    # the kernels read 32-bit words of the blocks: an unaligned view is copied
    gu, dn = (
        w.data if w.data.is_contiguous() and w.data.data_ptr() % 4 == 0 else w.data.clone()
        for w in (w_gate_up, w_down)
    )
    x8 = quantize_q8_1(x)
    h = torch.empty((t * top_k, inter), dtype=torch.float32, device=dev)
    jit.on_device(
        dev, lambda: module.moe_gate_up_kq(x8.q, x8.d, x8.s, gu, KQ_CODES[w_gate_up.qtype], ids, h)
    )
    h8 = quantize_q8_1(h)
    y = torch.empty((t, hidden), dtype=torch.float32, device=dev)
    jit.on_device(
        dev, lambda: module.moe_down_kq(h8.q, h8.d, h8.s, dn, KQ_CODES[w_down.qtype], ids, wts, y)
    )
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def moe_experts(
    x,
    w_gate_up,
    w_down,
    topk_weights,
    topk_ids,
    path: str,
    variant: str | None = None,
    call: Call | None = None,
) -> torch.Tensor:
    """Backend entry of :func:`ftlab.ops.moe_experts` (quantized banks: ``path == "int8"``).
    ``variant``: ``"decode"`` / ``"gemm"`` (Q4_0 or dense banks), ``"vec"`` / ``"lanes"`` (other
    quantized banks); None: the planner's default; one that cannot serve raises
    ``BackendUnavailable``."""
    call = call or calls.experts(x, w_gate_up, w_down, topk_ids.shape[1])  # a plan passes its own
    variant = backends.variant_for("moe_experts", "hip", call, variant, path=path)
    if isinstance(w_gate_up, QuantWeight) and not (
        isinstance(w_gate_up, Q4_0Weight) and isinstance(w_down, Q4_0Weight)
    ):
        if path != "int8":
            raise ValueError(
                f"the hip experts implement the int8 path for quantized banks, got path={path!r}"
            )
        if x.shape[0] == 0:
            return torch.empty(x.shape, dtype=x.dtype, device=x.device)
        x = x if x.stride(1) == 1 else x.contiguous()
        return _experts_kquant(
            x,
            w_gate_up,
            w_down,
            topk_ids.to(torch.int32).contiguous(),
            topk_weights.contiguous(),
            variant,
        )
    q4 = isinstance(w_gate_up, Q4_0Weight)
    if q4 and path != "int8":
        raise ValueError(
            f"the hip experts implement the int8 path for Q4_0 banks, got path={path!r}"
        )
    if q4 != isinstance(w_down, Q4_0Weight):
        raise ValueError(
            "w_gate_up and w_down must both be Q4_0 banks or both dense for the hip experts"
        )
    t, hidden = x.shape
    top_k = topk_ids.shape[1]
    inter = w_down.shape[-1]
    dev = x.device
    y = x.new_empty((t, hidden))
    if t == 0 or top_k == 0:  # no slots: y is an empty sum
        return y.zero_()
    x = x if x.stride(1) == 1 else x.contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    wts = topk_weights.contiguous()
    gu, dn = _bank(w_gate_up, x.dtype), _bank(w_down, x.dtype)
    module = _module(dev)
    if variant == "decode":
        if q4:  # h as Q8_1, written by the gate/up kernel
            hq = x.new_empty((t * top_k, inter), dtype=torch.int8)
            hd = x.new_empty((t * top_k, inter // 32), dtype=torch.float32)
            hs = torch.empty_like(hd)
            jit.on_device(
                dev, lambda: module.moe_experts_decode_q4(x, gu, dn, ids, wts, hq, hd, hs, y)
            )
        else:
            h = torch.empty((t * top_k, inter), dtype=torch.float32, device=dev)
            jit.on_device(dev, lambda: module.moe_experts_decode_dense(x, gu, dn, ids, wts, h, y))
        return y
    return _experts_gemm(module, x, gu, dn, ids, wts, q4, inter)


def gemm_block_m(x: torch.Tensor, gu: torch.Tensor, dn: torch.Tensor, pairs: int) -> int:
    """moe_align's block_m for the grouped GEMMs: 64, or 32 on the matrix cores (fp16 / bf16 banks
    whose rows are whole 16-byte chunks, as the launcher checks) when an expert has fewer than 16
    rows on average, so that few tokens an expert do not fill blocks with padding rows."""
    k, inter = x.shape[1], dn.shape[-1]
    mma = (
        x.dtype in (torch.float16, torch.bfloat16)
        and k % 8 == 0
        and inter % 8 == 0
        and k < 2**30
        and _rows16(x)
        and gu.data_ptr() % 16 == 0
        and dn.data_ptr() % 16 == 0
    )
    return 32 if mma and pairs < 16 * gu.shape[0] else GEMM_BLOCK_M


def _experts_gemm(module, x, gu, dn, ids, wts, q4: bool, inter: int) -> torch.Tensor:
    from ftlab.hip.q4_0 import quantize_q8_1

    t, hidden = x.shape
    top_k = ids.shape[1]
    pairs = t * top_k
    dev = x.device
    block_m = GEMM_BLOCK_M if q4 else gemm_block_m(x, gu, dn, pairs)
    sorted_ids, expert_ids, npad = moe_align(ids, gu.shape[0], block_m)
    # dense banks: h in the bank's (x's) dtype, as Triton's
    h_dtype = x.dtype if not q4 else torch.float32
    h = torch.empty((pairs, inter), dtype=h_dtype, device=dev)
    out = torch.zeros((pairs, hidden), dtype=torch.float32, device=dev)
    flat_w = wts.view(-1)
    if q4:
        x8 = quantize_q8_1(x)
        jit.on_device(
            dev,
            lambda: module.moe_gemm_q4(
                gu, x8.q, x8.d, x8.s, sorted_ids, expert_ids, npad, flat_w, h, top_k, True
            ),
        )
        h8 = quantize_q8_1(h)
        jit.on_device(
            dev,
            lambda: module.moe_gemm_q4(
                dn, h8.q, h8.d, h8.s, sorted_ids, expert_ids, npad, flat_w, out, top_k, False
            ),
        )
    else:
        jit.on_device(
            dev,
            lambda: module.moe_gemm_dense(
                x, gu, sorted_ids, expert_ids, npad, flat_w, h, top_k, True
            ),
        )
        jit.on_device(
            dev,
            lambda: module.moe_gemm_dense(
                h, dn, sorted_ids, expert_ids, npad, flat_w, out, top_k, False
            ),
        )
    return out.view(t, top_k, hidden).sum(1).to(x.dtype)

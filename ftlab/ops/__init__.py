"""The public ops. Each validates its arguments, routes to a backend through the one routing
table (:mod:`ftlab.backends`), and calls it.

Validation happens here, once, before any backend runs, so every backend path rejects the same
bad input with the same message, and a rejected call has written nothing. One module per op
family, named as in every backend folder (``ftlab/{reference,triton,hip}/<family>.py``):

- ``index_store``: :func:`index`, :func:`store`;
- ``q4_0``: :func:`quantize_q4_0`, :func:`dequantize_q4_0`, :func:`quantize_q8_1`,
  :func:`q4_0_matmul`, :func:`add_rmsnorm_q4_0_matmul`;
- ``moe``: :func:`route_topk`, :func:`router_topk`, :func:`add_rmsnorm_router_topk`,
:func:`moe_align`,
  :func:`moe_experts`, :func:`fused_moe`;
- ``qk_norm_rope``: :func:`qk_norm_rope`;
- ``gated_delta_rule``: :func:`gated_delta_rule` (prefill), :func:`gated_delta_step` (decode);
- ``conv1d``: :func:`causal_conv1d`, :func:`causal_conv1d_update`;
- ``gated_norm``: :func:`gated_rmsnorm`, :func:`output_gate`;
- ``norm``: :func:`add_rmsnorm` (the residual add fused with the next RMSNorm);
- ``attention``: :func:`decode_attention` (one query token a sequence over its KV cache);
- ``quant_matmul``: :func:`quant_matmul` (Q8_0 and the K-quants; Q4_0 through ``q4_0_matmul``);
- ``quants``: :func:`dequantize` (Q8_0 and the K-quants; Q4_0 through ``dequantize_q4_0``),
  :func:`quantize` (Q8_0; Q4_0 through ``quantize_q4_0``).

``ftlab ops`` (or :func:`ftlab.catalog.describe`) lists where everything about an op lives.
"""

from ftlab.ops.attention import decode_attention
from ftlab.ops.conv1d import causal_conv1d, causal_conv1d_update
from ftlab.ops.gated_delta_rule import gated_delta_rule, gated_delta_step
from ftlab.ops.gated_norm import gated_rmsnorm, output_gate
from ftlab.ops.index_store import index, store
from ftlab.ops.moe import (
    add_rmsnorm_router_topk,
    fused_moe,
    moe_align,
    moe_experts,
    route_topk,
    router_topk,
)
from ftlab.ops.norm import add_rmsnorm
from ftlab.ops.q4_0 import (
    add_rmsnorm_q4_0_matmul,
    dequantize_q4_0,
    q4_0_matmul,
    quantize_q4_0,
    quantize_q8_1,
)
from ftlab.ops.qk_norm_rope import qk_norm_rope
from ftlab.ops.quant_matmul import quant_matmul
from ftlab.ops.quants import dequantize, quantize

__all__ = [
    "add_rmsnorm",
    "add_rmsnorm_q4_0_matmul",
    "add_rmsnorm_router_topk",
    "causal_conv1d",
    "causal_conv1d_update",
    "decode_attention",
    "dequantize",
    "dequantize_q4_0",
    "fused_moe",
    "gated_delta_rule",
    "gated_delta_step",
    "gated_rmsnorm",
    "index",
    "moe_align",
    "moe_experts",
    "output_gate",
    "q4_0_matmul",
    "qk_norm_rope",
    "quant_matmul",
    "quantize",
    "quantize_q4_0",
    "quantize_q8_1",
    "route_topk",
    "router_topk",
    "store",
]

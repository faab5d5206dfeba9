"""The built-in ops: one line each, registered with their reference, Triton and HIP
implementations (and the native CPU kernels of ``moe_experts``, picked by name only).

Each op's ``shape`` names the dims ``ftlab ops NAME --explain --shape`` reads, in order.
"""

from __future__ import annotations

import torch

from ftlab.backends.registry import (
    COPY_DTYPES,
    FLOAT_DTYPES,
    Q4_0_PATHS,
    cpu_unavailable,
    define_op,
    hip_unavailable,
    register,
    triton_unavailable,
)

INT8_ONLY = {"paths": ("int8",), "prefill_path": "int8"}
BOTH_PATHS = {"paths": Q4_0_PATHS, "prefill_path": "dequant"}
MATMUL = ("M", "K", "N")
EXPERTS = ("T", "H", "I", "E", "top_k")
ROWS = ("T", "H")


def builtin(
    op: str,
    family: str,
    summary: str,
    dtypes: tuple[torch.dtype, ...],
    shape: tuple[str, ...] = ROWS,
    *,
    paths: tuple[str, ...] = (),
    cpu: bool = False,
) -> None:
    """reference + triton + hip (+ the native cpu kernels, by name only) of ``op`` from
    ``ftlab/<backend>/<family>.py``. Quantized-weight paths: reference and triton both, hip and
    cpu int8 only (their prefill kernels too). The reference reads tensors on the host: not
    graph-capturable."""
    define_op(op, family, summary, paths, shape)
    both = BOTH_PATHS if paths else {}
    int8 = INT8_ONLY if paths else {}
    ref, tri = f"ftlab.reference.{family}:{op}", f"ftlab.triton.{family}:{op}"
    register(op, "reference", ref, dtypes=dtypes, capturable=False, **both)
    register(op, "triton", tri, dtypes=dtypes, available=triton_unavailable, **both)
    register(
        op,
        "hip",
        f"ftlab.hip.{family}:{op}",
        platforms=("cuda", "rocm"),
        dtypes=dtypes,
        available=hip_unavailable,
        **int8,
    )
    if cpu:
        register(
            op,
            "cpu",
            f"ftlab.cpu.{family}:{op}",
            platforms=("cpu",),
            dtypes=dtypes,
            available=cpu_unavailable,
            auto=False,
            capturable=False,
            **int8,
        )


F = FLOAT_DTYPES
# fmt: off
builtin("index", "index_store", "gather rows (embedding lookup, KV-cache read)", COPY_DTYPES)
builtin("store", "index_store", "scatter rows into a KV cache in place", COPY_DTYPES)
builtin("quantize_q4_0", "q4_0", "float weights to GGUF Q4_0 blocks", F, ("N", "K"))
builtin("dequantize_q4_0", "q4_0", "GGUF Q4_0 blocks to float", F, ("N", "K"))
builtin("quantize_q8_1", "q4_0", "activations to Q8_1 blocks (the int8 dot's other side)", F)
builtin("q4_0_matmul", "q4_0", "x @ W.T, Q4_0 weights: int8-dot matvec, prefill GEMM", F, MATMUL,
        paths=Q4_0_PATHS)
builtin("add_rmsnorm_q4_0_matmul", "q4_0",
        "add_rmsnorm, then q4_0_matmul of y (decode: one launch)", F, MATMUL, paths=Q4_0_PATHS)
builtin("route_topk", "moe", "router: softmax, top-k, renormalize", F, ("T", "E", "top_k"))
builtin("router_topk", "moe", "router linear layer then route_topk (decode: one launch)", F,
        ("T", "H", "E", "top_k"))
builtin("add_rmsnorm_router_topk", "moe", "add_rmsnorm, then router_topk of y (decode: one launch)",
        F, ("T", "H", "E", "top_k"))
builtin("moe_align", "moe", "group (token, slot) pairs by expert for the grouped GEMM", F,
        ("T", "top_k", "E"))
builtin("moe_experts", "moe", "routed SwiGLU experts, dense or quantized banks", F, EXPERTS,
        paths=Q4_0_PATHS, cpu=True)
builtin("qk_norm_rope", "qk_norm_rope", "per-head RMSNorm of q and k, then RoPE", F,
        ("T", "H", "KVH", "D"))
builtin("dequantize", "quants", "GGUF Q8_0 / Q4_K / Q5_K / Q6_K blocks to float (Q4_0: "
        "dequantize_q4_0)", F, ("N", "K"))
builtin("causal_conv1d", "conv1d", "causal depthwise conv1d with a carried state (gated deltanet "
        "prefill)", F, ("B", "T", "C", "W"))
builtin("causal_conv1d_update", "conv1d", "one decode token of causal_conv1d, state updated in "
        "place", F, ("B", "C", "W"))
builtin("gated_rmsnorm", "gated_norm", "per-head RMSNorm times SiLU of a gate (gated deltanet "
        "output)", F)
builtin("output_gate", "gated_norm", "attention output times sigmoid of a gate", F)
builtin("add_rmsnorm", "norm", "residual add fused with the next RMSNorm (decode hot path)", F)
builtin("decode_attention", "attention", "one query token a sequence over its cached keys and "
        "values (split-K)", F, ("B", "H", "KVH", "D", "S"))
builtin("quantize", "quants", "float weights to GGUF Q8_0 blocks (Q4_0: quantize_q4_0)", F,
        ("N", "K"))
builtin("gated_delta_rule", "gated_delta_rule", "Gated DeltaNet linear attention over a sequence "
        "(prefill)", F, ("B", "T", "Hk", "Hv", "Dk", "Dv"))
builtin("gated_delta_step", "gated_delta_rule",
        "Gated DeltaNet, one decode token, the state in place", F, ("B", "Hk", "Hv", "Dk", "Dv"))
builtin("quant_matmul", "quant_matmul", "x @ W.T for Q8_0 / Q4_K / Q5_K / Q6_K weights (Q4_0: "
        "q4_0_matmul)", F, MATMUL, paths=Q4_0_PATHS)
# fmt: on

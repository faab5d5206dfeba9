"""Property-testing kit: hypothesis strategies and one cross-backend case function per op.

A case is drawn once on the CPU; the case function moves it to the device, runs every
backend that can serve it (the built-in ones and any registered with
:func:`ftlab.backends.register`), and holds each to the reference: bit-exact for copies and
quantizers, within the op's documented tolerance for matmuls. A researcher's new kernel is
checked in a few lines::

    from hypothesis import given
    import ftlab.backends, ftlab.testing as ft

    ftlab.backends.register("index", "my_gather", my_gather, platforms=["cuda"])

    @given(ft.index_cases())
    def test_my_gather(case):
        ft.check_index_case(case, "cuda", backends=["my_gather"])

Needs the ``dev`` extra (hypothesis).
"""

from ftlab.bitview import bits_equal, random_rows
from ftlab.testing.attention import (
    check_decode_attention_case,
    decode_attention_held_to_reference,
    decode_attention_tolerance,
)
from ftlab.testing.common import FLOAT_DTYPES, backends_for, restride
from ftlab.testing.conv1d import (
    causal_conv1d_tolerance,
    check_causal_conv1d_case,
    check_causal_conv1d_update_case,
)
from ftlab.testing.experts_bounds import experts_tolerance, hybrid_tolerance
from ftlab.testing.gated_delta_bounds import gated_delta_exact, gated_delta_tolerance
from ftlab.testing.gated_delta_rule import (
    HOSTILE_DECAYS,
    assert_one_plane_accuracy,
    assert_three_plane_accuracy,
    check_gated_delta_rule_case,
    check_gated_delta_step_case,
    check_hostile_decays,
)
from ftlab.testing.gated_norm import (
    check_gated_rmsnorm_case,
    check_output_gate_case,
    gated_rmsnorm_tolerance,
    output_gate_tolerance,
)
from ftlab.testing.index_store import (
    IndexCase,
    StoreCase,
    check_index_case,
    check_store_case,
    index_cases,
    store_cases,
)
from ftlab.testing.moe import (
    check_align_case,
    check_experts_case,
    check_norm_router_case,
    check_route_case,
    check_router_case,
    random_quant_bank,
    router_logits_tolerance,
)
from ftlab.testing.norm import add_rmsnorm_tolerance, check_add_rmsnorm_case
from ftlab.testing.q4_0 import (
    MatmulCase,
    check_dequantize_case,
    check_matmul_case,
    check_norm_matmul_case,
    check_q8_1_case,
    check_quantize_case,
    matmul_cases,
    matmul_tolerance,
    q4_0_weight_values,
    q8_1_inputs,
)
from ftlab.testing.qk_norm_rope import (
    check_qk_norm_rope_cache_case,
    check_qk_norm_rope_case,
    qk_norm_rope_tolerance,
)
from ftlab.testing.quant_matmul import (
    QuantMatmulCase,
    check_quant_matmul_case,
    quant_matmul_cases,
    quant_matmul_tolerance,
)
from ftlab.testing.quants import (
    KQUANT_TYPES,
    check_q8_0_quantize_case,
    check_quant_dequantize_case,
    q8_0_values,
    quant_weights,
)

__all__ = [
    "check_decode_attention_case",
    "decode_attention_held_to_reference",
    "decode_attention_tolerance",
    "FLOAT_DTYPES",
    "KQUANT_TYPES",
    "QuantMatmulCase",
    "check_quant_matmul_case",
    "quant_matmul_cases",
    "quant_matmul_tolerance",
    "check_q8_0_quantize_case",
    "check_quant_dequantize_case",
    "q8_0_values",
    "quant_weights",
    "IndexCase",
    "MatmulCase",
    "StoreCase",
    "backends_for",
    "bits_equal",
    "check_align_case",
    "check_dequantize_case",
    "check_experts_case",
    "check_norm_router_case",
    "experts_tolerance",
    "random_quant_bank",
    "router_logits_tolerance",
    "hybrid_tolerance",
    "check_gated_delta_rule_case",
    "check_gated_delta_step_case",
    "HOSTILE_DECAYS",
    "check_hostile_decays",
    "assert_one_plane_accuracy",
    "assert_three_plane_accuracy",
    "gated_delta_exact",
    "gated_delta_tolerance",
    "check_qk_norm_rope_cache_case",
    "check_qk_norm_rope_case",
    "qk_norm_rope_tolerance",
    "causal_conv1d_tolerance",
    "check_causal_conv1d_case",
    "check_causal_conv1d_update_case",
    "check_gated_rmsnorm_case",
    "check_output_gate_case",
    "gated_rmsnorm_tolerance",
    "output_gate_tolerance",
    "add_rmsnorm_tolerance",
    "check_add_rmsnorm_case",
    "check_index_case",
    "check_matmul_case",
    "check_norm_matmul_case",
    "check_q8_1_case",
    "check_quantize_case",
    "check_route_case",
    "check_router_case",
    "check_store_case",
    "index_cases",
    "matmul_cases",
    "matmul_tolerance",
    "q4_0_weight_values",
    "q8_1_inputs",
    "random_rows",
    "restride",
    "store_cases",
]

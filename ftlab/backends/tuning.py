"""The kernels' launch configurations by GPU arch: tiles, warps and stages, each table one
kernel's (the planner's rules choose which kernel runs; these, how it is launched there).

A row keyed by an arch (``"sm_90"``, ``"gfx942"``) was swept or compile-checked there, as its
comment says; ``"default"`` serves an arch without a row; ``"interpreter"`` (where present) is
Triton's CPU interpreter, whose cost is its number of programs. The kernels read these through
``ftlab.triton``'s ``config`` functions; the compile check launches every row for its target.
"""

from __future__ import annotations

# Launch configurations, one table. sm_90's matvec entry is the best of a sweep on an H200
# (benchmarks/NOTES.md); its GEMM entry and every gfx entry are untimed starting points
# (wave32 / wave64 sized), compile-checked for their targets.
TRITON_Q4_0: dict[str, dict[str, dict[str, int]]] = {
    # mv4 (the dp4a matvec over 32-bit words) where PTX dp4a exists (asm: 1); the gfx targets
    # keep mv, the int16-word matvec. sm_90 mv4: best of 12 (BLOCK_N 2-16, BLOCK_KB 32/64,
    # 2-8 warps, 4-32 programs per SM) on the lm_head (benchmarks/NOTES.md).
    "sm_90": {
        "mv": {"BLOCK_N": 64, "BLOCK_KB": 8, "num_warps": 4},
        "mv4": {"BLOCK_N": 4, "BLOCK_KB": 64, "num_warps": 4, "asm": 1, "progs_per_sm": 8},
        # the MoE decode experts' int8 matvecs (ftlab/triton/moe_q4_0_int8.py): best of 9 at T = 1
        "moe_mv": {"BLOCK_N": 4, "BLOCK_KB": 32, "num_warps": 2, "asm": 1},
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 3},
        "gemm_f32": {
            "BLOCK_M": 64,
            "BLOCK_N": 64,
            "BLOCK_KB": 1,
            "num_warps": 4,
            "num_stages": 2,
            "f32_precision": "tf32x3",
        },
    },
    "gfx1100": {
        "mv": {"BLOCK_N": 16, "BLOCK_KB": 8, "num_warps": 4},
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
        "gemm_f32": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
    },
    "gfx1201": {
        "mv": {"BLOCK_N": 16, "BLOCK_KB": 8, "num_warps": 4},
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
        "gemm_f32": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
    },
    "gfx942": {  # wave64; BLOCK_KB 8 spills SGPRs at M = 8
        "mv": {"BLOCK_N": 16, "BLOCK_KB": 4, "num_warps": 4},
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
        "gemm_f32": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
    },
    "default": {
        "mv": {"BLOCK_N": 16, "BLOCK_KB": 8, "num_warps": 4},
        "mv4": {"BLOCK_N": 4, "BLOCK_KB": 64, "num_warps": 4, "asm": 0, "progs_per_sm": 8},
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
        "gemm_f32": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_KB": 1, "num_warps": 4, "num_stages": 2},
    },
}
TRITON_Q4_0["gfx1151"] = TRITON_Q4_0["gfx1100"]
# Triton's CPU interpreter runs one program at a time in Python, so its cost is the number of
# programs: the default table with the MoE decode matvecs in fewer, larger tiles (the same
# kernels and masks; 24.5 -> 2.5 s for one T = 3 int8 moe_experts call on 2 cores).
TRITON_Q4_0["interpreter"] = {
    **TRITON_Q4_0["default"],
    "moe_mv": {"BLOCK_N": 32, "BLOCK_KB": 8, "num_warps": 4, "asm": 0},
}


#: ftlab.triton.moe_gemm's grouped GEMM tiles (16-bit activations) by arch
TRITON_MOE_GEMM: dict[str, dict[str, int]] = {
    # untimed starting points but for sm_90 (see benchmarks/NOTES.md)
    "sm_90": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
    "default": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},
}


#: GEMM tiles by activation dtype ("half": 16-bit, by arch, else "default"; "f32"). BLOCK_K 64
#: takes 64 weights a step as two 32-column halves (:func:`dequant_pair`; where row scales are on);
#: sm_90's from the sweeps at M = 512 in benchmarks/NOTES.md (spill-free with x aligned as
#: :func:`~ftlab.triton.q4_0_common.rows_16` makes it), the others untimed
TRITON_QUANT_GEMM: dict[str, dict] = {
    "half": {
        "sm_90": {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
        "default": {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},
    },
    "f32": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 8, "num_stages": 2},
    # Q4_0 weights (16-bit x; only the 64-weight steps decode Q4_0): the archs where these tiles
    # were timed against ftlab.triton.q4_0's GEMM and HIP's int8 tiles (the planner's PREFER row)
    "q4_0": {
        "sm_90": {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
    },
}


#: "q4_0_pairs": Q4_0 banks' 64-weight steps by arch (timed for two Q4_0 banks; a Q4_0 bank beside
#: a K-quant one takes them too when Triton's dequant path is asked for). "generic" (Q4_0 banks
#: elsewhere, and RDNA, where the pair tiles spill): :func:`_kq_b_tile` a weight at a time,
#: 32x32x16 at 8 warps.
#: sm_90's are the fastest of the sweeps in benchmarks/NOTES.md (Qwen3-30B-A3B layer, T = 512 and
#: 2048), spill-free with the activations aligned as :func:`~ftlab.triton.q4_0_common.rows_16`
#: makes them.
TRITON_KQUANT_GEMM = {
    "pairs": {
        "sm_90": {
            "gate_up": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
            "down": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
        },
        "default": {
            "gate_up": {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
            "down": {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
        },
        "f32": {
            "gate_up": {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 8, "num_stages": 2},
            "down": {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2},
        },
    },
    # Q4_0 banks (16-bit activations) in 64-weight steps: the archs where these were timed
    # against moe_gemm's experts_gemm and HIP's int8 kernels (the planner's PREFER row)
    "q4_0_pairs": {
        "sm_90": {
            "gate_up": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
            "down": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
        },
    },
    "generic": {
        "half": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 8, "num_stages": 2},
        "f32": {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 8, "num_stages": 2},
    },
}


RDNA_DELTA_RULE_CHUNK = {"BS": 16, "BV": 16, "num_warps": 8}
#: Per target: head dimensions BS columns at a time, BV state columns a program in the state and
#: output kernels (STATE_BV in the state kernel: narrower, so that more programs share the
#: chunk-after-chunk work), warps a program; each free of spills in the compile check.
TRITON_DELTA_RULE_CHUNK: dict[str, dict[str, int]] = {
    "default": {"BS": 32, "BV": 32, "STATE_BV": 16, "num_warps": 8},
    "sm_90": {"BS": 32, "BV": 32, "STATE_BV": 16, "num_warps": 8},
    "gfx942": {"BS": 32, "BV": 32, "STATE_BV": 16, "num_warps": 4},
    "gfx1100": RDNA_DELTA_RULE_CHUNK,
    "gfx1151": RDNA_DELTA_RULE_CHUNK,
    "gfx1201": RDNA_DELTA_RULE_CHUNK,
}


#: Per target: head-dimension columns an inverse / WY / output step (BS), state columns a scan
#: program (SCAN_BV) in SCAN_NQ blocks of key rows, its warps and pipeline stages, output columns a
#: program (OUT_BV; OUT_BV_F32 for fp32 inputs, whose tiles are twice the bytes) and warps; each
#: free of spills in the compile check. From the H200 sweep of 2026-12-01 (benchmarks/NOTES.md).
TRITON_DELTA_RULE_CHUNK64: dict[str, dict[str, int]] = {
    "default": {
        "INV_BS": 32,
        "INV_WARPS": 4,
        "WY_BS": 32,
        "WY_WARPS": 4,
        "SCAN_NQ": 2,
        "SCAN_BV": 16,
        "SCAN_WARPS": 4,
        "SCAN_STAGES": 2,
        "OUT_BS": 32,
        "OUT_BV": 64,
        "OUT_BV_F32": 16,
        "OUT_WARPS": 4,
    },
}
# 2 stages spill SGPRs there
TRITON_DELTA_RULE_CHUNK64["gfx942"] = {
    **TRITON_DELTA_RULE_CHUNK64["default"],
    "SCAN_STAGES": 1,
}

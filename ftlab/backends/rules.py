"""The planner's tables: every measured choice of backend, path and kernel variant, as data.

Three tables, read by :func:`ftlab.backends.plan` in this order:

- :data:`PREFER`: where ``backend="auto"`` departs from the auto order (hip, triton, reference
  on a GPU) because another backend measured faster for that platform, regime and weight type;
- :data:`KERNELS`: the kernel variants a backend has for an op, each with what it serves (its
  regimes, dtypes, weight types, and the limits of its buffers and loads);
- :data:`DEFAULTS`: which of them the backend runs when no variant is named: the first whose
  conditions hold and whose kernel serves the call.

Each row's ``why`` says why it is there and names the committed results that measured it
(``benchmarks/results/``; a test checks that the files exist). A regime is one of
:data:`ONE_ROW` (decode of one sequence), :data:`SMALL` (up to ``DECODE_MAX_TOKENS`` rows) and
:data:`PREFILL`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ftlab.backends.calls import BLOCK_QUANTS, HALF, K_QUANTS, ONE_ROW, PREFILL, SMALL, Limit, When
from ftlab.backends.limits import (
    FUSED_MAX_K,
    ONE_LAUNCH,
    ONE_LAUNCH_TYPES,
    SLICED_MAX_K,
    STAGED_MAX_K,
    aligned,
    all_of,
    attention_split,
    attention_tiles,
    banks_block_quants,
    banks_q4_0_or_dense,
    delta_rule_chunks,
    experts_decode,
    experts_vec,
    hip_delta_rule_grid,
    k_range,
    not_q8_0,
    q4_0_region,
    q4_0_words,
    row_pieces,
    tiled_k,
    whole_pieces,
    words_fit,
)


@dataclass(frozen=True)
class Prefer:
    """``backend="auto"`` takes ``backend`` (on ``path``, None: by the rows) for ``ops`` where
    ``when`` holds and that backend serves the call -- with ``variants``, only where its default
    variant is one of them."""

    ops: tuple[str, ...]
    backend: str
    when: When
    why: str
    path: str | None = None
    variants: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Kernel:
    """One kernel variant of a backend's op: what it serves (``when``) and its limits (``limit``:
    why it cannot take a call's sizes or layout, or None)."""

    name: str
    when: When
    summary: str
    limit: Limit | None = None


@dataclass(frozen=True)
class Option:
    """A default value of a kernel's option (e.g. the one-row matvec's staging): taken where
    ``when`` holds and the value's limit (:data:`OPTION_LIMITS`) passes; ``why`` it is."""

    value: str
    why: str
    when: When = When()


@dataclass(frozen=True)
class Default:
    """A backend runs ``variant`` by default where ``when`` holds and the kernel serves."""

    variant: str
    why: str
    when: When = When()


# ---------------------------------------------------------------------------------- tables

# fmt: off
R = "benchmarks/results/"
PREFER: tuple[Prefer, ...] = (
    Prefer(("quant_matmul",), "hip", When(vendors=("nvidia",), regimes=(ONE_ROW,), qtypes=K_QUANTS),
           "hip's one-launch one-row matvecs: 88% / 83% / 83% of copy (Q4_K / Q5_K / Q6_K) on the "
           "lm_head against Triton's 74% / 62% / 74%; " + R + "2026-12-05-nvidia-h200-time-quant-"
           "mv1-all.txt", variants=ONE_LAUNCH),
    Prefer(("quant_matmul",), "triton", When(vendors=("nvidia",), regimes=(ONE_ROW,)),
           "Triton's word matvec beats hip's three-launch matvecs at M = 1 on every type; "
           + R + "2026-12-01-nvidia-h200-quant.md"),
    Prefer(("quant_matmul", "moe_experts"), "triton",
           When(vendors=("nvidia",), regimes=(PREFILL,), qtypes=BLOCK_QUANTS),
           "Triton's dequant GEMMs (64-weight steps) beat hip's int8 tiles 3-6x at M = 512; "
           + R + "2026-12-01-nvidia-h200-sweep-triton-kquant-gemm.txt", path="dequant"),
    Prefer(("q4_0_matmul", "moe_experts"), "triton",
           When(families=("Hopper",), regimes=(PREFILL,), dtypes=HALF, qtypes=("Q4_0",)),
           "Triton's 64-weight-step Q4_0 GEMMs beat hip's int8 experts 1.7x and its dense tiles "
           "2.7-3x at M = 512; " + R + "2026-12-04-nvidia-h200-sweep-moe-q4_0-prefill.txt",
           path="dequant"),
)

one, small, pre = When(regimes=(ONE_ROW,)), When(regimes=(ONE_ROW, SMALL)), When()
KERNELS: dict[tuple[str, str], tuple[Kernel, ...]] = {
    ("quant_matmul", "hip"): (
        Kernel("mv1", When(regimes=(ONE_ROW,), qtypes=ONE_LAUNCH_TYPES),
               "one launch: x quantized in every block (or given), y in x's dtype; its staging "
               "an option (STAGING)", all_of(k_range("K", 256, SLICED_MAX_K), aligned)),
        Kernel("vec", When(regimes=(ONE_ROW,), qtypes=K_QUANTS),
               "eight lanes a super-block, 16-byte loads (three launches)", aligned),
        Kernel("lanes", When(regimes=(ONE_ROW, SMALL), qtypes=BLOCK_QUANTS),
               "a 32-thread group a row (three launches)"),
        Kernel("tiled", When(regimes=(SMALL,), qtypes=BLOCK_QUANTS),
               "regions of 32 super-blocks through LDS, K split across groups",
               all_of(aligned, whole_pieces, tiled_k)),
        Kernel("gemm", When(regimes=(PREFILL,), qtypes=BLOCK_QUANTS),
               "dp4a-tiled GEMM, 64x64 output tiles"),
    ),
    ("quant_matmul", "triton"): (
        Kernel("words", When(paths=("int8",)), "a unit of a row a thread, rows read as 32-bit "
               "words", words_fit),
        Kernel("tiles", When(paths=("int8",)), "blocks of rows by blocks of super-blocks"),
        Kernel("gemm", When(paths=("dequant",)), "weights dequantized in the tile, tl.dot"),
    ),
    ("q4_0_matmul", "hip"): (
        Kernel("fused", small, "region matvec writing y in x's dtype (one launch at M = 1, "
               "K <= 2048: x quantized in the blocks)", q4_0_region),
        Kernel("matvec", small, "LDS-staged int8-dot matvec after quantize_q8_1", q4_0_words),
        Kernel("gemm", pre, "dp4a-tiled GEMM"),
    ),
    ("moe_experts", "hip"): (
        Kernel("decode", When(regimes=(ONE_ROW, SMALL)), "one (token, slot) a block, Q4_0 or "
               "dense banks, h in LDS", all_of(banks_q4_0_or_dense, experts_decode)),
        Kernel("gemm", When(), "grouped GEMM over moe_align's blocks (Q4_0 or dense banks)",
               banks_q4_0_or_dense),
        Kernel("vec", When(regimes=(ONE_ROW, SMALL), qtypes=K_QUANTS), "K-quant banks, 16-byte "
               "pieces (two launches)", all_of(experts_decode, experts_vec)),
        Kernel("lanes", When(qtypes=(*BLOCK_QUANTS, "Q4_0")), "quantized banks, a 32-thread "
               "group a row (four launches)", banks_block_quants),
    ),
    ("decode_attention", "hip"): (
        Kernel("tiles", When(dtypes=HALF), "one launch, key tiles through LDS, splits merged by "
               "the last block in a fixed order", attention_tiles),
        Kernel("split", When(), "split-K partials, then a merge launch", attention_split),
    ),
    ("gated_delta_rule", "hip"): (
        Kernel("chunk", When(dtypes=(torch.bfloat16,)), "chunks of 64 on the matrix cores (two "
               "launches)", all_of(delta_rule_chunks, hip_delta_rule_grid)),
        Kernel("scan", When(), "token by token, the state in registers"),
    ),
    ("gated_delta_rule", "triton"): (
        Kernel("chunk64", When(needs=("!rdna",)), "chunks of 64: WY factors, the state kept in "
               "registers across chunks", delta_rule_chunks),
        Kernel("chunk", When(), "the general chunked form (chunks of 16, 32 or 64)"),
    ),
}

DEFAULTS: dict[tuple[str, str], tuple[Default, ...]] = {
    ("quant_matmul", "triton"): (
        Default("words", "2.6-7x the tiles at M = 1, 3-9x at M = 8; " + R + "2026-12-01-nvidia-"
                "h200-sweep-triton-quant-matvec.txt"),
        Default("tiles", "where the rows are not whole words"),
        Default("gemm", "its dequant path"),
    ),
    ("quant_matmul", "hip"): (
        Default("mv1", "one launch where vec is three; 88% / 83% / 83% of copy on the lm_head "
                "(Q4_K "
                "/ Q5_K / Q6_K): " + R + "2026-12-05-nvidia-h200-time-quant-mv1-all.txt",
                When(qtypes=K_QUANTS)),
        Default("vec", "1.1-1.3x lanes on every K-quant at M = 1; " + R + "2026-12-02-nvidia-"
                "h200-quant-mv1-vec-final.txt", When(qtypes=K_QUANTS, regimes=(ONE_ROW,))),
        Default("lanes", "faster than tiled at M = 1 on every type (lm_head 1.3-1.9x); " + R
                + "2026-12-01-nvidia-h200-sweep-hip-quant-matvec-m1.txt", one),
        Default("tiled", "1.5-2.2x lanes at M = 8; " + R + "2026-12-01-nvidia-h200-sweep-hip-"
                "quant-matvec.txt", When(regimes=(SMALL,))),
        Default("lanes", "where the tiled matvec cannot read the weights", When(regimes=(SMALL,))),
        Default("gemm", "its one prefill kernel"),
    ),
    ("q4_0_matmul", "hip"): (
        Default("fused", "the region matvec: " + R + "2026-12-02-nvidia-h200-matvec-fused-q8."
                "txt"),
        Default("matvec", "where the region matvec cannot take the rows"),
        Default("gemm", "its prefill kernel, and where neither matvec takes the call"),
    ),
    ("moe_experts", "hip"): (
        Default("decode", "the decode kernels: " + R + "2026-12-03-nvidia-h200-experts-linear-"
                "regions.txt"),
        Default("vec", "two launches where lanes is four: " + R + "2026-12-04-nvidia-h200-gpu-"
                "tests-kquant-vec.txt"),
        Default("gemm", "the grouped GEMM past decode: " + R + "2026-12-04-nvidia-h200-moe-mma-"
                "ks64-landed.md"),
        Default("lanes", "any T for quantized banks other than two Q4_0 ones"),
    ),
    ("decode_attention", "hip"): (
        Default("tiles", "one launch, deterministic: " + R + "2026-12-03-nvidia-h200-decode-"
                "attention-row-groups.txt"),
        Default("split", "the shapes the one-launch kernel does not take"),
    ),
    ("gated_delta_rule", "hip"): (
        Default("chunk", "1.5-1.7x the token scan: " + R + "2026-12-05-nvidia-h200-deltanet-"
                "chains.md"),
        Default("scan", "what the chunks do not take"),
    ),
    ("gated_delta_rule", "triton"): (
        Default("chunk64", "the state kept in registers: " + R + "2026-12-03-nvidia-h200-"
                "deltanet.md"),
        Default("chunk", "RDNA (its chunk-64 tiles spill there) and other chunk sizes"),
    ),
}


#: what each value of a kernel's option takes, asked for by name or by default:
#: (op, backend, variant, value) -> its limit
OPTION_LIMITS: dict[tuple[str, str, str, str], Limit] = {
    ("quant_matmul", "hip", "mv1", "held"): k_range("K", 256, FUSED_MAX_K),
    ("quant_matmul", "hip", "mv1", "staged"):
        all_of(k_range("K", 256, STAGED_MAX_K), row_pieces, not_q8_0),
    ("quant_matmul", "hip", "mv1", "sliced"): k_range("K", 256, SLICED_MAX_K),
    ("quant_matmul", "hip", "mv1", "sliced_q8"): k_range("K", 256, SLICED_MAX_K),
}
#: the options of a kernel variant: (op, backend, variant) -> (option name, its default values in
#: order: the first whose conditions hold and whose limit passes)
OPTIONS: dict[tuple[str, str, str], tuple[str, tuple[Option, ...]]] = {
    ("quant_matmul", "hip", "mv1"): ("staging", (
        Option("staged", "83% of copy against held's 59% on the Q6_K lm_head: " + R + "2026-12-04-"
               "nvidia-h200-time-quant-mv1-staged.txt",
               When(qtypes=("Q6_K",), needs=("async_copies",))),
        Option("held", "activations and the next row held in registers: " + R + "2026-12-04-"
               "nvidia-h200-time-quant-mv1-fused.txt"),
        Option("sliced_q8", "past held's K: 2.0x vec, 1.1-1.7x Triton at K = 14336: " + R
               + "2026-12-"
               "05-nvidia-h200-time-quant-mv1-all.txt"),
    )),
}
# fmt: on
#: which kernel variants take ``precision="bf16"`` (bf16 operands, fp32 sums) by backend
BF16_OPERANDS = {
    ("gated_delta_rule", "hip"): ("chunk",),
    ("gated_delta_rule", "triton"): ("chunk64",),
}

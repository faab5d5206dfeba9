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

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ftlab.backends.registry import DECODE_MAX_TOKENS
from ftlab.platform import Platform

ONE_ROW, SMALL, PREFILL = "one row", "small batch", "prefill"
REGIMES = (ONE_ROW, SMALL, PREFILL)
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
BLOCK_QUANTS = ("Q8_0", *K_QUANTS)
HALF = (torch.float16, torch.bfloat16)


def regime(rows: int) -> str:
    """The regime of a call on ``rows`` rows (tokens) of activations."""
    if rows <= 1:
        return ONE_ROW
    return SMALL if rows <= DECODE_MAX_TOKENS else PREFILL


class Call(NamedTuple):
    """What the planner reads of a call -- never the tensors, so that ``ftlab ops NAME --explain``
    plans a call nobody makes. ``dims``: the op's sizes in the order of its spec's ``shape``
    (``quant_matmul``: M, K, N); ``qtype``: the weight's quant type (``moe_experts``: the gate/up
    bank's, ``qtype_down`` the down bank's), None for dense weights; ``align``: the byte alignment
    (1, 2, 4, 8 or 16) the operands' addresses share, and ``contiguous`` whether the weights'
    bytes are; ``rows16``: each weight row a whole number of 16-byte pieces, ``bytes16``: all of
    them together; ``chunk``,
    ``precision``: the gated delta rule's."""

    device: str = "cpu"
    index: int | None = None
    dtype: torch.dtype | None = None
    dims: tuple[int, ...] = ()
    qtype: str | None = None
    qtype_down: str | None = None
    align: int = 16
    contiguous: bool = True
    rows16: bool = True
    bytes16: bool = True
    chunk: int = 0
    precision: str = "fp32"

    @property
    def qtypes(self) -> tuple[str, ...]:
        """The weights' quant types (one, or gate/up and down), empty for dense weights."""
        return tuple(q for q in (self.qtype, self.qtype_down) if q is not None)


Sizes = dict[str, int]
Limit = Callable[[Call, Sizes, Platform], "str | None"]


@dataclass(frozen=True)
class When:
    """Conditions of a table row (None: any). ``qtypes`` holds when every weight of the call is
    of one of them (dense weights never match); ``needs`` names :class:`~ftlab.platform.Platform`
    facts that must be true (``"async_copies"``, ``"rdna"``), ``"!fact"`` one that must not;
    ``paths``: the quantized-weight paths (a kernel's)."""

    vendors: tuple[str, ...] | None = None
    families: tuple[str, ...] | None = None
    regimes: tuple[str, ...] | None = None
    dtypes: tuple[torch.dtype, ...] | None = None
    qtypes: tuple[str, ...] | None = None
    needs: tuple[str, ...] = ()
    paths: tuple[str, ...] | None = None

    def miss(self, call: Call, plat: Platform, where: str, path: str | None = None) -> str | None:
        """Why this does not hold for ``call`` on ``plat`` in regime ``where`` on ``path`` (None:
        it holds)."""
        if self.paths is not None and path not in self.paths:
            return f"not on the {path} path (only {'/'.join(self.paths)})"
        if self.vendors is not None and plat.vendor not in self.vendors:
            return f"not on {plat.vendor or 'the CPU'} (only {'/'.join(self.vendors)})"
        if self.families is not None and plat.family not in self.families:
            return f"not on {plat.family or plat.kind} (only {'/'.join(self.families)})"
        if self.regimes is not None and where not in self.regimes:
            return f"not for {where} (only {' / '.join(self.regimes)})"
        if self.dtypes is not None and call.dtype not in self.dtypes:
            names = "/".join(str(d).removeprefix("torch.") for d in self.dtypes)
            return f"not for {str(call.dtype).removeprefix('torch.')} (only {names})"
        if self.qtypes is not None:
            have = call.qtypes
            if not have or any(q not in self.qtypes for q in have):
                return f"not for {'/'.join(have) or 'dense'} weights (only {'/'.join(self.qtypes)})"
        for fact in self.needs:
            want = not fact.startswith("!")
            if getattr(plat, fact.lstrip("!")) != want:
                return f"{'needs' if want else 'not where'} {fact.lstrip('!')}"
        return None


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


def need(ok: bool, why: str) -> str | None:
    return None if ok else why


def aligned(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    return need(call.align >= 16 and call.contiguous, "weights not contiguous and 16-byte aligned")


def all_of(*limits: Limit) -> Limit:
    """A limit that holds where each of ``limits`` does (the first failure's reason)."""

    def check(call: Call, sizes: Sizes, plat: Platform) -> str | None:
        for limit in limits:
            why = limit(call, sizes, plat)
            if why is not None:
                return why
        return None

    return check


def k_range(dim: str, multiple: int, most: int) -> Limit:
    """``dim`` a multiple of ``multiple`` in (0, ``most``]."""

    def check(call: Call, sizes: Sizes, plat: Platform) -> str | None:
        k = sizes[dim]
        return need(0 < k <= most and k % multiple == 0, f"{dim} = {k} is not a multiple of "
                    f"{multiple} in (0, {most}]")  # fmt: skip

    return check


def row_pieces(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    return need(call.rows16, "weight rows are not whole 16-byte pieces")


def whole_pieces(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    return need(call.bytes16, "the weights' bytes are not whole 16-byte pieces")


# -------------------------------------------------------------- kernel facts (their buffers)

#: the hip one-row matvecs of quant_matmul: K they take (the fused one's activation records in
#: LDS, a staged row in an LDS slot, a block's eight slices), K of a tiled super-block by type
FUSED_MAX_K, STAGED_MAX_K, SLICED_MAX_K = 8192, 2048, 16384
TILED_SUPER_K = {"Q8_0": 128, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
#: the weight types of hip's one-launch one-row kernels (Q4_0 and Q8_0 in groups of 8 blocks)
ONE_LAUNCH_TYPES = (*K_QUANTS, "Q4_0", "Q8_0")
#: hip's one-row matvec of one launch ("mv1") and its staging policies (csrc OneRow): rows held in
#: registers, copied into an LDS ring, or a long row's slices held by a block's lane groups (x
#: quantized in every block, or given quantized by its own launch: sliced_q8)
ONE_LAUNCH = ("mv1",)
STAGINGS = ("held", "staged", "sliced", "sliced_q8")
#: hip's Q4_0 region matvec: rows it takes, LDS for its activation records, K of its unit
Q4_0_FUSED_MAX_M, Q4_0_FUSED_X_BYTES, Q4_0_SUPER_K = 4, 28 * 1024, 256
#: hip's experts: H and k * I its decode kernels stage in LDS, slots a token (router lanes)
EXPERTS_DECODE_FLOATS, EXPERTS_MAX_TOP_K = 8192, 32
#: hip's decode attention: query heads a key head and head dims it takes; the one-launch kernel's
ATTENTION_MAX_GROUP, ATTENTION_MAX_HEAD_DIM, ATTENTION_TILE_HEAD_DIMS = 8, 256, (128, 256)
#: the chunked delta-rule kernels: tokens a chunk and the key head size they take
DELTANET_CHUNK, DELTANET_MAX_DK = 64, 128


def words_fit(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    """Triton's word matvec reads rows as 32-bit words of the units it takes."""
    n, k = sizes["N"], sizes["K"]
    if call.qtype == "Q8_0":
        return need((k // 32) % 2 == 0, f"an odd number of Q8_0 blocks a row (K = {k})")
    if call.qtype == "Q6_K":
        return need(n * (k // 256) * 210 % 4 == 0, "the Q6_K rows are not whole 32-bit words")
    return None


def tiled_k(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    k, unit = sizes["K"], TILED_SUPER_K.get(call.qtype or "", 256)
    return need(k % unit == 0, f"K = {k} is not a multiple of its super-block's {unit}")


def q4_0_region(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    m, k = sizes["M"], sizes["K"]
    if not 1 <= m <= Q4_0_FUSED_MAX_M:
        return f"M = {m} rows (it takes 1..{Q4_0_FUSED_MAX_M})"
    if k % Q4_0_SUPER_K or call.align < 16:
        return f"K = {k} not a multiple of {Q4_0_SUPER_K}, or weights not 16-byte aligned"
    return need(m * (k // Q4_0_SUPER_K) * 84 * 4 <= Q4_0_FUSED_X_BYTES, "M x K past its LDS")


def q4_0_words(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    ok = sizes["M"] <= DECODE_MAX_TOKENS and (sizes["K"] // 32) % 2 == 0 and call.align >= 4
    return need(ok, "needs M <= 8, an even number of blocks a row and 4-byte aligned weights")


def banks_q4_0_or_dense(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    q = call.qtypes
    return need(not q or q == ("Q4_0", "Q4_0"), "takes two Q4_0 banks or two dense ones")


def banks_block_quants(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    q = call.qtypes
    return need(len(q) == 2 and q != ("Q4_0", "Q4_0"), "takes quantized banks, not two Q4_0 ones")


def experts_decode(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    h, i, top_k = sizes["H"], sizes["I"], sizes["top_k"]
    ok = h <= EXPERTS_DECODE_FLOATS and top_k * i <= EXPERTS_DECODE_FLOATS and top_k <= 32
    return need(ok, f"H and top_k * I must fit {EXPERTS_DECODE_FLOATS} floats of LDS, top_k <= 32")


def experts_vec(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    ok = sizes["H"] % 256 == 0 and sizes["I"] % 256 == 0 and sizes["top_k"] >= 1
    return need(ok, "H and I must be multiples of 256") or aligned(call, sizes, plat)


def attention_split(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    g, d = sizes["H"] // max(1, sizes["KVH"]), sizes["D"]
    ok = g <= ATTENTION_MAX_GROUP and d <= ATTENTION_MAX_HEAD_DIM
    return need(ok, f"{g} query heads a key head and head dim {d} (at most "
                f"{ATTENTION_MAX_GROUP} and {ATTENTION_MAX_HEAD_DIM})")  # fmt: skip


def attention_tiles(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    d = sizes["D"]
    if d not in ATTENTION_TILE_HEAD_DIMS:
        return f"head dim {d} (it takes {' or '.join(map(str, ATTENTION_TILE_HEAD_DIMS))})"
    return attention_split(call, sizes, plat) or need(
        call.align >= 16, "q, k, v not 16-byte aligned with strides of whole 16-byte pieces"
    )


def delta_rule_chunks(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    if call.chunk != DELTANET_CHUNK:
        return f"chunk_size {call.chunk} (it takes {DELTANET_CHUNK})"
    return need(sizes["Dk"] <= DELTANET_MAX_DK, f"Dk = {sizes['Dk']} > {DELTANET_MAX_DK}")


def hip_delta_rule_grid(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    b, hk, hv, dv = sizes["B"], sizes["Hk"], sizes["Hv"], sizes["Dv"]
    ok = b * hk * -(-hv // hk // 4) <= 65535 and -(-dv // 32) <= 65535 and hv * dv < 2**25
    return need(ok, "B * Hk * ceil(Hv / Hk / 4) and ceil(Dv / 32) must be <= 65535 and Hv * Dv < "
                f"2^25 (its grids, its 32-bit offsets), got B={b}, Hk={hk}, Hv={hv}, Dv={dv}")  # fmt: skip


# ---------------------------------------------------------------------------------- tables

R = "benchmarks/results/"
PREFER: tuple[Prefer, ...] = (
    Prefer(("quant_matmul",), "hip", When(vendors=("nvidia",), regimes=(ONE_ROW,), qtypes=K_QUANTS),
           "hip's one-launch one-row matvecs: 88% / 83% / 83% of copy (Q4_K / Q5_K / Q6_K) on the "
           "lm_head against Triton's 74% / 62% / 74%; " + R + "2026-12-05-nvidia-h200-time-quant-"
           "mv1-all.txt", variants=ONE_LAUNCH),  # fmt: skip
    Prefer(("quant_matmul",), "triton", When(vendors=("nvidia",), regimes=(ONE_ROW,)),
           "Triton's word matvec beats hip's three-launch matvecs at M = 1 on every type; "
           + R + "2026-12-01-nvidia-h200-quant.md"),  # fmt: skip
    Prefer(("quant_matmul", "moe_experts"), "triton",
           When(vendors=("nvidia",), regimes=(PREFILL,), qtypes=BLOCK_QUANTS),
           "Triton's dequant GEMMs (64-weight steps) beat hip's int8 tiles 3-6x at M = 512; "
           + R + "2026-12-01-nvidia-h200-sweep-triton-kquant-gemm.txt", path="dequant"),  # fmt: skip
    Prefer(("q4_0_matmul", "moe_experts"), "triton",
           When(families=("Hopper",), regimes=(PREFILL,), dtypes=HALF, qtypes=("Q4_0",)),
           "Triton's 64-weight-step Q4_0 GEMMs beat hip's int8 experts 1.7x and its dense tiles "
           "2.7-3x at M = 512; " + R + "2026-12-04-nvidia-h200-sweep-moe-q4_0-prefill.txt",
           path="dequant"),  # fmt: skip
)

one, small, pre = When(regimes=(ONE_ROW,)), When(regimes=(ONE_ROW, SMALL)), When()
KERNELS: dict[tuple[str, str], tuple[Kernel, ...]] = {
    ("quant_matmul", "hip"): (
        Kernel("mv1", When(regimes=(ONE_ROW,), qtypes=ONE_LAUNCH_TYPES),
               "one launch: x quantized in every block (or given), y in x's dtype; its staging "
               "an option (STAGING)", all_of(k_range("K", 256, SLICED_MAX_K), aligned)),  # fmt: skip
        Kernel("vec", When(regimes=(ONE_ROW,), qtypes=K_QUANTS),
               "eight lanes a super-block, 16-byte loads (three launches)", aligned),
        Kernel("lanes", When(regimes=(ONE_ROW, SMALL), qtypes=BLOCK_QUANTS),
               "a 32-thread group a row (three launches)"),
        Kernel("tiled", When(regimes=(SMALL,), qtypes=BLOCK_QUANTS),
               "regions of 32 super-blocks through LDS, K split across groups",
               all_of(aligned, whole_pieces, tiled_k)),  # fmt: skip
        Kernel("gemm", When(regimes=(PREFILL,), qtypes=BLOCK_QUANTS), "dp4a-tiled GEMM, 64x64 output tiles"),
    ),
    ("quant_matmul", "triton"): (
        Kernel("words", When(paths=("int8",)), "a unit of a row a thread, rows read as 32-bit "
               "words", words_fit),  # fmt: skip
        Kernel("tiles", When(paths=("int8",)), "blocks of rows by blocks of super-blocks"),
        Kernel("gemm", When(paths=("dequant",)), "weights dequantized in the tile, tl.dot"),
    ),
    ("q4_0_matmul", "hip"): (
        Kernel("fused", small, "region matvec writing y in x's dtype (one launch at M = 1, "
               "K <= 2048: x quantized in the blocks)", q4_0_region),  # fmt: skip
        Kernel("matvec", small, "LDS-staged int8-dot matvec after quantize_q8_1", q4_0_words),
        Kernel("gemm", pre, "dp4a-tiled GEMM"),
    ),
    ("moe_experts", "hip"): (
        Kernel("decode", When(regimes=(ONE_ROW, SMALL)), "one (token, slot) a block, Q4_0 or "
               "dense banks, h in LDS", all_of(banks_q4_0_or_dense, experts_decode)),  # fmt: skip
        Kernel("gemm", When(), "grouped GEMM over moe_align's blocks (Q4_0 or dense banks)",
               banks_q4_0_or_dense),  # fmt: skip
        Kernel("vec", When(regimes=(ONE_ROW, SMALL), qtypes=K_QUANTS), "K-quant banks, 16-byte "
               "pieces (two launches)", all_of(experts_decode, experts_vec)),  # fmt: skip
        Kernel("lanes", When(qtypes=(*BLOCK_QUANTS, "Q4_0")), "quantized banks, a 32-thread "
               "group a row (four launches)", banks_block_quants),  # fmt: skip
    ),
    ("decode_attention", "hip"): (
        Kernel("tiles", When(dtypes=HALF), "one launch, key tiles through LDS, splits merged by "
               "the last block in a fixed order", attention_tiles),  # fmt: skip
        Kernel("split", When(), "split-K partials, then a merge launch", attention_split),
    ),
    ("gated_delta_rule", "hip"): (
        Kernel("chunk", When(dtypes=(torch.bfloat16,)), "chunks of 64 on the matrix cores (two "
               "launches)", all_of(delta_rule_chunks, hip_delta_rule_grid)),  # fmt: skip
        Kernel("scan", When(), "token by token, the state in registers"),
    ),
    ("gated_delta_rule", "triton"): (
        Kernel("chunk64", When(needs=("!rdna",)), "chunks of 64: WY factors, the state kept in "
               "registers across chunks", delta_rule_chunks),  # fmt: skip
        Kernel("chunk", When(), "the general chunked form (chunks of 16, 32 or 64)"),
    ),
}

DEFAULTS: dict[tuple[str, str], tuple[Default, ...]] = {
    ("quant_matmul", "triton"): (
        Default("words", "2.6-7x the tiles at M = 1, 3-9x at M = 8; " + R + "2026-12-01-nvidia-"
                "h200-sweep-triton-quant-matvec.txt"),  # fmt: skip
        Default("tiles", "where the rows are not whole words"),
        Default("gemm", "its dequant path"),
    ),
    ("quant_matmul", "hip"): (
        Default("mv1", "one launch where vec is three; 88% / 83% / 83% of copy on the lm_head (Q4_K "
                "/ Q5_K / Q6_K): " + R + "2026-12-05-nvidia-h200-time-quant-mv1-all.txt",
                When(qtypes=K_QUANTS)),  # fmt: skip
        Default("vec", "1.1-1.3x lanes on every K-quant at M = 1; " + R + "2026-12-02-nvidia-"
                "h200-quant-mv1-vec-final.txt", When(qtypes=K_QUANTS, regimes=(ONE_ROW,))),  # fmt: skip
        Default("lanes", "faster than tiled at M = 1 on every type (lm_head 1.3-1.9x); " + R
                + "2026-12-01-nvidia-h200-sweep-hip-quant-matvec-m1.txt", one),  # fmt: skip
        Default("tiled", "1.5-2.2x lanes at M = 8; " + R + "2026-12-01-nvidia-h200-sweep-hip-"
                "quant-matvec.txt", When(regimes=(SMALL,))),  # fmt: skip
        Default("lanes", "where the tiled matvec cannot read the weights", When(regimes=(SMALL,))),
        Default("gemm", "its one prefill kernel"),
    ),
    ("q4_0_matmul", "hip"): (
        Default("fused", "the region matvec: " + R + "2026-12-02-nvidia-h200-matvec-fused-q8."
                "txt"),  # fmt: skip
        Default("matvec", "where the region matvec cannot take the rows"),
        Default("gemm", "its prefill kernel, and where neither matvec takes the call"),
    ),
    ("moe_experts", "hip"): (
        Default("decode", "the decode kernels: " + R + "2026-12-03-nvidia-h200-experts-linear-"
                "regions.txt"),  # fmt: skip
        Default("vec", "two launches where lanes is four: " + R + "2026-12-04-nvidia-h200-gpu-"
                "tests-kquant-vec.txt"),  # fmt: skip
        Default("gemm", "the grouped GEMM past decode: " + R + "2026-12-04-nvidia-h200-moe-mma-"
                "ks64-landed.md"),  # fmt: skip
        Default("lanes", "any T for quantized banks other than two Q4_0 ones"),
    ),
    ("decode_attention", "hip"): (
        Default("tiles", "one launch, deterministic: " + R + "2026-12-03-nvidia-h200-decode-"
                "attention-row-groups.txt"),  # fmt: skip
        Default("split", "the shapes the one-launch kernel does not take"),
    ),
    ("gated_delta_rule", "hip"): (
        Default("chunk", "1.5-1.7x the token scan: " + R + "2026-12-05-nvidia-h200-deltanet-"
                "chains.md"),  # fmt: skip
        Default("scan", "what the chunks do not take"),
    ),
    ("gated_delta_rule", "triton"): (
        Default("chunk64", "the state kept in registers: " + R + "2026-12-03-nvidia-h200-"
                "deltanet.md"),  # fmt: skip
        Default("chunk", "RDNA (its chunk-64 tiles spill there) and other chunk sizes"),
    ),
}

def not_q8_0(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    return need(call.qtype != "Q8_0", "Q8_0 has no staged form")


#: what each value of a kernel's option takes, asked for by name or by default:
#: (op, backend, variant, value) -> its limit
OPTION_LIMITS: dict[tuple[str, str, str, str], Limit] = {
    ("quant_matmul", "hip", "mv1", "held"): k_range("K", 256, FUSED_MAX_K),
    ("quant_matmul", "hip", "mv1", "staged"): all_of(k_range("K", 256, STAGED_MAX_K), row_pieces, not_q8_0),
    ("quant_matmul", "hip", "mv1", "sliced"): k_range("K", 256, SLICED_MAX_K),
    ("quant_matmul", "hip", "mv1", "sliced_q8"): k_range("K", 256, SLICED_MAX_K),
}
#: the options of a kernel variant: (op, backend, variant) -> (option name, its default values in
#: order: the first whose conditions hold and whose limit passes)
OPTIONS: dict[tuple[str, str, str], tuple[str, tuple[Option, ...]]] = {
    ("quant_matmul", "hip", "mv1"): ("staging", (
        Option("staged", "83% of copy against held's 59% on the Q6_K lm_head: " + R + "2026-12-04-"
               "nvidia-h200-time-quant-mv1-staged.txt", When(qtypes=("Q6_K",), needs=("async_copies",))),
        Option("held", "activations and the next row held in registers: " + R + "2026-12-04-"
               "nvidia-h200-time-quant-mv1-fused.txt"),
        Option("sliced_q8", "past held's K: 2.0x vec, 1.1-1.7x Triton at K = 14336: " + R + "2026-12-"
               "05-nvidia-h200-time-quant-mv1-all.txt"),
    )),
}  # fmt: skip
#: which kernel variants take ``precision="bf16"`` (bf16 operands, fp32 sums) by backend
BF16_OPERANDS = {("gated_delta_rule", "hip"): ("chunk",), ("gated_delta_rule", "triton"): ("chunk64",)}

"""What each kernel takes: the limits of its buffers and loads (``Limit``: why a kernel cannot
take a call's sizes or layout, or None), and the kernel facts they read -- the planner's tables
(:mod:`ftlab.backends.rules`) name them, the backends import the facts from here."""

from __future__ import annotations

from ftlab.backends.calls import K_QUANTS, Call, Limit, Sizes
from ftlab.backends.registry import DECODE_MAX_TOKENS
from ftlab.platform import Platform


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
        return need(
            0 < k <= most and k % multiple == 0,
            f"{dim} = {k} is not a multiple of {multiple} in (0, {most}]",
        )

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
    return need(
        ok,
        f"{g} query heads a key head and head dim {d} (at most "
        f"{ATTENTION_MAX_GROUP} and {ATTENTION_MAX_HEAD_DIM})",
    )


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
    return need(
        ok,
        "B * Hk * ceil(Hv / Hk / 4) and ceil(Dv / 32) must be <= 65535 and Hv * Dv < "
        f"2^25 (its grids, its 32-bit offsets), got B={b}, Hk={hk}, Hv={hv}, Dv={dv}",
    )


def not_q8_0(call: Call, sizes: Sizes, plat: Platform) -> str | None:
    return need(call.qtype != "Q8_0", "Q8_0 has no staged form")

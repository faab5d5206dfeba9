"""The int8-dot matvecs of Q8_0 and the K-quants in Triton (decode: up to ``MATVEC_ROWS`` rows
of Q8_1 activations; docs/OPS.md section 11; reference: ``ftlab/reference/quant_matmul.py``),
used by ``quant_matmul``'s int8 path (``ftlab/triton/quant_matmul.py``): :func:`quant_matvec`
and the compile specs of its kernels.

Two kernels (the planner picks: ``ftlab.backends.rules``): ``"words"``, the unit-per-thread
kernel of ``ftlab/triton/quant_matmul_mvw.py`` where the rows are word-addressable (Q8_0: an even
number of blocks a row; Q6_K: a whole number of words in all), launched here; and ``"tiles"``, the
kernels of ``ftlab/triton/quant_matmul_mv_tiles.py``, for the rows it cannot read.
"""

from __future__ import annotations

import torch
import triton

from ftlab.platform import platform_from_arch
from ftlab.quant import Q8_1, QTYPES, QuantWeight
from ftlab.triton.q4_0_common import (
    interpreted,
    launch_table,
    sm_count,
    split_k,
    sum_splits,
)
from ftlab.triton.quant_matmul_mv_tiles import tiles_matvec, tiles_specs
from ftlab.triton.quant_matmul_mvw import (
    MVW_CONFIGS,
    QCODE,
    UNIT_MAJOR_BLOCK,
    kq_mvw_kernel,
    unit_major,
    unit_major_kernel,
)

#: rows one matvec pass takes (MP up to 8); more rows run pass by pass
MATVEC_ROWS = 8


def _asm(device: torch.device) -> bool:
    """PTX dp4a where the target's launch table enables it (NVIDIA), never in the interpreter."""
    return bool(launch_table(device).get("mv4", {}).get("asm", 0)) and not interpreted()


def words_fit(w: QuantWeight) -> bool:
    """Whether kq_mvw_kernel can read ``w``'s rows as 32-bit words of the units it takes."""
    n, k = w.shape
    if w.qtype == "Q8_0":
        return (k // 32) % 2 == 0
    if w.qtype == "Q6_K":
        return (n * QTYPES["Q6_K"].row_bytes(k)) % 4 == 0
    return True


def words_matvec(
    x8: Q8_1, w: QuantWeight, out_dtype: torch.dtype, cfg: dict | None = None
) -> torch.Tensor:
    """``quant_matvec`` by kq_mvw_kernel; ``cfg`` (a ``MVW_CONFIGS`` entry) overrides the table.
    One row whose K fits ``HOIST_U`` units (default ``BLOCK_U``) runs the persistent kernel; the
    others read the activations unit-major unless ``XT`` is 0."""
    m, k = x8.q.shape
    n = w.shape[0]
    nu = k // 64
    cfg = dict(cfg or MVW_CONFIGS[w.qtype]["m1" if m == 1 else "m8"])
    data = w.data if w.data.data_ptr() % 4 == 0 else w.data.clone()
    words = data.reshape(-1).view(torch.int32)
    asm = _asm(w.device)
    programs_n = triton.cdiv(n, cfg["BLOCK_N"])
    if m == 1 and triton.next_power_of_2(nu) <= cfg.get("HOIST_U", cfg["BLOCK_U"]):
        y = torch.empty((1, n), dtype=out_dtype, device=w.device)
        programs = min(programs_n, sm_count(w.device) * cfg.get("progs_per_sm", 8))
        kq_mvw_kernel[(programs, 1)](
            words,
            data.shape[-1],
            x8.q.view(torch.int32),
            x8.d,
            x8.s,
            y,
            m,
            n,
            k,
            nu,
            nu,
            QTYPE=QCODE[w.qtype],
            ASM=asm,
            MP=1,
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_U=triton.next_power_of_2(nu),
            HOIST=True,
            XT=False,
            num_warps=cfg["num_warps"],
        )
        return y
    xt = bool(cfg.get("XT", 1))
    q8w, d8, s8 = x8.q.view(torch.int32), x8.d, x8.s
    if xt:
        q8w, d8, s8 = unit_major(q8w, d8, s8, w.qtype)
    bu = cfg["BLOCK_U"]
    splits, u_per_split = split_k(nu, bu, programs_n, w.device)
    parts = torch.empty((splits, m, n), dtype=torch.float32, device=w.device)
    kq_mvw_kernel[(programs_n, splits)](
        words,
        data.shape[-1],
        q8w,
        d8,
        s8,
        parts,
        m,
        n,
        k,
        nu,
        u_per_split,
        QTYPE=QCODE[w.qtype],
        ASM=asm,
        MP=triton.next_power_of_2(m),
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_U=bu,
        HOIST=False,
        XT=xt,
        num_warps=cfg["num_warps"],
    )
    return sum_splits(parts, out_dtype)


def quant_matvec(x8: Q8_1, w: QuantWeight, out_dtype: torch.dtype, variant: str) -> torch.Tensor:
    """int8-dot ``[M <= 8, K] x [N, K] -> [M, N]`` by ``variant`` (``"words"``: rows of whole
    32-bit words, :func:`words_fit`; ``"tiles"``); split-K when N alone would leave SMs idle."""
    if variant == "words":
        if not words_fit(w):
            raise ValueError(
                f"the words matvec reads rows of whole 32-bit words; a {w.qtype} "
                f"weight of shape {tuple(w.shape)} has none"
            )
        return words_matvec(x8, w, out_dtype)
    return tiles_matvec(x8, w, out_dtype, _asm(w.device))


def matvec_specs(target: str) -> list:
    """The matvec configurations ftlab launches on ``target``, for ftlab.compile_check."""
    from ftlab.triton.compile_spec import spec

    asm = platform_from_arch(target).vendor == "nvidia"
    specs = tiles_specs(asm)
    for qtype, code in QCODE.items():
        specs.append(
            spec(
                unit_major_kernel,
                f"unit_major_kernel[{qtype}, {UNIT_MAJOR_BLOCK} units]",
                types={
                    "q8w_ptr": "*i32",
                    "d8_ptr": "*fp32",
                    "s8_ptr": "*fp32",
                    "oq_ptr": "*i32",
                    "od_ptr": "*fp32",
                    "os_ptr": "*fp32",
                },
                constexprs={"QTYPE": code, "BLOCK_U": UNIT_MAJOR_BLOCK},
            )
        )
    types = {"w32_ptr": "*i32", "q8w_ptr": "*i32", "d8_ptr": "*fp32", "s8_ptr": "*fp32"}
    for qtype, cfgs in MVW_CONFIGS.items():
        for mp, hoist, cfg in (
            (1, True, cfgs["m1"]),
            (1, False, cfgs["m1"]),
            (8, False, cfgs["m8"]),
        ):
            bu = cfg.get("HOIST_U", cfg["BLOCK_U"]) if hoist else cfg["BLOCK_U"]
            tile = f"{cfg['BLOCK_N']}x{bu} units"
            label = f"kq_mvw_kernel[{qtype}, M<={mp}{', hoisted' if hoist else ''}, {tile}]"
            specs.append(
                spec(
                    kq_mvw_kernel,
                    label,
                    types={**types, "out_ptr": "*bf16" if hoist else "*fp32"},
                    constexprs={
                        "QTYPE": QCODE[qtype],
                        "ASM": asm,
                        "MP": mp,
                        "BLOCK_N": cfg["BLOCK_N"],
                        "BLOCK_U": bu,
                        "HOIST": hoist,
                        "XT": not hoist,
                    },
                    num_warps=cfg["num_warps"],
                )
            )
    return specs

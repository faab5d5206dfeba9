"""Every HIP and Triton kernel compiles for every gfx target and sm_90 with no spills, no
scratch and LDS within the chip's limit (ftlab.compile_check; Triton in its own process)."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from ftlab import compile_check
from ftlab.platform import GFX_CHECK_TARGETS, SM_CHECK_TARGETS

HAS_CLANG = compile_check.clang() is not None
HAS_NVCC = compile_check.nvcc() is not None


@pytest.fixture(scope="module")
def triton_rows():
    pytest.importorskip("triton")
    return compile_check.triton_rows()


_HIP_ROWS: dict[tuple[str, str], list] = {}


def _hip_rows(source, target: str) -> list:
    """compile_check's rows of one device source on one target, compiled once a session (the
    per-target tests and the support-matrix check read the same compilations)."""
    key = (str(source), target)
    if key not in _HIP_ROWS:
        rows_of = (
            compile_check.hip_gfx_rows if target.startswith("gfx") else compile_check.hip_sm_rows
        )
        _HIP_ROWS[key] = rows_of(source, target)
    return _HIP_ROWS[key]


def _hip_rows_of(target: str) -> list[tuple]:
    """(source, rows) of every device source on ``target``, compiled side by side (one compiler
    process a core: each is single-threaded)."""
    sources = compile_check.device_sources()
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return list(
            zip(sources, pool.map(lambda source: _hip_rows(source, target), sources), strict=True)
        )


def _assert_clean(rows):
    bad = [f"{r.kernel} @ {r.target}: {r.problems}" for r in rows if not r.ok]
    assert not bad, "\n".join(bad)


@pytest.mark.skipif(
    not HAS_CLANG, reason="clang-19 not installed (make test installs it where apt is available)"
)
@pytest.mark.parametrize("gfx", GFX_CHECK_TARGETS)
def test_hip_gfx(gfx):
    for source, rows in _hip_rows_of(gfx):
        _assert_clean(rows)
        # every template configuration is instantiated (no code is emitted for the others)
        assert len(rows) == KERNELS[source.stem], [r.kernel for r in rows]
        assert all(r.vgpr and r.sgpr for r in rows)


# kernels per device source, every instantiation the launchers use
KERNELS = {
    "index_store": 30,  # 5 copy widths x 2 index types x 3 kernels
    "q4_0": 9,  # 3 dtypes x (quantize, dequantize, Q8_1)
    # 3 dtypes x (8 matvec widths + the fused one quantizing x (M = 1) + 4 fused widths given Q8_1),
    # 2 with the norm
    "q4_0_matvec": 41,
    "q4_0_gemm": 1,
    # 3 dtypes x 2 router widths, route_topk, router_topk and the norm + router; 2 align kernels
    "moe_route": 20,
    "moe": 12,  # 3 dtypes x (2 Q4_0 decode + 2 dense decode)
    "moe_regions": 12,  # 3 dtypes x 2 Q4_0 decode over regions x (linear, not)
    # 3 dtypes x 2 dense GEMMs on FMA tiles, 2 dtypes x 2 x 2 shapes on the matrix cores, 2 Q4_0
    "moe_gemm": 16,
    "handshake": 7,  # 3 dtypes x (pack, combine), the signal kernel
    "qk_norm_rope": 3,  # 3 dtypes
    # 3 dtypes x (decode step of 16 or 32 columns a block, with or without the gates; prefill scan)
    "gated_delta_rule": 15,
    # bf16: the chunked prefill's scan on the matrix cores, three planes or one
    "gated_delta_rule_chunk": 2,
    # bf16: the chunked prefill's prep (the solve, attn, the row factors), 3 or 1 planes
    "gated_delta_rule_chunk_prep": 2,
    "quants": 15,  # 3 dtypes x (dequantize Q8_0, Q4_K, Q5_K, Q6_K; quantize Q8_0)
    "conv1d": 18,  # 3 dtypes x 3 widths (2, 3, 4) x (prefill, decode step)
    "gated_norm": 12,  # 3 dtypes x 3 gate dtypes (gated_rmsnorm), 3 dtypes (output_gate)
    "norm": 18,  # 3 dtypes x 3 weight dtypes x (16-byte pieces, scalar) (add_rmsnorm)
    "attention": 15,  # 3 dtypes x ((16-byte, scalar) x (1, 2 columns) partial + combine)
    "attention_tiles": 8,  # 2 dtypes (fp16, bf16) x 2 head dims (128, 256) x 2 or 4 rows a thread
    # 5 bank types x 2 expert kernels; 3 dtypes x 3 K-quants x 2 "vec" decode kernels
    "moe_kquant": 28,
    # 4 types (Q8_0, Q4_K, Q5_K, Q6_K) x (8 matvec widths, the M = 1 matvec, the GEMM), and the
    # M = 1 "vec" matvec of the three K-quants
    "quant_matmul": 43,
    "quant_matmul_tiled": 32,  # 4 types x 8 tiled matvec widths
    # 3 dtypes x (4 types x (fused, staged, sliced x 2) + Q8_0 x (fused, sliced x 2)): one-row
    # matvecs
    "quant_matmul_mv1": 57,
}


def test_every_device_source_is_counted():
    assert sorted(s.stem for s in compile_check.device_sources()) == sorted(KERNELS)


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
@pytest.mark.parametrize("sm", SM_CHECK_TARGETS)
def test_hip_nvcc(sm):
    for source, rows in _hip_rows_of(sm):
        _assert_clean(rows)
        assert len(rows) == KERNELS[source.stem]


def test_triton_every_target(triton_rows):
    _assert_clean(triton_rows)
    import importlib

    expected = sum(
        len(importlib.import_module(m).compile_specs(t))
        for m in compile_check.triton_modules()
        for t in compile_check.TARGETS
    )
    assert len(triton_rows) == expected
    assert all(r.vgpr and r.vgpr > 0 for r in triton_rows)


def test_spills_fail_the_check():
    row = compile_check.Row("hip", "k", "gfx1100", vgpr=256, sgpr=100, spill=3, scratch=16)
    assert not row.ok and any("spilled" in p for p in row.problems)
    row = compile_check.Row("hip", "k", "gfx1201", vgpr=8, sgpr=8, lds=70000)
    assert not row.ok and any("LDS" in p for p in row.problems)


def test_bare_clang_sees_every_kernel_instantiated(tmp_path):
    """A kernel template without explicit instantiation emits no code: the check must notice."""
    if not HAS_CLANG:
        pytest.skip("clang-19 not installed")
    src = tmp_path / "lonely.hip"
    src.write_text('#include "port.h"\ntemplate <int N> __global__ void k(int* p) { p[0] = N; }\n')
    rows = compile_check.hip_gfx_rows(src, "gfx1100")
    assert len(rows) == 1 and rows[0].error == "no kernels were emitted"


@pytest.mark.skipif(not (HAS_CLANG and HAS_NVCC), reason="needs clang-19 and nvcc")
def test_cli_writes_support_matrix(tmp_path):
    """The CLI end to end on one target and one family (every target's rows are checked above)."""
    out = tmp_path / "matrix.md"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "ftlab",
            "compile-check",
            "--targets",
            "gfx1100",
            "--only",
            "index_store",
            "--write",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    text = out.read_text()
    assert "| index_store | hip |" in text and "| index_store | triton |" in text
    assert "| moe |" not in text, "--only keeps the other families out"
    assert "FAIL" not in text
    assert " 0 failed" in res.stdout


def test_toolchain_note_when_clang_missing(monkeypatch):
    monkeypatch.setattr(compile_check, "clang", lambda: None)
    rows, notes = compile_check.hip_rows(("gfx1100",))
    assert rows == [] and any("clang-19 not found" in n for n in notes)


@pytest.mark.skipif(not (HAS_CLANG and HAS_NVCC), reason="needs clang-19 and nvcc")
def test_committed_support_matrix_is_current(triton_rows):
    """docs/support-matrix.md is generated: its status table must match a fresh check."""
    from pathlib import Path

    from ftlab import support_matrix

    root = Path(__file__).resolve().parents[2]
    # compile_check.hip_rows()'s rows, in its order, from this session's compilations
    compiled = {t: dict(_hip_rows_of(t)) for t in compile_check.TARGETS}
    rows = [
        r
        for source in compile_check.device_sources()
        for t in compile_check.TARGETS
        for r in compiled[t][source]
    ]
    fresh = support_matrix.render(rows + triton_rows, [], root / "benchmarks" / "results")
    committed = (root / "docs" / "support-matrix.md").read_text()

    def status(text):
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("| kernels |"))
        return lines[start : lines.index("", start)]

    assert status(fresh) == status(committed), (
        "regenerate: ftlab compile-check --write docs/support-matrix.md"
    )

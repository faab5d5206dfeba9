"""The Triton int8 matvecs of quant_matmul (docs/OPS.md section 11) kernel by kernel: the
word-tiled kernel (``ftlab/triton/quant_matmul_mvw.py``) in each of its launch shapes (persistent
one-row, split-K, several activation rows, K over several tiles, Q6_K blocks at odd halfwords,
an unaligned weight buffer) and the tile kernels it replaced, each within
ftlab.testing.quant_matmul_tolerance of the int8 reference. CPU: the Triton interpreter."""

import pytest
import torch

import ftlab.triton.quant_matmul_mv as mv
from ftlab import backends
from ftlab.backends import calls
from ftlab.quant import QuantWeight
from ftlab.testing.quant_matmul import quant_matmul_tolerance, random_quant_weight
from ftlab.triton.q4_0 import quantize_q8_1

TYPES = ("Q8_0", "Q4_K", "Q5_K", "Q6_K")
#: (M, config): persistent one-row; one row, 2-unit tiles, two a split (unit-major activations);
#: 3 rows (activations as quantized)
LAUNCHES = [
    (1, None),
    (1, {"BLOCK_N": 2, "BLOCK_U": 2, "num_warps": 1}),
    (3, {"BLOCK_N": 4, "BLOCK_U": 4, "num_warps": 1, "XT": 0}),
]


def _check(y: torch.Tensor, x: torch.Tensor, w: QuantWeight) -> None:
    want, bound = quant_matmul_tolerance(x, w, "int8", y.dtype)
    err = (y.float() - want.float()).abs()
    assert bool((err <= bound).all()), f"max err / bound {float((err / bound).max())}"


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m, cfg", LAUNCHES)
def test_words_kernel_launches(qtype, m, cfg):
    n, k = 8, 512  # Q6_K: every row's block 1 starts at an odd halfword
    w = random_quant_weight(m + len(qtype), qtype, n, k)
    assert mv.words_fit(w)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 3
    _check(mv.words_matvec(quantize_q8_1(x), w, torch.float32, cfg), x, w)


def test_words_kernel_persistent_tiles():
    """The persistent one-row kernel with more row tiles than programs: 8 one-row tiles over 4
    programs (sm_count is 4 in the interpreter), two tiles a program, Q6_K rows at odd halfwords."""
    w = random_quant_weight(4, "Q6_K", 8, 512)
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(4)) * 3
    cfg = {"BLOCK_N": 1, "BLOCK_U": 32, "num_warps": 1, "progs_per_sm": 1}
    _check(mv.words_matvec(quantize_q8_1(x), w, torch.float32, cfg), x, w)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_words_kernel_unaligned_buffer_bf16_out(qtype):
    w = random_quant_weight(11, qtype, 4, 512)
    raw = torch.zeros(w.data.numel() + 2, dtype=torch.uint8)
    raw[2:] = w.data.reshape(-1)
    shifted = QuantWeight(raw[2:].view(w.data.shape), w.shape, qtype)
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(1))
    _check(mv.words_matvec(quantize_q8_1(x), shifted, torch.bfloat16), x, w)


@pytest.mark.parametrize(
    "qtype, n, k, fits",
    [
        ("Q8_0", 3, 96, False),
        ("Q8_0", 3, 128, True),
        ("Q6_K", 3, 256, False),
        ("Q6_K", 2, 256, True),
    ],
)
def test_variant_choice_and_tile_kernels(qtype, n, k, fits):
    """Rows the word kernel cannot address are refused by it and planned on the tile kernels;
    both variants agree with the reference wherever they run."""
    w = random_quant_weight(5, qtype, n, k)
    assert mv.words_fit(w) == fits
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(2))
    call = calls.matmul(x, w)
    assert backends.variant_for("quant_matmul", "triton", call, path="int8") == (
        "words" if fits else "tiles"
    )
    _check(mv.quant_matvec(quantize_q8_1(x), w, torch.float32, "tiles"), x, w)
    if fits:
        _check(mv.quant_matvec(quantize_q8_1(x), w, torch.float32, "words"), x, w)
    else:
        with pytest.raises(ValueError, match="whole 32-bit words"):
            mv.quant_matvec(quantize_q8_1(x), w, torch.float32, "words")


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 8])
def test_words_and_tiles_gpu(qtype, m):
    w = random_quant_weight(m, qtype, 3000, 2048).to("cuda")
    x = torch.randn(m, 2048, device="cuda")
    x8 = quantize_q8_1(x)
    for cfg in (
        None,
        {"BLOCK_N": 16, "BLOCK_U": 32, "num_warps": 8},
        {"BLOCK_N": 4, "BLOCK_U": 8, "num_warps": 2},
    ):
        _check(mv.words_matvec(x8, w, torch.float32, cfg), x, w)
    _check(mv.quant_matvec(x8, w, torch.float32, variant="tiles"), x, w)

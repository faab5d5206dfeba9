"""ftlab.bench.kquant_pack packs GGUF Q4_K / Q6_K blocks that gguf-py decodes as ftlab's
reference does, within half a step of the input (a step no wider than the sub-block's range
needs); benchmarks/write_random_qwen3moe.py --type Q4_K_M writes llama.cpp's Q4_K_M type mix."""

import importlib.util
import os
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from ftlab.bench import kquant_pack
from ftlab.bench.kquant_pack import pack_q4_k, pack_q6_k
from ftlab.bench.model_gguf import type_counts
from ftlab.formats.gguf import open_gguf
from ftlab.models.loader import DequantizedWarning, load_gguf
from ftlab.reference.quants import dequantize

gguf = pytest.importorskip("gguf")
ROOT = Path(__file__).resolve().parents[2]
WRITER = ROOT / "benchmarks" / "write_random_qwen3moe.py"
KINDS = ["gauss", "uniform", "positive", "negative", "sparse", "mixed"]


def values(kind: str, rows: int, blocks: int, exp: int, seed: int) -> torch.Tensor:
    """``[rows, blocks*256]`` fp32 rows of one kind, at scale 2**exp: Gaussian; uniform in
    [-1, 1), in [0.5, 1.5), in [-1.5, -0.5); Gaussian with 90% zeros; Gaussian with every
    sub-block of 16 at its own scale 2**-(0..15) (small 6-bit scales beside large ones)."""
    g = torch.Generator().manual_seed(seed)
    shape = (rows, blocks * 256)
    if kind == "uniform":
        x = torch.rand(shape, generator=g) * 2 - 1
    elif kind == "positive":
        x = torch.rand(shape, generator=g) + 0.5
    elif kind == "negative":
        x = -torch.rand(shape, generator=g) - 0.5
    else:
        x = torch.randn(shape, generator=g)
    if kind == "sparse":
        x = x * (torch.rand(shape, generator=g) < 0.1)
    if kind == "mixed":
        x = (
            x.view(rows, -1, 16) * 2.0 ** -torch.randint(0, 16, (rows, blocks * 16, 1), generator=g)
        ).view(shape)
    return x * 2.0**exp


def fp16_up_bound(v: torch.Tensor) -> torch.Tensor:
    """An upper bound of the smallest fp16 >= v (v >= 0 in fp16's range): one part in 2**10
    above v for a normal fp16, one subnormal step (2**-24) above it for a subnormal."""
    return v * (1 + 2.0**-10) + 2.0**-24


def q4_k_bound(x: torch.Tensor) -> torch.Tensor:
    """Per element of ``x [N, K]``, the largest |x - x_hat| the Q4_K packer may leave (module
    docstring of kquant_pack), from x alone. A sub-block's step d*sc_j is ceil'd from
    scale_j = (max - lo_j)/15 (lo_j = min(0, min)) so lies in [scale_j, scale_j + d]; the
    16 levels then span the sub-block but for the rounding of the min m_j to a multiple of
    dmin: error <= max(step, dmin)/2. d, dmin are max scale_j / 63, max -lo_j / 63 rounded up
    to fp16. Slack: fp32 rounding of the products and the sums, relative to their sizes."""
    sub = x.double().view(x.shape[0], -1, 8, 32)  # [N, super-blocks, 8, 32]
    lo = sub.amin(-1).clamp(max=0)
    scale = (sub.amax(-1) - lo) / 15
    d = fp16_up_bound(scale.amax(-1, keepdim=True) / 63)
    dmin = fp16_up_bound((-lo).amax(-1, keepdim=True) / 63)
    half = torch.maximum(scale + d, dmin.expand_as(scale)) / 2  # [N, S, 8]
    slack = 2.0**-18 * (sub.abs().amax(-1) + 16 * (scale + d) + 64 * dmin)
    return (half + slack)[..., None].expand_as(sub).reshape(x.shape)


def q6_k_bound(x: torch.Tensor) -> torch.Tensor:
    """As :func:`q4_k_bound` for Q6_K: step d*sc_j ceil'd from scale_j = max|x|/31, d = max
    scale_j / 127 rounded up to fp16; error <= step/2 <= (scale_j + d)/2."""
    sub = x.double().view(x.shape[0], -1, 16, 16)
    scale = sub.abs().amax(-1) / 31
    d = fp16_up_bound(scale.amax(-1, keepdim=True) / 127)
    slack = 2.0**-18 * (sub.abs().amax(-1) + 32 * (scale + d))
    return ((scale + d) / 2 + slack)[..., None].expand_as(sub).reshape(x.shape)


PACK = {"Q4_K": (pack_q4_k, q4_k_bound), "Q6_K": (pack_q6_k, q6_k_bound)}


def check_round_trip(x: torch.Tensor, qtype: str) -> None:
    pack, bound = PACK[qtype]
    w = pack(x)
    assert w.qtype == qtype and w.shape == x.shape and w.device == x.device
    back = dequantize(w.to("cpu"), torch.float32)
    want = gguf.quants.dequantize(w.data.cpu().numpy(), gguf.GGMLQuantizationType[qtype])
    assert np.array_equal(back.numpy().view(np.uint32), want.astype(np.float32).view(np.uint32))
    err = (back.double() - x.cpu().double()).abs()
    over = err > bound(x.cpu())
    assert not bool(over.any()), (
        f"{int(over.sum())} values beyond the bound, first at {tuple(over.nonzero()[0])}"
    )


@given(
    st.sampled_from(["Q4_K", "Q6_K"]),
    st.sampled_from(KINDS),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(-20, 12),
    st.integers(0, 2**31 - 1),
)
@example("Q4_K", "mixed", 3, 3, 0, 1)
@example("Q6_K", "mixed", 3, 3, -24, 2)  # subnormal fp16 scales
def test_round_trip_within_half_a_step(qtype, kind, rows, blocks, exp, seed):
    check_round_trip(values(kind, rows, blocks, exp, seed), qtype)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_round_trip_of_gaussian_rows_and_their_error(qtype):
    x = torch.randn(256, 2048, generator=torch.Generator().manual_seed(1)) * 2048**-0.5
    check_round_trip(x, qtype)
    back = dequantize(PACK[qtype][0](x), torch.float32)
    rel = float((back - x).pow(2).mean().sqrt() / x.pow(2).mean().sqrt())
    assert rel < {"Q4_K": 0.085, "Q6_K": 0.021}[qtype]  # llama.cpp's search: about 0.07 and 0.018


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize(
    "block",
    [
        torch.zeros(256),
        torch.full((256,), -3.0),
        torch.full((256,), 3.0),
        torch.eye(256)[7] * 1e4,
        torch.cat([torch.zeros(128), torch.randn(128)]),
        torch.linspace(-1, 1, 256).flip(0),
    ],
    ids=["zeros", "negative-constant", "positive-constant", "spike", "half-zeros", "ramp"],
)
def test_round_trip_of_edge_blocks(qtype, block):
    check_round_trip(block.view(1, 256), qtype)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_layout_of_a_bank_and_dtypes(qtype):
    pack = PACK[qtype][0]
    x = torch.randn(3, 4, 512, generator=torch.Generator().manual_seed(2))
    w = pack(x)
    nbytes = {"Q4_K": 144, "Q6_K": 210}[qtype]
    assert w.data.shape == (3, 4, 2 * nbytes) and w.data.dtype == torch.uint8
    assert torch.equal(w[1].data, pack(x[1]).data)  # rows are packed independently
    assert torch.equal(pack(x.to(torch.bfloat16)).data, pack(x.to(torch.bfloat16).float()).data)
    assert pack(torch.empty(0, 256)).data.shape == (0, nbytes)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_chunks_pack_as_one(qtype, monkeypatch):
    pack = PACK[qtype][0]
    x = values("mixed", 5, 3, 0, seed=4)  # 15 super-blocks
    whole = pack(x).data
    monkeypatch.setattr(kquant_pack, "CHUNK", 4)
    assert torch.equal(pack(x).data, whole)


@pytest.mark.parametrize("pack", [pack_q4_k, pack_q6_k])
def test_errors_name_the_argument(pack):
    with pytest.raises(
        ValueError,
        match=r"w must be \[\.\.\., N, K\] with K a multiple of 256 for Q._K, got shape \(2, 128\)",
    ):
        pack(torch.randn(2, 128))
    with pytest.raises(ValueError, match=r"got shape \(256,\)"):
        pack(torch.randn(256))
    with pytest.raises(
        TypeError, match="w must be one of float32, float16, bfloat16, got torch.int32"
    ):
        pack(torch.ones(2, 256, dtype=torch.int32))
    with pytest.raises(TypeError, match="w must be a torch.Tensor, got ndarray"):
        pack(np.ones((2, 256), dtype=np.float32))
    for bad in (float("nan"), float("-inf")):
        x = torch.randn(2, 512)
        x[1, 300] = bad
        with pytest.raises(
            ValueError, match=rf"w must be finite for Q._K, got {bad} at \(1, 300\)"
        ):
            pack(x)
    with pytest.raises(ValueError, match="w must fit Q._K's fp16 block scales"):
        pack(torch.full((1, 256), 3e38))


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_cuda_packs_the_bytes_of_the_cpu(qtype):
    pack = PACK[qtype][0]
    for kind in KINDS:
        x = values(kind, 64, 8, -6, seed=3)
        w = pack(x.cuda())
        assert w.device.type == "cuda"
        assert torch.equal(w.data.cpu(), pack(x).data)


def writer_module():
    spec = importlib.util.spec_from_file_location("write_random_qwen3moe", WRITER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_q4_k_m_mix_of_48_layers():
    """llama-quantize's Q4_K_M of the 48-layer model: Q6_K attn_v and ffn_down_exps in layers
    0-5, 8, 11, ..., 41 and 42-47, and output.weight; Q4_K the rest: 289 Q4_K, 49 Q6_K."""
    w = writer_module()
    more = [i for i in range(48) if w.use_more_bits(i, 48)]
    assert more == [*range(6), *range(8, 42, 3), *range(42, 48)]
    names = ["token_embd.weight", "output.weight"] + [
        f"blk.{i}.{t}.weight"
        for i in range(48)
        for t in (
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate_exps",
            "ffn_up_exps",
            "ffn_down_exps",
        )
    ]
    assert Counter(w.q4_k_m_type(n, 48) for n in names) == {"Q4_K": 289, "Q6_K": 49}


def test_writer_q4_k_m_file(tmp_path):
    """A 2-layer, 4-expert, 256-token file: the types of llama-quantize's Q4_K_M of a 2-layer
    qwen3moe (tests/data/llama_cpp), weights that load and decode to the writer's Gaussians."""
    out = tmp_path / "q4_k_m.gguf"
    cmd = [
        sys.executable,
        str(WRITER),
        str(out),
        "--type",
        "Q4_K_M",
        "--layers",
        "2",
        "--experts",
        "4",
        "--vocab",
        "256",
        "--device",
        "cpu",
    ]
    pythonpath = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    subprocess.run(
        cmd, check=True, cwd=ROOT, capture_output=True, env=os.environ | {"PYTHONPATH": pythonpath}
    )
    llama = {
        t.name: t.tensor_type.name
        for t in open_gguf(ROOT / "tests/data/llama_cpp/qwen3moe-q4_k_m.gguf").tensors
    }
    ours = {t.name: t.tensor_type.name for t in open_gguf(out).tensors}
    assert ours == llama
    assert {k: n for k, (n, _) in type_counts(out).items()} == {"Q4_K": 13, "F32": 11, "Q6_K": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("error", DequantizedWarning)  # every weight stays packed
        config, weights = load_gguf(
            out, device=torch.device("cpu"), dtype=torch.float32, progress=False
        )
    assert (config.num_hidden_layers, config.num_experts, config.vocab_size) == (2, 4, 256)
    assert weights.lm_head.qtype == "Q6_K" and weights.layers[1].v_proj.qtype == "Q6_K"
    # the embedding, the writer's first draw (RMS 4), packed by pack_q4_k
    embd = torch.randn(256, 2048, generator=torch.Generator().manual_seed(0)) * 4.0
    assert torch.equal(weights.embed, dequantize(pack_q4_k(embd), torch.float32))

"""A tensor-parallel rank reads only its experts from a Qwen3-Next / Qwen3.5-MoE checkpoint too:
``read_gguf_hf`` / ``load_gguf_model`` cut the memory-mapped GGUF banks as they are read (packed,
float, a joined ``ffn_gate_up_exps``, a type the reader dequantizes, the MTP block's), the HF
loader reads only those experts' tensors or their rows of a stored bank (fused ``gate_up_proj`` or
``gate_proj`` / ``up_proj``); the router and the shared expert stay whole, and the shard keeps
such banks as they are, giving the shard of a full load."""

import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ftlab.formats import CheckpointError, DequantizedWarning
from ftlab.formats.hf import SafetensorsShards
from ftlab.models import tiny
from ftlab.models.loader import load_gguf_model, load_hf
from ftlab.models.pipeline import rank_experts
from ftlab.models.qwen3_moe import load_gguf
from ftlab.models.qwen3_next import build_weights, read_gguf_hf
from ftlab.models.qwen3_next.hf import HFTensors, read_next_config
from ftlab.models.tensor_parallel import TensorParallel, rows, shard_qwen3_next
from ftlab.quant import QuantWeight
from tests.parallel.test_rank_experts import same

HYBRID = ["tiny-qwen35-moe", "tiny-qwen3-next"]
DATA = Path(__file__).resolve().parents[1] / "data" / "gguf_qwen3_next"
BANKS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")  # read_gguf_hf's routed banks
pytestmark = pytest.mark.usefixtures("module_cache_dir")


def owns_its_memory(t: torch.Tensor) -> bool:
    """Not a view of a larger tensor (a whole bank, or a memory-mapped file)."""
    return t.untyped_storage().nbytes() == t.numel() * t.element_size()


def same_but_experts(full, part, e0: int, e1: int) -> None:
    """``part`` (NextWeights) is ``full`` with each layer's routed banks cut to experts e0..e1."""
    for lf, lp in zip(full.layers, part.layers, strict=True):
        same(lp.moe.w_gate_up, rows(lf.moe.w_gate_up, e0, e1))
        same(lp.moe.w_down, rows(lf.moe.w_down, e0, e1))
        # every expert still scored
        for field in (
            "router",
            "shared_gate_up",
            "shared_down",
            "shared_gate",
        ):
            same(getattr(lp.moe, field), getattr(lf.moe, field))
        same(lp.input_norm, lf.input_norm)
    same(part.embed, full.embed)
    same(part.lm_head, full.lm_head)


@pytest.mark.parametrize("name", HYBRID)
@pytest.mark.parametrize(
    "dtype, quantize", [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)]
)
def test_hf_per_expert_tensors_of_a_range(name, dtype, quantize):
    """The tiny checkpoints (per-expert tensors), kept fp32, cast to bf16, or quantized to Q4_0
    at load: only the range's experts, dense banks in ``dtype`` of their own memory."""
    root = tiny.ensure(name)
    c, full = load_hf(root, dtype=dtype, progress=False, quantize=quantize)
    e0, e1 = 1, 3
    c2, part = load_hf(root, dtype=dtype, progress=False, quantize=quantize, experts=(e0, e1))
    assert c2 == c and c.num_experts > e1
    same_but_experts(full, part, e0, e1)
    down = part.layers[0].moe.w_down
    assert isinstance(down, QuantWeight) == quantize and (
        quantize or (down.dtype == dtype and owns_its_memory(down))
    )


def hf_dir(fixture: str, tmp_path: Path, form: str, bad: bool = False) -> Path:
    """A HF directory of a converter fixture's checkpoint, its banks fused (``gate_up_proj``, as
    stored) or split (``gate_proj`` / ``up_proj``); ``bad``: layer 0's down bank with one expert too
    many."""
    with safe_open(str(DATA / f"{fixture}.safetensors"), "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    if form == "split":
        for key in [k for k in state if k.endswith("experts.gate_up_proj")]:
            gate_up = state.pop(key)
            half = gate_up.shape[1] // 2
            state[key.replace("gate_up_proj", "gate_proj")] = gate_up[:, :half].contiguous()
            state[key.replace("gate_up_proj", "up_proj")] = gate_up[:, half:].contiguous()
    if bad:
        down = state["model.layers.0.mlp.experts.down_proj"]
        state["model.layers.0.mlp.experts.down_proj"] = torch.cat([down, down[:1]])
    save_file(state, str(tmp_path / "model.safetensors"))
    shutil.copy(DATA / f"{fixture}.json", tmp_path / "config.json")
    return tmp_path


@pytest.mark.parametrize("form", ["fused", "split"])
@pytest.mark.parametrize("fixture", ["qwen35moe-hv2", "qwen3next-hv2"])
def test_hf_stored_banks_of_a_range(fixture, form, tmp_path):
    """Banks stored whole (transformers' fused form, or gate and up apart): only the range's rows
    are read (a safetensors slice of its own memory), in the stored dtype."""
    path = hf_dir(fixture, tmp_path, form)
    _, full = load_hf(path, dtype=torch.bfloat16, progress=False)
    _, part = load_hf(path, dtype=torch.bfloat16, progress=False, experts=(2, 4))
    same_but_experts(full, part, 2, 4)
    config = read_next_config(path)
    tensors = HFTensors(SafetensorsShards(path), experts=(2, 4), num_experts=config.num_experts)
    bank = tensors["model.layers.0.mlp.experts.down_proj"]
    whole = HFTensors(SafetensorsShards(path))["model.layers.0.mlp.experts.down_proj"]
    assert torch.equal(bank, whole[2:4]) and owns_its_memory(bank) and bank.dtype == whole.dtype


def test_hf_bank_of_the_wrong_expert_count_is_refused(tmp_path):
    path = hf_dir("qwen35moe-hv2", tmp_path, "fused", bad=True)
    for experts in (None, (0, 2)):  # read whole: its shape; cut: its expert count, before the rows
        with pytest.raises(
            CheckpointError, match=r"model\.layers\.0\.mlp\.experts\.down_proj.*shape \(5,"
        ):
            load_hf(path, progress=False, experts=experts)


def read_gguf(path: Path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DequantizedWarning)  # llama-quantize's Q4_K_M: Q5_0 banks
        return read_gguf_hf(path, dtype=torch.float32, **kw)


@pytest.mark.parametrize(
    "file",
    [
        "qwen35moe-hv2.gguf",
        "qwen35moe-hv1.gguf",
        "qwen3next-hv2.gguf",
        "qwen35moe-hv2-q4_0.gguf",
        "qwen35moe-hv2-q4_k_m.gguf",
    ],
)
def test_gguf_hf_tensors_of_a_range(file):
    """The converter's files (F32; hv1: ``ffn_gate_up_exps`` joined, an MTP block; llama-quantize's
    Q4_0, and Q4_K_M's Q5_0 banks the reader dequantizes): every routed bank is the full one's
    rows, every other tensor as read without a range."""
    config, full, perms = read_gguf(DATA / file)
    e0, e1 = 1, 3
    config2, part, perms2 = read_gguf(DATA / file, experts=(e0, e1))
    assert config2 == config and config["num_experts"] > e1 and part.keys() == full.keys()
    assert perms2.keys() == perms.keys()
    cut = [name for name in full if name.endswith(BANKS)]
    assert len(cut) == 2 * (config["num_hidden_layers"] + config.get("mtp_num_hidden_layers", 0))
    for name, value in full.items():
        same(part[name], rows(value, e0, e1) if name in cut else value)
        if name in cut and not isinstance(part[name], QuantWeight):
            assert owns_its_memory(part[name])


@pytest.mark.parametrize("name", HYBRID)
@pytest.mark.parametrize(
    "quant, dtype",
    [
        ("f32", torch.float32),
        ("f32", torch.bfloat16),
        ("q4_0", torch.float32),
        ("q4_0", torch.bfloat16),
    ],
)
def test_gguf_model_of_a_range(name, quant, dtype):
    """The tiny models' GGUF files through load_gguf_model: F32 banks cut before the cast (dense
    in ``dtype``, their own memory), Q4_0 ones packed."""
    path = tiny.ensure(name) / f"model-{quant}.gguf"
    c, full, _ = load_gguf_model(path, dtype=dtype, progress=False)
    e0, e1 = c.num_experts // 2, c.num_experts
    c2, part, _ = load_gguf_model(path, dtype=dtype, progress=False, experts=(e0, e1))
    assert c2 == c
    same_but_experts(full, part, e0, e1)
    down = part.layers[0].moe.w_down
    assert isinstance(down, QuantWeight) == (quant == "q4_0")
    if quant == "f32":
        assert down.dtype == dtype and owns_its_memory(down)


BAD = [(2, 1), (0, 0), (-1, 2), (0, 9), [0, 1], (0.0, 1), (True, 2), (0, 1, 2)]


def refused_by_every_loader(what: str, bad, count: int) -> None:
    """Every reader, Qwen3-MoE's (tiny-qwen3-moe: GGUF, HF) and the hybrid models' (tiny-qwen35-moe:
    HF, GGUF, read_gguf_hf, build_weights), refuses the range argument ``what=bad`` with a
    ValueError naming the argument, the expectation (of ``count``, the same in both) and what
    came."""
    moe, hybrid = tiny.ensure("tiny-qwen3-moe"), tiny.ensure("tiny-qwen35-moe")
    message = re.escape(
        f"{what} must be (start, stop) with 0 <= start < stop <= {count}, got {bad!r}"
    )
    kw = {what: bad}
    loads = [
        lambda: load_gguf(moe / "model-q4_0.gguf", progress=False, **kw),
        lambda: load_gguf_model(moe / "model-f32.gguf", progress=False, **kw),
        lambda: load_hf(moe, progress=False, **kw),
        lambda: load_hf(hybrid, progress=False, **kw),
        lambda: load_gguf_model(hybrid / "model-q4_0.gguf", progress=False, **kw),
        lambda: read_gguf_hf(hybrid / "model-f32.gguf", **kw),
        lambda: build_weights(read_next_config(hybrid), HFTensors(SafetensorsShards(hybrid)), **kw),
    ]
    for load in loads:
        with pytest.raises(ValueError, match=message):
            load()


@pytest.mark.parametrize("bad", BAD)
def test_hostile_ranges_are_refused(bad):
    """Of the tiny models' 8 experts."""
    refused_by_every_loader("experts", bad, 8)


def test_build_weights_refuses_whole_banks_for_a_range(tmp_path):
    """A bank tensor must already hold the range (the readers cut it): a whole one is misshapen."""
    path = hf_dir("qwen35moe-hv2", tmp_path, "fused")
    with pytest.raises(
        CheckpointError, match=r"gate_up_proj' has shape \(4, 64, 64\), expected \(2, 64, 64\)"
    ):
        build_weights(read_next_config(path), HFTensors(SafetensorsShards(path)), experts=(0, 2))


@pytest.mark.parametrize(
    "name, quant",
    [("tiny-qwen35-moe", "hf"), ("tiny-qwen3-next", "q4_0"), ("tiny-qwen35-moe", "f32")],
)
def test_rank_range_and_shard_of_a_cut_load(name, quant):
    """rank_experts reads the expert count from the config (config.json, the GGUF metadata); the
    shard keeps banks loaded with that range as they are, and equals the shard of a full load."""
    root = tiny.ensure(name)
    path = root if quant == "hf" else root / f"model-{quant}.gguf"
    tp = TensorParallel(rank=1, world=2)
    if quant == "hf":
        c, full = load_hf(path, dtype=torch.float32, progress=False)
        _, part = load_hf(path, dtype=torch.float32, progress=False, experts=rank_experts(path, tp))
    else:
        c, full, _ = load_gguf_model(path, dtype=torch.float32, progress=False)
        _, part, _ = load_gguf_model(
            path, dtype=torch.float32, progress=False, experts=rank_experts(path, tp)
        )
    assert rank_experts(path, tp) == (c.num_experts // 2, c.num_experts)
    assert rank_experts(path, TensorParallel(rank=0, world=4)) == (0, c.num_experts // 4)
    cpu = torch.device("cpu")
    want, got = shard_qwen3_next(c, full, tp, cpu), shard_qwen3_next(c, part, tp, cpu)
    for lw, lg, lp in zip(want.layers, got.layers, part.layers, strict=True):
        for field in (
            "router",
            "w_gate_up",
            "w_down",
            "shared_gate_up",
            "shared_down",
            "shared_gate",
        ):
            same(getattr(lg.moe, field), getattr(lw.moe, field))
        assert lg.moe.w_down.shape[0] == c.num_experts // 2
        if not isinstance(lp.moe.w_down, QuantWeight):
            assert lg.moe.w_down is lp.moe.w_down  # kept, not copied
    same(got.lm_head, want.lm_head)


def test_rank_range_needs_a_count_tp_divides():
    # tiny-qwen35-moe's 8 experts
    with pytest.raises(ValueError, match=r"tp = 3 must divide num_experts \(8\)"):
        rank_experts(tiny.ensure("tiny-qwen35-moe"), TensorParallel(rank=0, world=3))

"""GGUF files written by llama.cpp's own ``llama-quantize`` (the files people download), from
a random Qwen3-MoE whose rows are multiples of 256 (tests/data/llama_cpp/README.md): each holds
the type mix llama.cpp gives its ftype, loads on its quantized bytes (Q4_0, Q8_0 and the K-quants
stay packed, no DequantizedWarning), and computes what transformers' Qwen3MoeForCausalLM computes
with the same file's weights dequantized by gguf-py."""

import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from ftlab.formats.gguf import field_value, open_gguf  # noqa: E402
from ftlab.models.layers import linear  # noqa: E402
from ftlab.models.loader import DequantizedWarning, load_gguf  # noqa: E402
from ftlab.models.pipeline import Pipeline, format_compare  # noqa: E402
from ftlab.models.pipeline_args import MODEL_OPS  # noqa: E402
from ftlab.models.qwen3_moe import Qwen3Moe  # noqa: E402
from ftlab.quant import QuantWeight  # noqa: E402
from ftlab.testing import quant_matmul_tolerance  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "llama_cpp"
FTYPES = ("Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")
LAYERS = 2
MATRICES = (
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
)
FLOAT = ("attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm", "ffn_gate_inp")  # never quantized


def path(ftype: str) -> Path:
    return DATA / f"qwen3moe-{ftype.lower()}.gguf"


def expected_types(ftype: str) -> dict[str, str]:
    """llama.cpp's choice (src/llama-quant.cpp) for this 2-layer model: the ftype's base type;
    the output in Q6_K (kept in Q8_0 by Q8_0); Q4_K_M and Q5_K_M give attn_v and ffn_down Q6_K
    in the layers of ``use_more_bits`` (i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2: layer 1 of 2);
    norms and the router stay F32."""
    base = {"Q4_0": "Q4_0", "Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0"}[
        ftype
    ]
    types = {
        "token_embd.weight": base,
        "output.weight": "Q8_0" if ftype == "Q8_0" else "Q6_K",
        "output_norm.weight": "F32",
    }
    for i in range(LAYERS):
        more_bits = ftype in ("Q4_K_M", "Q5_K_M") and i == 1
        for m in MATRICES:
            types[f"blk.{i}.{m}.weight"] = (
                "Q6_K" if more_bits and m in ("attn_v", "ffn_down_exps") else base
            )
        types |= {f"blk.{i}.{n}.weight": "F32" for n in FLOAT}
    return types


@pytest.mark.parametrize("ftype", FTYPES)
def test_each_file_holds_the_types_llama_cpp_gives_its_ftype(ftype):
    reader = open_gguf(path(ftype))
    got = {t.name: t.tensor_type.name for t in reader.tensors}
    assert got == expected_types(ftype)
    assert field_value(reader, "general.file_type", "int") == getattr(
        gguf.LlamaFileType, f"MOSTLY_{ftype}"
    )


def hf_state_dict(file: Path) -> dict[str, torch.Tensor]:
    """transformers' Qwen3-MoE tensors from the file's, dequantized by gguf-py. llama.cpp's
    converter stores Qwen3-MoE unpermuted (NeoX RoPE): the one transformation is the experts,
    stacked per bank (gate, up, down) where transformers stacks gate and up as one."""
    raw = {}
    for t in open_gguf(file).tensors:
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        raw[t.name] = torch.from_numpy(values).reshape(
            tuple(int(d) for d in reversed(t.shape.tolist()))
        )
    out = {
        "model.embed_tokens.weight": raw["token_embd.weight"],
        "model.norm.weight": raw["output_norm.weight"],
        "lm_head.weight": raw["output.weight"],
    }
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate": "ffn_gate_inp",
    }
    for i in range(LAYERS):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out |= {f"{p}{hf}.weight": raw[f"{b}{g}.weight"] for hf, g in names.items()}
        gate, up = raw[f"{b}ffn_gate_exps.weight"], raw[f"{b}ffn_up_exps.weight"]
        out[p + "mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
        out[p + "mlp.experts.down_proj"] = raw[f"{b}ffn_down_exps.weight"]
    return out


def oracle(file: Path, config) -> torch.nn.Module:
    c = config
    hf = transformers.Qwen3MoeConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        num_experts=c.num_experts,
        num_experts_per_tok=c.num_experts_per_tok,
        moe_intermediate_size=c.moe_intermediate_size,
        intermediate_size=4 * c.hidden_size,
        norm_topk_prob=c.norm_topk_prob,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=False,
        max_position_embeddings=c.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
    )
    model = transformers.Qwen3MoeForCausalLM(hf).eval()
    model.load_state_dict(hf_state_dict(file), strict=True)
    return model


def prompt(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(
        0, vocab, (1, 13), generator=torch.Generator().manual_seed(5)
    ), torch.arange(13)[None]


def load(ftype: str):
    """load_gguf in fp32, failing on a DequantizedWarning: every type of these files has a
    kernel."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DequantizedWarning)
        return load_gguf(path(ftype), dtype=torch.float32, progress=False)


def test_the_q4_k_m_file_loads_packed_in_the_types_it_holds():
    """Projections, expert banks (gate and up rows stacked) and lm_head are QuantWeight of the
    file's types; q, k and v share one stacked weight where their types match (layer 0); where
    attn_v is Q6_K beside Q4_K (layer 1) q and k are stacked and v stays apart; the embedding is
    dense rows."""
    config, weights = load("Q4_K_M")
    types = expected_types("Q4_K_M")
    for i, lw in enumerate(weights.layers):
        b = f"blk.{i}."
        fields = {
            "q_proj": "attn_q",
            "k_proj": "attn_k",
            "v_proj": "attn_v",
            "o_proj": "attn_output",
            "w_gate_up": "ffn_gate_exps",
            "w_down": "ffn_down_exps",
        }
        for field, name in fields.items():
            w = getattr(lw, field)
            assert isinstance(w, QuantWeight) and w.qtype == types[f"{b}{name}.weight"], (i, field)
        assert lw.w_gate_up.shape == (
            config.num_experts,
            2 * config.moe_intermediate_size,
            config.hidden_size,
        )
        # layer 0: one Q4_K part; layer 1: q and k stacked (Q4_K), then v (Q6_K)
        parts = [w for w, _ in lw.qkv()]
        assert [p.qtype for p in parts] == (["Q4_K"] if i == 0 else ["Q4_K", "Q6_K"]), i
        rows = lw.q_proj.shape[0] + lw.k_proj.shape[0]
        stacked = torch.cat([lw.q_proj.data, lw.k_proj.data] + ([lw.v_proj.data] if i == 0 else []))
        assert parts[0].shape == (stacked.shape[0], config.hidden_size) and torch.equal(
            parts[0].data, stacked
        )
        assert i == 0 or (parts[1] is lw.v_proj and parts[0].shape[0] == rows)
    assert isinstance(weights.lm_head, QuantWeight) and weights.lm_head.qtype == "Q6_K"
    assert isinstance(weights.embed, torch.Tensor) and weights.embed.dtype == torch.float32


@pytest.mark.parametrize("ftype", FTYPES)
def test_logits_match_transformers_on_the_files_dequantized_weights(ftype):
    """ftlab (reference backends, fp32, the ``dequant`` path of the packed weights) against
    transformers (fp32) on gguf-py's dequantized values of every tensor: the same weights, so
    only fp32 rounding separates them (2e-3). The int8 path rounds the activations to Q8_1 (about
    1e-2 of the logits here, and enough to flip a near-tied routing choice): it is held to
    quant_matmul's bound instead (next test)."""
    config, weights = load(ftype)
    tokens, positions = prompt(config.vocab_size)
    ours = Qwen3Moe(
        config, weights, backends=dict.fromkeys(MODEL_OPS, "reference"), q4_0_path="dequant"
    )
    got = ours.forward(tokens, positions)
    with torch.no_grad():
        want = oracle(path(ftype), config)(tokens).logits.float()
    assert want.abs().max() > 1.0  # logits of a model that computes something
    assert (got - want).abs().max().item() <= 2e-3


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_int8_path_of_the_q4_k_m_weights_is_within_the_quant_matmul_bound(backend):
    """Decode-size inputs (1 and 8 rows) through the model's matmul on every packed weight type of
    the Q4_K_M file (Q4_K q, Q6_K v, Q4_K o, Q6_K lm_head), int8 path: within
    ``quant_matmul_tolerance`` of the int8 sum of the file's blocks. Triton's interpreter, whose
    time grows with the rows, takes the first 20 rows of q and of v (a part tile of the 8-row
    tiles at 8 inputs); the kernels' launch shapes are
    tests/property/test_quant_matmul_triton_mv.py's."""
    config, weights = load("Q4_K_M")
    lw = weights.layers[1]
    gen = torch.Generator().manual_seed(7)
    if backend == "triton":
        ws = [QuantWeight(w.data[:20], (20, w.shape[1]), w.qtype) for w in (lw.q_proj, lw.v_proj)]
    else:
        ws = [lw.q_proj, lw.v_proj, lw.o_proj, weights.lm_head]
    for w in ws:
        for m in (1, 8):
            x = torch.randn(1, m, w.shape[1], generator=gen)
            got = linear(x, w, backend, "int8", backend)
            want, bound = quant_matmul_tolerance(x[0], w, "int8", torch.float32)
            assert got.shape == (1, m, w.shape[0])
            assert bool(((got[0] - want).abs() <= bound).all()), (w.qtype, m)


@pytest.mark.parametrize("ftype", FTYPES)
def test_pipeline_loads_each_file_and_generates(ftype):
    """Pipeline.load reads the model and its tokenizer from the file; its prefill gives the
    logits of the model load_gguf gives (same backends and weights: equal)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DequantizedWarning)
        pipe = Pipeline.load(str(path(ftype)), backends="reference", q4_0_path="dequant")
    ids = pipe.tokenizer.encode("The router sends")
    logits = pipe.prefill(ids)
    config, weights = load(ftype)
    model = Qwen3Moe(
        config, weights, backends=dict.fromkeys(MODEL_OPS, "reference"), q4_0_path="dequant"
    )
    want = model.forward(torch.tensor([ids]), torch.arange(len(ids))[None], last_only=True)[0, -1]
    assert pipe.config == config and torch.equal(logits, want)
    assert isinstance("".join(pipe.generate("The router sends", max_new_tokens=4)), str)


@pytest.mark.parametrize("ftype", ["Q4_0", "Q4_K_M"])
def test_triton_backends_agree_with_the_reference(ftype):
    """Every Triton kernel the model runs (under the interpreter on CPU) against the reference,
    stage by stage, on the Q4_0 file (Q4_0 matmuls, Q6_K output) and the Q4_K_M file (Q4_K and
    Q6_K matmuls and expert banks), on the dequant path: fp32 throughout, the kernels differ from
    the reference in summation order only, so 1e-4 relative (the bound the GPU gate of
    tests/models/test_pipeline.py holds them to)."""
    pipe = Pipeline.load(str(path(ftype)), backends="reference", q4_0_path="dequant")
    rows = pipe.compare("The router sends every token", ["triton"])
    worst = max(rows, key=lambda r: r.rel)
    assert worst.rel < 1e-4, format_compare(rows)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "hip"])
@pytest.mark.parametrize("ftype", ["Q4_0", "Q4_K_M"])
def test_gpu_backends_agree_with_the_reference_gpu(ftype, backend):
    """The same on the GPU, for each kernel backend (the packed weights on the path the backend
    implements, the reference on the same path: HIP has the int8 one only)."""
    q4_0_path = "int8" if backend == "hip" else "dequant"
    pipe = Pipeline.load(str(path(ftype)), "cuda", backends="reference", q4_0_path=q4_0_path)
    rows = pipe.compare("The router sends every token", [backend])
    worst = max(rows, key=lambda r: r.rel)
    assert worst.rel < 1e-4, format_compare(rows)

"""Train the small models ftlab ships (``ftlab.models.trained``): one of each family -- Qwen3-MoE,
Qwen3.5-MoE (gated delta rule, gated attention, shared expert) and Qwen3-Next -- on text every
machine has offline, the Python standard library's docstrings and its documentation topics
(``pydoc_data``), with a byte-level BPE vocabulary trained on the same text and a held-out split
(every module whose path hashes to 0 mod 20, and every 20th documentation topic) the training
never sees.

Sizes (:data:`FAMILIES`): 4 layers, 16 experts of 4 a token, hidden 256, expert width 256
(Q4_0 and K-quant blocks of 256 fit every matmul's rows), head dims 128 (the kernels' fast
paths). Each expert's gate/up and down matrices are trained as rank-``RANK`` products ``A @ B``
and shipped as their factors (bf16), which keeps the three models' weights in the repository
under 30 MB; :mod:`ftlab.models.trained` expands them into the full matrices -- the model every
file and backend is measured against. Quantization sees full matrices like any other.

    python benchmarks/train_tiny.py --family qwen3moe --device cuda          # minutes on a GPU
    python benchmarks/train_tiny.py --family qwen35moe --steps 20 --device cpu  # a smoke run

Seeded (``--seed``); torch's GPU kernels are not bit-reproducible, so the shipped weights are the
ones committed, and this script is how they were made. Writes ``OUT/<name>/`` (default
``ftlab/models/trained/``): ``weights.safetensors`` (runtime names of transformers, expert factors
as ``...experts.gate_up_proj.lr_a`` / ``.lr_b``), ``config.json``, ``tokenizer.json`` and
``training.json`` (steps, losses, held-out perplexity); ``heldout.txt`` beside them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils import parametrize

from ftlab.models.trained import corpus

ROOT = Path(__file__).resolve().parent.parent

RANK = 16
VOCAB = 2048

COMMON = dict(
    hidden_size=256,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=128,
    num_hidden_layers=4,
    num_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=256,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    hidden_act="silu",
)
#: the linear-attention layers' and the shared expert's sizes (Qwen3.5-MoE and Qwen3-Next)
LINEAR = dict(
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    shared_expert_intermediate_size=256,
)
#: family -> (model name, transformers config class name, config fields)
FAMILIES = {
    "qwen3moe": (
        "trained-qwen3-moe",
        "Qwen3MoeConfig",
        dict(
            intermediate_size=1024,
            norm_topk_prob=True,
            rope_theta=10000.0,
        ),
    ),
    "qwen35moe": (
        "trained-qwen35-moe",
        "Qwen3_5MoeTextConfig",
        dict(
            **LINEAR,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [11, 11, 10],
                "mrope_interleaved": True,
            },
        ),
    ),
    "qwen3next": (
        "trained-qwen3-next",
        "Qwen3NextConfig",
        dict(
            **LINEAR,
            intermediate_size=1024,
            norm_topk_prob=True,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
            },
        ),
    ),
}


def train_tokenizer(docs: list[str]):
    """A byte-level BPE of VOCAB tokens on ``docs``, as ftlab's tiny models' tokenizers."""
    from ftlab.models.tiny import train_tokenizer as train

    return train(docs, VOCAB)


def encode(tok, docs: list[str]) -> torch.Tensor:
    """Every document's ids, each followed by ``<|endoftext|>``, as one int64 stream."""
    eot = tok.token_to_id("<|endoftext|>")
    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids += enc.ids + [eot]
    return torch.tensor(ids, dtype=torch.int64)


class LowRank(nn.Module):
    """A parametrization: the expert bank ``[E, M, K]`` is ``A @ B`` (``A [E, M, r]``, ``B [E, r,
    K]``), the original tensor unused."""

    def __init__(self, e: int, m: int, k: int, r: int, gen: torch.Generator):
        super().__init__()
        # A @ B's entries ~ N(0, 1 / K) like a fan-in-initialized matrix
        self.lr_a = nn.Parameter(torch.randn(e, m, r, generator=gen) * r**-0.5)
        self.lr_b = nn.Parameter(torch.randn(e, r, k, generator=gen) * k**-0.5)

    def forward(self, _original: torch.Tensor) -> torch.Tensor:
        return self.lr_a @ self.lr_b


def build(family: str, vocab: int, seed: int):
    """A transformers causal LM of ``family`` (:data:`FAMILIES`) with low-rank expert banks."""
    import transformers

    _, cls_name, fields = FAMILIES[family]
    config = getattr(transformers, cls_name)(vocab_size=vocab, **COMMON, **fields)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    for mod in model.modules():
        if type(mod).__name__.endswith("Experts"):
            for name in ("gate_up_proj", "down_proj"):
                e, m, k = getattr(mod, name).shape
                parametrize.register_parametrization(mod, name, LowRank(e, m, k, RANK, gen))
                getattr(mod.parametrizations, name).original.requires_grad_(False)
    return config, model


def shipped_state(model) -> dict[str, torch.Tensor]:
    """The weights to ship, bf16: runtime names, each expert bank as its two factors."""
    out = {}
    for name, p in model.named_parameters():
        if name.endswith(".original"):
            continue
        # "...experts.parametrizations.gate_up_proj.0.lr_a" -> "...experts.gate_up_proj.lr_a"
        name = name.replace(".parametrizations.", ".").replace(".0.lr_", ".lr_")
        out[name] = p.detach().to(torch.bfloat16).cpu().contiguous()
    for name, b in model.named_buffers():
        if "inv_freq" not in name:
            out[name] = b.detach().cpu().contiguous()
    return out


def batches(ids: torch.Tensor, seq: int, batch: int, gen: torch.Generator):
    """Random windows of ``seq + 1`` tokens, ``batch`` at a time, forever."""
    while True:
        start = torch.randint(0, ids.numel() - seq - 1, (batch,), generator=gen)
        yield torch.stack([ids[s : s + seq + 1] for s in start.tolist()])


@torch.no_grad()
def held_out_loss(model, ids: torch.Tensor, seq: int, device, limit: int = 64) -> float:
    """Mean next-token loss over consecutive windows of the held-out stream (at most ``limit``)."""
    model.eval()
    losses = []
    for i in range(min(limit, (ids.numel() - 1) // seq)):
        w = ids[i * seq : i * seq + seq + 1].to(device)[None]
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(w[:, :-1]).logits.float()
        losses.append(float(nn.functional.cross_entropy(logits[0], w[0, 1:])))
    model.train()
    return sum(losses) / len(losses)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "ftlab" / "models" / "trained")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="a wall-time budget: after 10 steps, fewer steps if --steps would not fit in it",
    )
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    name = FAMILIES[args.family][0]
    out = args.out / name
    out.mkdir(parents=True, exist_ok=True)

    train_docs, held_docs = corpus()
    tok = train_tokenizer(train_docs)
    train_ids, held_ids = encode(tok, train_docs), encode(tok, held_docs)
    config, model = build(args.family, tok.get_vocab_size(), args.seed)
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))
        ),
    )
    gen = torch.Generator().manual_seed(args.seed)
    stream = batches(train_ids, args.seq, args.batch, gen)
    log, best, best_state, start = [], float("inf"), None, time.perf_counter()
    step = 0
    while step < args.steps:
        step += 1
        x = next(stream).to(device)
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            out_ = model(x, labels=x)
        # transformers shifts the labels itself: the loss of token t + 1 from tokens <= t
        loss = out_.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step == 10 and args.seconds:
            # the cosine schedule reads args.steps: it ends where the budget does
            per_step = (time.perf_counter() - start) / 10
            args.steps = max(20, min(args.steps, int(0.8 * args.seconds / per_step)))
            print(f"{per_step * 1e3:.0f} ms a step: {args.steps} steps", flush=True)
        if step % max(1, args.steps // 20) == 0 or step == args.steps:
            held = held_out_loss(model, held_ids, args.seq, device)
            log.append({"step": step, "train_loss": float(loss), "held_out_loss": held})
            print(
                f"step {step}: train {float(loss):.3f}, held-out {held:.3f} "
                f"(ppl {math.exp(held):.1f}), {time.perf_counter() - start:.0f} s",
                flush=True,
            )
            if held < best:
                best, best_state = held, shipped_state(model)
    from safetensors.torch import save_file

    save_file(best_state, str(out / "weights.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    (args.out / "heldout.txt").write_text("\n\n".join(held_docs))
    (out / "training.json").write_text(
        json.dumps(
            {
                "family": args.family,
                "steps": args.steps,
                "batch": args.batch,
                "seq": args.seq,
                "lr": args.lr,
                "seed": args.seed,
                "rank": RANK,
                "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "train_tokens": train_ids.numel(),
                "held_out_tokens": held_ids.numel(),
                "best_held_out_loss": best,
                "log": log,
            },
            indent=1,
        )
        + "\n"
    )
    size = (out / "weights.safetensors").stat().st_size
    print(f"{name}: {size / 2**20:.1f} MiB of weights, best held-out loss {best:.3f} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

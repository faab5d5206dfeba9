"""Why an eager decode step on hip's attention parts from one on SDPA: the model of a ``qwen3moe``
GGUF file, its KV cache filled with random rows (RMS ~1, so every position matters), one eager
decode step at position 512 for 1, 8 and 16 sequences, run twice from the same cache -- once
with hip's one-launch attention (a ``DecodePlan``'s ``hip_attention``), every layer's attention
held to the reference on its inputs (``ftlab.testing.decode_attention_held_to_reference``), once
through SDPA -- then, layer by layer, how many sequences' top-k expert sets differ between the two,
and how far the logits ended apart.

    python benchmarks/eager_attention_layers.py FILE.gguf [--batches 1,8,16]
"""

from __future__ import annotations

import argparse

import torch

from ftlab.bench.model import fill_cache
from ftlab.models.qwen3_moe import Qwen3Moe, load_gguf
from ftlab.testing import decode_attention_held_to_reference


def step(model: Qwen3Moe, tok: torch.Tensor, pos: torch.Tensor) -> tuple[list, list, torch.Tensor]:
    """(per-layer router ids, per-layer attention outputs, logits) of one forward pass."""
    ids, attn, logits = [], [], None
    for st in model.stages(tok, pos):
        if st.name.endswith("router"):
            ids.append(st.tensors["ids"].clone())
        elif st.name.endswith("attention"):
            attn.append(st.tensors["attention"].float().clone())
        elif st.name == "logits":
            logits = st.tensors["logits"].clone()
    return ids, attn, logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--batches", default="1,8,16")
    args = ap.parse_args()
    config, weights = load_gguf(args.gguf, device="cuda", dtype=torch.bfloat16, progress=False)
    dev = torch.device("cuda")
    length = 512
    for batch in map(int, args.batches.split(",")):
        model = Qwen3Moe(config, weights, max_batch=batch, max_seq_len=length + 8, static=True)
        fill_cache(model.cache)
        gen = torch.Generator().manual_seed(1)
        saved = [t.clone() for t in model.cache.k + model.cache.v]
        tok = torch.randint(0, config.vocab_size, (batch, 1), generator=gen).to(dev)
        pos = torch.full((batch, 1), length, device=dev)
        with (
            model.planned(model.plan.with_(hip_attention="eager")),
            decode_attention_held_to_reference() as held,
        ):
            hip_ids, hip_attn, hip_logits = step(model, tok, pos)
        for t, s in zip(model.cache.k + model.cache.v, saved, strict=True):
            t.copy_(s)
        with model.planned(model.plan.with_(hip_attention="never")):
            sd_ids, sd_attn, sd_logits = step(model, tok, pos)
        print(
            f"batch {batch}: hip's attention, elements over the bound of the reference per layer: "
            f"{[over for _, over, _ in held]} (backends {sorted({b for b, _, _ in held})})",
            flush=True,
        )
        flips = [
            int((a.sort(-1).values != b.sort(-1).values).any(-1).sum())
            for a, b in zip(hip_ids, sd_ids, strict=True)
        ]
        first = next((i for i, f in enumerate(flips) if f), None)
        d0 = float((hip_attn[0] - sd_attn[0]).abs().max())
        print(
            f"batch {batch}: layer 0's attention block output, hip against SDPA: max |diff| "
            f"{d0:.3g} (max |out| {float(sd_attn[0].abs().max()):.3g}); sequences whose top-k set "
            f"differs, per layer: {flips}; first layer {first}",
            flush=True,
        )
        rel = float((hip_logits - sd_logits).abs().max()) / float(sd_logits.abs().max())
        print(f"batch {batch}: logits max |diff| / max |logit| = {rel:.4f}", flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

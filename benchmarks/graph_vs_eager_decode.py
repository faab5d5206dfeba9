"""Graph against eager decode on a built-in tiny model (GPU): two pipelines of the same model, one
launched op by op over its dynamic model (live cache positions), one replaying its captured
static step (every cache slot under a mask); after the prompt, 24 greedy steps. Prints, per
step, max |graph - eager| / max |eager| of the logits: where the two attentions' last-bit
difference moves a Q8_1 rounding of an activation (Q4_0 weights on the int8 path) one step
shows it as a ~1e-3 spike that ``q4_0_path=dequant`` does not have.

    python benchmarks/graph_vs_eager_decode.py tiny-qwen35-moe q4_0 [path=dequant] [OP=BACKEND ...]
"""

from __future__ import annotations

import sys

from ftlab.models.pipeline import Pipeline

PROMPT = "The router sends every token to a few experts"  # as tests/models/test_pipeline_next.py


def main() -> None:
    name, quant = sys.argv[1], sys.argv[2]
    over = dict(a.split("=", 1) for a in sys.argv[3:])
    kw: dict = {"q4_0_path": over.pop("path", "auto")}
    if over:
        kw["backends"] = over
    eager = Pipeline.load(
        name, "cuda", quant=quant, graphs=False, launches=False, max_seq_len=600, **kw
    )
    graphed = Pipeline.load(name, "cuda", quant=quant, max_seq_len=600, **kw)
    ids = eager.tokenizer.encode(PROMPT)
    a, b = eager.prefill(ids), graphed.prefill(ids)
    out = [f"prefill {float((a - b).abs().max() / a.abs().max()):.2e}"]
    for _ in range(24):
        token = int(a.argmax())
        a, b = eager.decode_step(token), graphed.decode_step(token)
        out.append(f"{float((a - b).abs().max() / a.abs().max()):.1e}")
    print(name, quant, kw, " ".join(out))


if __name__ == "__main__":
    main()

"""Perplexity of each shipped trained model (``ftlab.models.trained``) on a slice of its held-out
text, computed by transformers -- not by ftlab -- over the windows ``llama-perplexity`` and
``ftlab.eval`` count (windows of ``CTX`` tokens, the second half of each scored), fp32 on the CPU.
Writes ``ftlab/models/trained/reference.json``, the figure ``tests/models/test_trained_gate.py``
holds ftlab's reference and Triton backends to.

    python benchmarks/trained_reference.py
"""

from __future__ import annotations

import json
import math
import platform

import torch

from ftlab.models import tiny
from ftlab.models.trained import ROOT, TRAINED_MODELS, held_out_text

#: the slice of the held-out text, the window
CHARS, CTX = 4000, 128


def transformers_perplexity(name: str, text: str) -> dict:
    import transformers
    from tokenizers import Tokenizer

    path = tiny.ensure(name)
    ids = Tokenizer.from_file(str(path / "tokenizer.json")).encode(text).ids
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    n = len(ids) // CTX
    nll, count, first, per_window = 0.0, 0, CTX // 2, []
    for w in range(n):
        window = torch.tensor(ids[w * CTX : (w + 1) * CTX])[None]
        with torch.no_grad():
            logits = model(window).logits[0].double()
        logp = torch.log_softmax(logits[first:-1], -1)
        per_window.append(-float(logp.gather(-1, window[0, first + 1 :, None]).sum()))
        nll += per_window[-1]
        count += CTX - first - 1
    return {
        "chars": CHARS,
        "ctx": CTX,
        "windows": n,
        "tokens": count,
        "perplexity": math.exp(nll / count),
        # the first two windows alone (what Triton's interpreter runs in CI)
        "perplexity_first_two_windows": math.exp(sum(per_window[:2]) / (2 * (CTX - first - 1))),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "machine": platform.machine(),
    }


def main() -> int:
    if not TRAINED_MODELS:
        raise SystemExit(f"no trained model in {ROOT}")
    text = held_out_text()[:CHARS]
    out = {name: transformers_perplexity(name, text) for name in sorted(TRAINED_MODELS)}
    (ROOT / "reference.json").write_text(json.dumps(out, indent=1) + "\n")
    for name, r in out.items():
        print(f"{name}: perplexity {r['perplexity']:.4f} over {r['tokens']} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One rank of the tensor-parallel test (tests/parallel/test_tensor_parallel.py), started by
torchrun: for each (model, file, quantized path) of argv[2:] (``model:quant:path``), the prompt's
next-token logits, 16 greedy tokens and the logits after them with tp = WORLD_SIZE, and the expert,
vocabulary and head ranges the pipeline asked its loader for; rank 0 saves them to argv[1].
``FTLAB_TP_DEVICE=cuda``: each rank on its GPU (cuda:LOCAL_RANK, NCCL) with the auto backends and
the decode step graph-captured; else the CPU (gloo) with the reference backends."""

import os
import sys

import torch

from ftlab.models.pipeline import Pipeline
from ftlab.models.tensor_parallel import close

PROMPT = "The router sends every token to its experts"


def run(model: str, quant: str, path: str, tp: int) -> dict:
    import ftlab.models.pipeline_load as pipeline_load

    # the ranges Pipeline.load asked its loader for (every model class loads through these)
    seen = []

    def watch(load):
        def loader(*args, **kwargs):
            seen.append((kwargs.get("experts"), kwargs.get("vocab"), kwargs.get("heads")))
            return load(*args, **kwargs)

        return loader

    loads = pipeline_load.load_hf, pipeline_load.load_gguf_model
    pipeline_load.load_hf, pipeline_load.load_gguf_model = (watch(f) for f in loads)
    try:
        if os.environ.get("FTLAB_TP_DEVICE", "cpu") == "cuda":
            pipe = Pipeline.load(
                model, "cuda", quant=quant, tp=tp, backends="auto", q4_0_path=path, graphs=True
            )
        else:
            pipe = Pipeline.load(
                model, "cpu", quant=quant, tp=tp, backends="reference", q4_0_path=path
            )
    finally:
        pipeline_load.load_hf, pipeline_load.load_gguf_model = loads
    ids = pipe.tokenizer.encode(PROMPT)
    logits = pipe.prefill(ids)
    first, tokens = logits.clone(), []
    for _ in range(16):
        tokens.append(int(logits.argmax()))
        logits = pipe.decode_step(tokens[-1])
    return {
        "logits": first.cpu(),
        "tokens": tokens,
        "last": logits.cpu(),
        "experts": seen[0][0],
        "vocab": seen[0][1],
        "heads": seen[0][2],
        "num_experts": getattr(pipe.config, "num_experts", None),
        "vocab_size": pipe.config.vocab_size,
    }


if __name__ == "__main__":
    world = int(os.environ.get("WORLD_SIZE", "1"))
    results = {spec: run(*spec.split(":"), world) for spec in sys.argv[2:]}
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(results, sys.argv[1])
    close()

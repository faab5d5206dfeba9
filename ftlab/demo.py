"""``ftlab demo``: every backend of the ops here against the reference, then the built-in tiny
Qwen3-MoE step by step (stages, decode steps, backends compared, generated text)."""

from __future__ import annotations

import os
import time


def run() -> int:
    """Print the environment, check every backend of index / store and Q4_0 against the
    reference, then walk the tiny Qwen3-MoE; returns the exit status (1 when a backend differs)."""
    import torch

    from ftlab.environment import report as env_report

    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"  # show the Triton path on the CPU, via its interpreter
    from ftlab import backends, ops
    from ftlab.bitview import bits_equal, random_rows

    print("== ftlab env ==")
    print(env_report())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    print(f"\n== index / store on {device}, {dtype} ==")
    weights = random_rows(gen, 4096, 256, 8, dtype).to(device)  # [4096, 256], row stride 264
    indices = torch.randint(0, 4096, (512,), generator=gen).to(device)
    slots = torch.randperm(8192, generator=gen)[:512].to(device)
    slots[::7] = -1  # padding tokens: skipped
    k, v = weights[indices], weights[indices.flip(0)]
    ref_out = ops.index(weights, indices, backend="reference")
    ref_kc, ref_vc = (
        torch.zeros(8192, 256, dtype=dtype, device=device),
        torch.zeros(8192, 256, dtype=dtype, device=device),
    )
    ops.store(ref_kc, ref_vc, slots, k, v, backend="reference")
    print(f"{'op':<6} {'backend':<10} {'bit-exact vs reference':<24} {'wall ms':>8}")
    for op in ("index", "store"):
        for name, why in backends.availability(op, device, dtype).items():
            if why is not None:
                print(f"{op:<6} {name:<10} {'n/a: ' + why}")
                continue
            start = time.perf_counter()
            if op == "index":
                same = bits_equal(ops.index(weights, indices, backend=name), ref_out)
            else:
                kc, vc = torch.zeros_like(ref_kc), torch.zeros_like(ref_vc)
                ops.store(kc, vc, slots, k, v, backend=name)
                same = bits_equal(kc, ref_kc) and bits_equal(vc, ref_vc)
            if device.type == "cuda":
                torch.cuda.synchronize()
            ms = (time.perf_counter() - start) * 1e3
            print(f"{op:<6} {name:<10} {'yes' if same else 'NO':<24} {ms:>8.1f}")
            if not same:
                return 1
    if not _q4_0(device):
        return 1
    print(
        "\n(first-call times include Triton compilation / HIP JIT build; see `ftlab bench` for "
        "timings)"
    )
    return _pipeline(device)


def _q4_0(device) -> bool:
    """Quantize, dequantize and the int8-dot matmul through every backend."""
    import torch

    from ftlab import backends, ops

    print(f"\n== GGUF Q4_0 on {device} ==")
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(384, 512, generator=gen) * 0.05).to(device)
    x = torch.randn(4, 512, generator=gen).to(device=device, dtype=torch.bfloat16)
    ref_q = ops.quantize_q4_0(w, backend="reference")
    ref_y = ops.q4_0_matmul(x, ref_q, path="int8", backend="reference").float()
    ref_d = ops.dequantize_q4_0(ref_q, backend="reference")
    print(
        f"{'backend':<10} {'quantize bytes':<15} {'dequantize':<11} "
        f"{'int8 matmul max rel diff':<25} {'wall ms':>8}"
    )
    ok = True
    for name, why in backends.availability("q4_0_matmul", device, torch.bfloat16).items():
        if why is not None:
            print(f"{name:<10} n/a: {why}")
            continue
        start = time.perf_counter()
        same_q = torch.equal(ops.quantize_q4_0(w, backend=name).data.cpu(), ref_q.data.cpu())
        same_d = torch.equal(ops.dequantize_q4_0(ref_q, backend=name), ref_d)
        y = ops.q4_0_matmul(x, ref_q, path="int8", backend=name).float()
        rel = float((y - ref_y).abs().max() / ref_y.abs().max())
        if device.type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        print(
            f"{name:<10} {'identical' if same_q else 'DIFFERENT':<15} "
            f"{'bit-exact' if same_d else 'DIFFERENT':<11} {rel:<25.2e} {ms:>8.1f}"
        )
        ok = ok and same_q and same_d and rel < 1e-2  # bf16 outputs: a few ulps at most
    return ok


def _pipeline(device) -> int:
    """The built-in tiny Qwen3-MoE, stage by stage, then backends compared, then text."""
    import torch

    from ftlab import backends as ftbackends
    from ftlab.models.pipeline import Pipeline, format_compare

    print("\n== tiny Qwen3-MoE pipeline ==")
    pipe = Pipeline.load("tiny-qwen3-moe", device, quant="q4_0")
    prompt = "The router sends every token"
    c = pipe.config
    print(
        f"model: {pipe.name} (Q4_0 GGUF), {c.num_hidden_layers} layers, {c.num_experts} experts, "
        f"top-{c.num_experts_per_tok}; prompt: {prompt!r}"
    )
    print(f"{'stage':<22} {'tensor':<10} {'shape':<16} {'mean':>9} {'std':>9}")
    for stage in pipe.stages(prompt):
        t = stage.tensors[stage.main]
        extra = ""
        if stage.name.endswith("router"):
            extra = (
                "  experts "
                + " ".join(str(i) for i in stage.tensors["ids"][-1].tolist())
                + " (last token)"
            )
        if stage.name == "sample":
            print(f"{'sample':<22} {'token':<10} {int(t)} {pipe.tokenizer.decode([int(t)])!r}")
            continue
        tf = t.float()
        std = float(tf.std()) if tf.numel() > 1 else 0.0
        print(
            f"{stage.name:<22} {stage.main:<10} {str(tuple(t.shape)):<16} {float(tf.mean()):>9.4f} "
            f"{std:>9.4f}{extra}"
        )
    print("\ndecode steps:")
    logits = pipe.prefill(pipe.tokenizer.encode(prompt))
    for _ in range(3):
        token = int(logits.argmax())
        logits = pipe.decode_step(token)
        print(
            f"  position {pipe.position - 1}: token {token} {pipe.tokenizer.decode([token])!r}, "
            f"next-token logit max {float(logits.max()):.3f}"
        )
    sets = []
    for b in ("triton", "hip"):
        linear_ok = b in ftbackends.available_backends("q4_0_matmul", device, torch.float32)
        moe_ok = b in ftbackends.available_backends("route_topk", device, torch.float32)
        if linear_ok or moe_ok:
            moe = b if moe_ok else "reference"
            sets.append(
                {
                    "q4_0_matmul": b if linear_ok else "reference",
                    "route_topk": moe,
                    "moe_experts": moe,
                }
            )
    if sets:
        print("\nbackends against the reference, stage by stage:")
        print(format_compare(pipe.compare(prompt, sets)))
    print(
        "\ngenerated (greedy, 24 tokens; the tiny model's weights are random, and so is its text):"
    )
    print(f"  {prompt}{''.join(pipe.generate(prompt, max_new_tokens=24))!r}")
    _trained(device)
    return 0


def _trained(device) -> None:
    """Text from the trained tiny Qwen3-MoE (``ftlab.models.trained``), where it is shipped."""
    import textwrap

    from ftlab.models import tiny
    from ftlab.models.pipeline import Pipeline

    if tiny.DEFAULT not in tiny.TRAINED_MODELS:
        return
    print(f"\n== {tiny.DEFAULT}: trained on the Python standard library's docstrings ==")
    pipe = Pipeline.load(tiny.DEFAULT, device, quant="q4_0")
    for prompt in ("Return the number of", "The file object"):
        text = "".join(pipe.generate(prompt, max_new_tokens=40))
        print(f"generated (Q4_0, greedy, 40 tokens) from {prompt!r}:")
        print(textwrap.indent((prompt + text).rstrip(), "  | ", lambda line: True))

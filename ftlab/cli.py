"""``ftlab env | demo | run | compile-check | bench``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

BENCHES = {
    "index_store": "ftlab.bench.index_store",
    "q4_0": "ftlab.bench.q4_0",
    "moe": "ftlab.bench.moe",
    "model": "ftlab.bench.model",
    "hybrid": "ftlab.bench.hybrid",
}


def cmd_env(_args=None) -> int:
    print(env_report())
    return 0


def env_report() -> str:
    import torch

    from ftlab import platform as ftplatform
    from ftlab.hip import loader

    plat = ftplatform.current()
    lines = [f"platform : {plat.describe()}"]
    if plat.info:
        lines.append(f"           LDS {plat.info.lds_bytes // 1024} KiB per workgroup")
    build = (
        torch.version.hip
        and f"ROCm/HIP {torch.version.hip}"
        or (torch.version.cuda and f"CUDA {torch.version.cuda}")
    )
    lines.append(f"torch    : {torch.__version__} ({build or 'CPU build'})")
    try:
        import triton

        mode = (
            " (CPU interpreter: TRITON_INTERPRET=1)"
            if os.environ.get("TRITON_INTERPRET") == "1"
            else ""
        )
        lines.append(f"triton   : {triton.__version__}{mode}")
    except ImportError:
        lines.append("triton   : not installed")
    why = loader.unavailable_reason(plat) if plat.is_gpu else None
    if plat.is_gpu:
        lines.append(f"HIP JIT  : {'available' if why is None else 'unavailable: ' + why}")
    else:
        tc = []
        for kind in ("cuda", "rocm"):
            try:
                tc.append(f"{kind}: {loader.find_toolchain(kind).compiler}")
            except loader.HipToolchainError as e:
                tc.append(f"{kind}: {e}")
        lines.append("HIP JIT  : no GPU to run on (" + "; ".join(tc) + ")")
    from ftlab import compile_check

    lines.append(f"clang-19 : {compile_check.clang() or 'not found (gfx compile checks skipped)'}")
    return "\n".join(lines)


def cmd_demo(args) -> int:
    import torch

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
    if not _demo_q4_0(device):
        return 1
    print(
        "\n(first-call times include Triton compilation / HIP JIT build; see `ftlab bench` for timings)"
    )
    return _demo_pipeline(device)


def _demo_q4_0(device) -> bool:
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
        f"{'backend':<10} {'quantize bytes':<15} {'dequantize':<11} {'int8 matmul max rel diff':<25} {'wall ms':>8}"
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
            f"{name:<10} {'identical' if same_q else 'DIFFERENT':<15} {'bit-exact' if same_d else 'DIFFERENT':<11} "
            f"{rel:<25.2e} {ms:>8.1f}"
        )
        ok = ok and same_q and same_d and rel < 1e-2  # bf16 outputs: a few ulps at most
    return ok


def _demo_pipeline(device) -> int:
    """The built-in tiny Qwen3-MoE, stage by stage, then backends compared, then text."""
    import torch

    from ftlab import backends as ftbackends
    from ftlab.models.pipeline import Pipeline, format_compare

    print("\n== tiny Qwen3-MoE pipeline ==")
    pipe = Pipeline.load("tiny-qwen3-moe", device, quant="q4_0")
    prompt = "The router sends every token"
    c = pipe.config
    print(f"model: {pipe.name} (Q4_0 GGUF), {c.num_hidden_layers} layers, {c.num_experts} experts, "
          f"top-{c.num_experts_per_tok}; prompt: {prompt!r}")  # fmt: skip
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
            f"{stage.name:<22} {stage.main:<10} {str(tuple(t.shape)):<16} {float(tf.mean()):>9.4f} {std:>9.4f}{extra}"
        )
    print("\ndecode steps:")
    logits = pipe.prefill(pipe.tokenizer.encode(prompt))
    for _ in range(3):
        token = int(logits.argmax())
        logits = pipe.decode_step(token)
        print(f"  position {pipe.position - 1}: token {token} {pipe.tokenizer.decode([token])!r}, "
              f"next-token logit max {float(logits.max()):.3f}")  # fmt: skip
    sets = []
    for b in ("triton", "hip"):
        linear_ok = b in ftbackends.available_backends("q4_0_matmul", device, torch.float32)
        moe_ok = b in ftbackends.available_backends("route_topk", device, torch.float32)
        if linear_ok or moe_ok:
            moe = b if moe_ok else "reference"
            sets.append({"q4_0_matmul": b if linear_ok else "reference", "route_topk": moe, "moe_experts": moe})
    if sets:
        print("\nbackends against the reference, stage by stage:")
        print(format_compare(pipe.compare(prompt, sets)))
    print(
        "\ngenerated (greedy, 24 tokens; the tiny model's weights are random, and so is its text):"
    )
    print(f"  {prompt}{''.join(pipe.generate(prompt, max_new_tokens=24))!r}")
    return 0


def cmd_run(args) -> int:
    """Generate with a model, printing tokens as they come and the tokens/s."""
    import torch

    from ftlab.models.pipeline import Pipeline, format_compare, timed_generate

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    pipe = Pipeline.load(args.model, device, backends=args.backend, quant=args.quant, max_seq_len=args.max_seq_len,
                         hybrid_slots=args.hybrid_slots, graphs=args.graphs and device.type == "cuda")  # fmt: skip
    if pipe.hybrid:
        ex = pipe.hybrid[0]
        print(f"[hybrid experts: {args.hybrid_slots} of {pipe.config.num_experts} a layer on {device}, the rest on "
              f"the CPU; handshake {ex.mechanism}: {ex.mechanism_reason}]")  # fmt: skip
    if args.stages:
        for stage in pipe.stages(args.prompt):
            shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in stage.tensors.items())
            print(f"[{stage.name}] {shapes}")
    print(args.prompt, end="", flush=True)
    rate = 0.0
    for piece, rate_so_far in timed_generate(pipe, args.prompt, args.max_new_tokens, temperature=args.temperature,
                                      top_p=args.top_p, seed=args.seed):  # fmt: skip
        print(piece, end="", flush=True)
        rate = rate_so_far
    print(f"\n[{rate:.1f} tokens/s, {args.backend} backends, {device}"
          f"{', graph-captured decode' if pipe.graph_capturable else ''}]")  # fmt: skip
    if pipe.hybrid:
        hits = sum(ex.policy.hits for ex in pipe.hybrid)
        misses = sum(ex.policy.misses for ex in pipe.hybrid)
        print(f"[hybrid residency over all layers: {hits} hits, {misses} misses]")
    if args.compare:
        print(format_compare(pipe.compare(args.prompt, args.compare)))
    return 0


def cmd_compile_check(args) -> int:
    from ftlab import compile_check, support_matrix

    targets = tuple(args.targets) if args.targets else compile_check.TARGETS
    rows, notes = compile_check.run(targets)
    print(compile_check.table(rows))
    for note in notes:
        print(f"note: {note}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": compile_check.to_json(rows), "notes": notes}, indent=2)
        )
    if args.write:
        Path(args.write).write_text(support_matrix.render(rows, notes))
        print(f"wrote {args.write}")
    failed = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def cmd_bench(args) -> int:
    import importlib

    module = importlib.import_module(BENCHES[args.op])
    report = module.run(quick=args.quick)
    print(report.table())
    if not args.no_write:
        for path in report.write(Path(args.out)):
            print(f"wrote {path}")
    return 0 if all(m.validated for m in report.measurements) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="print the platform and what ftlab can use here").set_defaults(
        fn=cmd_env
    )
    sub.add_parser("demo", help="run index/store through every available backend").set_defaults(
        fn=cmd_demo
    )
    p = sub.add_parser(
        "run", help="generate text with a model (a tiny model name, a HF directory or a .gguf)"
    )
    p.add_argument(
        "--model", default="tiny-qwen3-moe", help="tiny-qwen3-moe | tiny-qwen3-moe-wide | PATH"
    )
    p.add_argument("--prompt", default="The router sends every token")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument(
        "--backend", default="auto", help="backend for every op: auto | reference | triton | hip"
    )
    p.add_argument(
        "--quant", default="q4_0", choices=["hf", "f32", "q4_0"], help="which file of a tiny model"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--device", help="cpu | cuda (default: cuda when there is a GPU)")
    p.add_argument(
        "--stages", action="store_true", help="print every stage of the prompt's forward pass first"
    )
    p.add_argument("--hybrid-slots", type=int, default=None,
                   help="hybrid CPU/GPU experts: this many experts a layer on the device, the rest on the CPU")  # fmt: skip
    p.add_argument("--graphs", action="store_true", help="capture the decode step in a CUDA/HIP graph (GPU only)")
    p.add_argument(
        "--compare", nargs="*", help="backends to compare stage by stage against the reference"
    )
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser(
        "compile-check", help="compile every kernel for every gfx/sm target, report resources"
    )
    p.add_argument(
        "--targets",
        nargs="*",
        help="subset of targets (default: gfx1100 gfx1151 gfx1201 gfx942 sm_90)",
    )
    p.add_argument("--json", help="also write the rows as JSON here")
    p.add_argument(
        "--write", help="write the support matrix (Markdown) here, e.g. docs/support-matrix.md"
    )
    p.set_defaults(fn=cmd_compile_check)
    p = sub.add_parser("bench", help="time an op on the GPU beside torch and the copy bandwidth")
    p.add_argument("op", choices=sorted(BENCHES))
    p.add_argument(
        "--out", default="benchmarks/results", help="directory for the JSON + Markdown results"
    )
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.set_defaults(fn=cmd_bench)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())

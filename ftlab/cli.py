"""``ftlab env | demo | compile-check | bench``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

BENCHES = {"index_store": "ftlab.bench.index_store", "q4_0": "ftlab.bench.q4_0"}


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
    return 0


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

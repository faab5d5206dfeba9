"""``ftlab bench``: time an op, or a model through its pipeline, on the GPU beside its peers."""

from __future__ import annotations

from pathlib import Path

from ftlab.cli.options import at_least_one, option
from ftlab.models import pipeline_args as check

BENCHES = {
    "index_store": "ftlab.bench.index_store",
    "q4_0": "ftlab.bench.q4_0",
    "quant_matmul": "ftlab.bench.quant_matmul",
    "moe": "ftlab.bench.moe",
    "model": "ftlab.bench.model",
    "hybrid": "ftlab.bench.hybrid",
    "gated_delta_rule": "ftlab.bench.gated_delta_rule",
    "deltanet": "ftlab.bench.gated_delta_rule",  # the op's family name, the same bench
}
#: ``ftlab bench model --arch``: the model shapes, each its module.
MODEL_ARCHS = {"qwen3moe": "ftlab.bench.model", "qwen35moe": "ftlab.bench.qwen35moe"}
QWEN35 = "'ftlab bench model --arch qwen35moe'"
GGUF = "'ftlab bench model --gguf FILE'"
#: ``ftlab bench`` options: (what takes them, the benches that do: an op, or model's qwen3moe,
#: qwen35moe, gguf).
BENCH_OPTIONS = {
    "arch": ("'ftlab bench model'", {"qwen3moe", "qwen35moe"}),
    "gguf": ("'ftlab bench model'", {"gguf"}),
    **{
        name: (QWEN35, {"qwen35moe"})
        for name in ("small", "layers", "experts", "vocab", "write_gguf")
    },
    "device": (f"{QWEN35} and {GGUF}", {"qwen35moe", "gguf"}),
    **{
        name: (GGUF, {"gguf"})
        for name in ("prefill", "depth", "llama_bench", "tp", "hybrid_slots", "no_diagnostics")
    },
}


def cmd_bench(args) -> int:
    import importlib

    bench = (
        args.op
        if args.op != "model"
        else "gguf"
        if args.gguf is not None
        else args.arch or "qwen3moe"
    )
    for name, (owner, benches) in BENCH_OPTIONS.items():
        if getattr(args, name) not in (None, False) and bench not in benches:
            flag = "--" + name.replace("_", "-")
            if bench == "gguf":
                raise ValueError(
                    f"{flag} cannot go with --gguf (the file is the model, its "
                    "general.architecture the shape)"
                )
            raise ValueError(f"{flag} is an option of {owner} only")
    if bench == "gguf":
        from ftlab.bench import model_gguf

        try:
            report = model_gguf.run(
                args.gguf,
                quick=args.quick,
                device=args.device or "cuda",
                prefill=args.prefill or model_gguf.PREFILL,
                depth=args.depth,
                llama_bench=args.llama_bench,
                tp=args.tp or 1,
                hybrid_slots=args.hybrid_slots,
                diagnostics=not args.no_diagnostics,
            )
        except BaseException:
            # no process group left behind (the other ranks may never arrive)
            if (args.tp or 1) > 1:
                from ftlab.models.tensor_parallel import close

                close(wait=False)
            raise
        if (args.tp or 1) > 1:
            import torch.distributed as dist

            from ftlab.models.tensor_parallel import close

            rank = dist.get_rank()
            close()
            if rank != 0:  # every rank ran the bench; rank 0 reports
                return 0 if _validated(report) else 1
    elif bench == "qwen35moe":
        from ftlab.bench import qwen35moe_random as shapes

        shape = (shapes.SMALL if args.small else shapes.QWEN35_35B_A3B).with_overrides(
            args.layers, args.experts, args.vocab
        )
        module = importlib.import_module(MODEL_ARCHS[bench])
        report = module.run(
            quick=args.quick, shape=shape, device=args.device or "cuda", write_gguf=args.write_gguf
        )
    else:
        module = importlib.import_module(
            MODEL_ARCHS[bench] if args.op == "model" else BENCHES[args.op]
        )
        report = module.run(quick=args.quick)
    print(report.table())
    if not args.no_write:
        for path in report.write(Path(args.out)):
            print(f"wrote {path}")
    return 0 if _validated(report) else 1


def _validated(report) -> bool:
    """Whether every row that checks its output did: a user path row times a public call as a
    user makes it, with nothing to check its output against."""
    from ftlab.bench.user_path import USER_PATH

    return all(m.validated for m in report.measurements if m.kind != USER_PATH)


def _lengths(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def _at_least_one_each(lengths: tuple[int, ...]) -> tuple[int, ...] | int:
    for n in lengths:
        at_least_one("--prefill")(n)
    return lengths[0] if len(lengths) == 1 else lengths


def add_parser(p) -> None:
    """``ftlab bench``'s arguments on its subparser ``p``."""
    p.add_argument("op", choices=sorted(BENCHES), help="what to time")
    p.add_argument(
        "--out", default="benchmarks/results", help="directory for the JSON + Markdown results"
    )
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--no-write", action="store_true", help="print only")
    m = p.add_argument_group(
        "model",
        "options of 'bench model': --arch picks a random model's shape (the shape "
        "options are for --arch qwen35moe), --gguf a file's model instead",
    )
    m.add_argument(
        "--arch",
        choices=sorted(MODEL_ARCHS),
        help="qwen3moe: the Qwen3-30B-A3B shape; qwen35moe: the Qwen3.6-35B-A3B shape (hybrid "
        "DeltaNet) (default: qwen3moe)",
    )
    m.add_argument(
        "--gguf",
        metavar="FILE",
        help="bench the model of this llama.cpp GGUF file (qwen3moe, qwen35moe, "
        "qwen3next; any quantization mix, e.g. benchmarks/make_kquant_model.sh's "
        "Q4_K_M) with random token ids (default: a random model)",
    )
    m.add_argument(
        "--prefill",
        metavar="N[,N...]",
        type=option(_lengths, "ints, comma-separated", _at_least_one_each),
        help="--gguf: prompt tokens, or several lengths (512,4096,16384: a prefill of each, "
        "llama-bench -p the same); the first is the diagnostics' and, without --depth, where the "
        "deep decode runs (default: 512)",
    )
    m.add_argument(
        "--depth",
        metavar="N",
        type=option(int, "an int", at_least_one("--depth")),
        help="--gguf: the decode rows' depth besides 0, ftlab's and llama-bench's -d (default: "
        "the first --prefill length)",
    )
    m.add_argument(
        "--llama-bench",
        metavar="BIN",
        help="--gguf: also run llama.cpp's llama-bench (this binary) on "
        "the file, its tokens/s as rows beside ftlab's (default: not run)",
    )
    m.add_argument(
        "--small",
        action="store_true",
        help="every width scaled down (hidden 256, 4 layers, 8 experts, "
        "vocab 1024, prompt 32): a CPU smoke run",
    )
    m.add_argument(
        "--layers",
        type=option(int, "an int", at_least_one("--layers")),
        help="this many layers (default: the shape's, 40; --small: 4)",
    )
    m.add_argument(
        "--experts",
        type=option(int, "an int", at_least_one("--experts")),
        help="this many experts a layer, top-k capped at them (default: the shape's, 256; --small: "
        "8)",
    )
    m.add_argument(
        "--vocab",
        type=option(int, "an int", at_least_one("--vocab")),
        help="this vocabulary size (default: the shape's, 248320; --small: 1024)",
    )
    m.add_argument(
        "--tp",
        type=option(int, "an int", at_least_one("--tp")),
        help="--gguf (qwen3moe): tensor / expert parallelism over this many ranks, each on its own "
        "GPU; start them with torchrun --nproc-per-node N -m ftlab bench model --gguf FILE --tp N "
        "(rank 0 reports) (default: 1)",
    )
    m.add_argument(
        "--hybrid-slots",
        metavar="N",
        type=option(int, "an int", check.hybrid_slots),
        help="--gguf (qwen3moe): also decode with N of every layer's experts on the GPU, the rest "
        "on the CPU (static and lru residency), and with --llama-bench llama-bench -ncmoe at the "
        "same share of the expert bytes on the CPU (default: not run)",
    )
    m.add_argument(
        "--no-diagnostics",
        action="store_true",
        help="--gguf: time the engine through its public API only (Pipeline.load, prefill, "
        "generate), without the diagnostic rows of the model called directly (default: both)",
    )
    m.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        help="--arch qwen35moe or --gguf: cuda, or cpu: eager, host-timed, a smoke "
        "run (default: cuda)",
    )
    m.add_argument(
        "--write-gguf",
        metavar="FILE",
        help="first write the random model as a qwen35moe GGUF file "
        "(Q4_0 matmul weights) for llama-bench (default: none written)",
    )

"""``ftlab env | ops | demo | run | compile-check | bench``: ftlab's command line.

An error prints one line, ``ftlab: error: <message>``, to stderr and exits 2 for a usage error
(a bad option, as argparse does) or 1 for an error while running; ``--debug``, before or after
the subcommand, shows the full traceback instead. ``python -m ftlab`` is the same command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import ftlab
from ftlab.models import pipeline_args as check

if TYPE_CHECKING:
    import torch

BENCHES = {
    "index_store": "ftlab.bench.index_store",
    "q4_0": "ftlab.bench.q4_0",
    "quant": "ftlab.bench.quant",
    "moe": "ftlab.bench.moe",
    "model": "ftlab.bench.model",
    "hybrid": "ftlab.bench.hybrid",
    "deltanet": "ftlab.bench.deltanet",
}
#: The environment variables that change what ``ftlab run`` does, for its ``--help`` (the
#: README's "Environment variables" lists every one ftlab reads).
ENV_VARS = {
    "FTLAB_BACKEND": "replaces backend 'auto' of every op (reference | triton | hip); it then "
                     "raises where that backend cannot serve, as an explicit one does",
    "FTLAB_ARCH": "fakes the GPU platform for routing, e.g. gfx1201",
    "TRITON_INTERPRET": "1: Triton kernels run on CPU tensors in Triton's interpreter (slow; "
                        "set before ftlab is imported)",
    "FTLAB_CACHE_DIR": "where tiny models and JIT-built kernels are kept (default ~/.cache/ftlab)",
    "FTLAB_CPU_THREADS": "OpenMP threads of the hybrid CPU expert worker (default: cores - 2)",
    "FTLAB_CPU_ISA": "native (default) | avx2 (x86-64-v3) | portable (no -march): the CPU kernels' build",
    "FTLAB_HYBRID_MECHANISM": "host_func | stream_memop | eager: force the hybrid handshake",
    "FTLAB_HYBRID_PROBE_FAIL": "handshakes (comma-separated, or all) whose probe is made to fail",
    "CUDA_HOME, ROCM_HOME": "where nvcc / hipcc are, for the HIP JIT (or CUDA_PATH, ROCM_PATH)",
    "CXX": "the C++ compiler (with OpenMP) of the CPU kernels (default c++)",
}  # fmt: skip


def cmd_env(_args=None) -> int:
    from ftlab.environment import report

    print(report())
    return 0


def cmd_ops(args) -> int:
    """The ops of the routing table; with names, where everything about each lives."""
    from ftlab import backends, catalog

    if not args.names:
        print(catalog.table())
        print("\n'ftlab ops NAME' shows where everything about an op lives.")
        return 0
    unknown = [n for n in args.names if n not in backends.SPECS]
    if unknown:
        raise ValueError(f"op must be one of {backends.ops()}, got {unknown[0]!r}")
    print("\n\n".join(catalog.format_op(n) for n in args.names))
    return 0


def cmd_demo(_args=None) -> int:
    from ftlab import demo

    return demo.run()


def cmd_run(args) -> int:
    """Generate with a model, printing tokens as they come and the tokens/s."""
    import torch

    from ftlab.models.pipeline import Pipeline

    device = args.device
    if device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.hybrid_policy != "lru" and args.hybrid_slots is None:
        raise ValueError(f"--hybrid-policy {args.hybrid_policy} places hybrid experts: give --hybrid-slots N too")
    pipe = Pipeline.load(args.model, device, backends=args.backend, quant=args.quant, max_seq_len=args.max_seq_len,
                         hybrid_slots=args.hybrid_slots, graphs=args.graphs, tp=args.tp,
                         hybrid_policy=args.hybrid_policy)  # fmt: skip
    if pipe.tp is None:
        return _run(pipe, args)
    from ftlab.models.tensor_parallel import close

    if pipe.tp.rank != 0:  # every rank computes; rank 0 prints
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of this process)
    try:
        code = _run(pipe, args)
    except BaseException:
        close(wait=False)
        raise
    pipe._graph = None  # a captured decode graph goes before the group it captured
    close()
    return code


def _run(pipe, args) -> int:
    """cmd_run's work once the pipeline is loaded."""
    from ftlab.models.pipeline import format_compare, timed_generate

    if pipe.executors:
        ex = pipe.executors[0]
        where = (f"every expert of {len(pipe.executors)} of {pipe.config.num_hidden_layers} layers on the CPU, the "
                 f"other layers' on {pipe.device} (the share of {args.hybrid_slots} of {pipe.config.num_experts} a "
                 "layer)") if args.hybrid_policy == "layers" else (
                 f"{args.hybrid_slots} of {pipe.config.num_experts} a layer on {pipe.device} ({args.hybrid_policy}), "
                 "the rest on the CPU")  # fmt: skip
        print(f"[hybrid experts: {where}; handshake {ex.mechanism}: {ex.mechanism_reason}]")
    check.backend_sets(args.compare or [], pipe.device)  # refused now, not after generating
    if args.stages:
        for stage in pipe.stages(args.prompt):
            shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in stage.tensors.items())
            print(f"[{stage.name}] {shapes}")
    pieces = timed_generate(pipe, args.prompt, args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            seed=args.seed)  # fmt: skip
    print(args.prompt, end="", flush=True)
    timing = None
    for piece, now in pieces:
        print(piece, end="", flush=True)
        timing = now
    decode = "graph-captured decode (its capture in the first decode step)" if pipe.graph_capturable else "eager decode"
    ranks = f", tp = {pipe.tp.world} ranks" if pipe.tp is not None else ""
    print(f"\n[{timing.summary() if timing else 'no tokens'}; {args.backend} backends, {pipe.device}{ranks}, {decode}]")
    if pipe.executors:
        hits = sum(ex.policy.hits for ex in pipe.executors)
        misses = sum(ex.policy.misses for ex in pipe.executors)
        print(f"[hybrid residency over all layers: {hits} hits, {misses} misses]")
    if args.compare:
        print(format_compare(pipe.compare(args.prompt, args.compare)))
    return 0


def cmd_compile_check(args) -> int:
    from ftlab import compile_check, support_matrix

    targets = tuple(args.targets) if args.targets else compile_check.TARGETS
    rows, notes = compile_check.run(targets, tuple(args.only) if args.only else None)
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


#: ``ftlab bench model --arch``: the model shapes, each its module.
MODEL_ARCHS = {"qwen3moe": "ftlab.bench.model", "qwen35moe": "ftlab.bench.qwen35moe"}
_QWEN35 = "'ftlab bench model --arch qwen35moe'"
_GGUF = "'ftlab bench model --gguf FILE'"
#: ``ftlab bench`` options: (what takes them, the benches that do: an op, or model's qwen3moe, qwen35moe, gguf).
_BENCH_OPTIONS = {
    "arch": ("'ftlab bench model'", {"qwen3moe", "qwen35moe"}),
    "gguf": ("'ftlab bench model'", {"gguf"}),
    **{name: (_QWEN35, {"qwen35moe"}) for name in ("small", "layers", "experts", "vocab", "write_gguf")},
    "device": (f"{_QWEN35} and {_GGUF}", {"qwen35moe", "gguf"}),
    **{name: (_GGUF, {"gguf"}) for name in ("prefill", "llama_bench", "tp", "hybrid_slots")},
}


def cmd_bench(args) -> int:
    import importlib

    bench = args.op if args.op != "model" else "gguf" if args.gguf is not None else args.arch or "qwen3moe"
    for name, (owner, benches) in _BENCH_OPTIONS.items():
        if getattr(args, name) not in (None, False) and bench not in benches:
            flag = "--" + name.replace("_", "-")
            if bench == "gguf":
                raise ValueError(f"{flag} cannot go with --gguf (the file is the model, its general.architecture "
                                 "the shape)")  # fmt: skip
            raise ValueError(f"{flag} is an option of {owner} only")
    if bench == "gguf":
        from ftlab.bench import model_gguf

        try:
            report = model_gguf.run(args.gguf, quick=args.quick, device=args.device or "cuda",
                                    prefill=args.prefill or model_gguf.PREFILL, llama_bench=args.llama_bench,
                                    tp=args.tp or 1, hybrid_slots=args.hybrid_slots)  # fmt: skip
        except BaseException:
            if (args.tp or 1) > 1:  # no process group left behind (the other ranks may never arrive)
                from ftlab.models.tensor_parallel import close

                close(wait=False)
            raise
        if (args.tp or 1) > 1:
            import torch.distributed as dist

            from ftlab.models.tensor_parallel import close

            rank = dist.get_rank()
            close()
            if rank != 0:  # every rank ran the bench; rank 0 reports
                return 0 if all(m.validated for m in report.measurements) else 1
    elif bench == "qwen35moe":
        from ftlab.bench import qwen35moe_random as shapes

        shape = (shapes.SMALL if args.small else shapes.QWEN35_35B_A3B).with_overrides(args.layers, args.experts,
                                                                                      args.vocab)  # fmt: skip
        module = importlib.import_module(MODEL_ARCHS[bench])
        report = module.run(quick=args.quick, shape=shape, device=args.device or "cuda", write_gguf=args.write_gguf)
    else:
        module = importlib.import_module(MODEL_ARCHS[bench] if args.op == "model" else BENCHES[args.op])
        report = module.run(quick=args.quick)
    print(report.table())
    if not args.no_write:
        for path in report.write(Path(args.out)):
            print(f"wrote {path}")
    return 0 if all(m.validated for m in report.measurements) else 1


class _Parser(argparse.ArgumentParser):
    """argparse with a usage error on one line, ``ftlab: error: <message>``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"ftlab: error: {message} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default after its help, except a None default, which the help words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def _option(convert: Callable[[str], object], what: str, rule: Callable[[object], object]):
    """An argparse ``type``: the text as ``what`` (through ``convert``), then through ``rule``,
    the check that the Python API applies to the same argument."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        try:
            return rule(value)
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _at_least_one(flag: str) -> Callable[[int], int]:
    def rule(value: int) -> int:
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
        return value

    return rule


def _device(text: str) -> str | torch.device:
    """``auto`` (resolved when the command runs) or a device the Python API accepts."""
    return text if text == "auto" else check.device(text)


def _backend_set(text: str) -> str | dict[str, str]:
    """``NAME`` (every op) or ``OP=NAME[,OP=NAME...]`` (those ops; the others auto), checked as
    ``Pipeline.compare`` checks it."""
    value: str | dict[str, str] = text
    if "=" in text:
        pairs = [part.split("=", 1) for part in text.split(",")]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"a backend set must be NAME or OP=NAME[,OP=NAME...], got {text!r}")
        value = dict(pairs)
    check.backend_map(value)
    return value


def _run_parser(sub, common: list[argparse.ArgumentParser]) -> None:
    env = "\n".join(textwrap.fill(what, 100, initial_indent=f"  {name:<25}", subsequent_indent=" " * 27)
                    for name, what in ENV_VARS.items())  # fmt: skip
    p = sub.add_parser(
        "run", parents=common, formatter_class=_HelpFormatter,
        help="generate text with a model (a tiny model name, a HF directory or a .gguf)",
        description="Generate text with a Qwen3-MoE, Qwen3.5-MoE or Qwen3-Next model, printing tokens as they come "
                    "and the tokens/s.",
        epilog=f"environment variables:\n{env}\n\nexample:\n  ftlab run --model tiny-qwen3-moe --stages "
               "--compare triton q4_0_matmul=triton,route_topk=reference",
    )  # fmt: skip
    p.add_argument("--model", default="tiny-qwen3-moe",
                   help="a tiny model name (tiny-qwen3-moe, tiny-qwen3-moe-wide, tiny-qwen35-moe, tiny-qwen3-next), a HF "
                        "directory or a .gguf file (qwen3moe, qwen35moe or qwen3next)")
    p.add_argument("--prompt", default="The router sends every token", type=_option(str, "text", check.prompt),
                   help="the text to continue")
    p.add_argument("--max-new-tokens", type=_option(int, "an int", check.max_new_tokens), default=32,
                   help="generate at most this many tokens (fewer at end-of-text or max-seq-len)")
    p.add_argument("--backend", default="auto", choices=["auto", *check.backend_names()],
                   help="backend of every op; auto: hip, else triton, else the reference on a GPU, the "
                        "reference on the CPU")
    p.add_argument("--quant", default="q4_0", choices=check.TINY_QUANTS,
                   help="which file of a tiny model: its HF directory (hf) or the fp32 / Q4_0 GGUF file (not "
                        "used for a path)")
    p.add_argument("--temperature", type=_option(float, "a number", check.temperature), default=0.0,
                   help="sampling temperature, >= 0; 0 is greedy")
    p.add_argument("--top-p", type=_option(float, "a number", check.top_p), default=1.0,
                   help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--seed", type=_option(int, "an int", check.seed), default=0, help="seed of the sampler")
    p.add_argument("--max-seq-len", type=_option(int, "an int", check.max_seq_len), default=512,
                   help="KV-cache positions: the prompt and generated tokens together")
    p.add_argument("--device", type=_option(str, "a device", _device), default="auto",
                   help="cpu | cuda | cuda:N; auto: cuda when torch sees a GPU, else cpu")
    p.add_argument("--stages", action="store_true", help="print every stage of the prompt's forward pass first")
    p.add_argument("--hybrid-slots", type=_option(int, "an int", check.hybrid_slots), default=None,
                   help="hybrid CPU/GPU experts: this many experts a layer on the device, the rest on the CPU "
                        "(default: off, every expert on the device)")
    p.add_argument("--hybrid-policy", choices=list(check.HYBRID_POLICIES), default="lru",
                   help="--hybrid-slots: lru moves a step's missed experts in after it; static keeps experts "
                        "0 .. N-1 of every layer on the device for good; layers puts the same share of the expert "
                        "bytes on the CPU by whole layers, as llama.cpp's --n-cpu-moe (default: lru)")
    p.add_argument("--tp", type=_option(int, "an int", check.tp), default=1,
                   help="tensor / expert parallelism over this many processes: start them with torchrun "
                        "--nproc-per-node N -m ftlab run --tp N ... (rank 0 prints)")
    p.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=check.GRAPHS_AUTO,
                   help="capture the decode step in a CUDA/HIP graph; auto: on a CUDA/ROCm device, not on "
                        "the CPU (--graphs on the CPU is an error)")
    p.add_argument("--compare", nargs="*", metavar="SET", type=_option(str, "a backend set", _backend_set),
                   help="backend sets to compare stage by stage against the reference: NAME (every op) or "
                        "OP=NAME[,OP=NAME...] (default: none)")
    p.set_defaults(fn=cmd_run)  # fmt: skip


def parser() -> argparse.ArgumentParser:
    """The ``ftlab`` argument parser."""
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="on an error, show the full traceback instead of one line (default: off)")  # fmt: skip
    top = _Parser(prog="ftlab", formatter_class=_HelpFormatter, epilog="'ftlab COMMAND --help' shows a command's options.",
                  description="The kernels of a hybrid CPU/GPU MoE inference engine, from the shell. An error prints "
                              "one line and exits 2 (a bad option) or 1; --debug shows its traceback.")
    top.add_argument("--version", action="version", version=f"ftlab {ftlab.__version__}")
    top.add_argument("--debug", action="store_true", help="on an error, show the full traceback instead of one line")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, fn: Callable, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[debug], formatter_class=_HelpFormatter, help=text, description=text)
        p.set_defaults(fn=fn)
        return p

    command("env", cmd_env, "print the platform and what ftlab can use here")
    p = command("ops", cmd_ops, "list the ops, or where everything about an op lives (reference, kernels, tests, docs)")
    p.add_argument("names", nargs="*", metavar="OP", help="op names (default: list them all)")
    command("demo", cmd_demo, "every backend of the ops against the reference, then the tiny Qwen3-MoE step by step")
    _run_parser(sub, [debug])
    p = command("compile-check", cmd_compile_check, "compile every kernel for every gfx/sm target, report resources")
    p.add_argument("--targets", nargs="*", help="subset of targets (default: gfx1100 gfx1151 gfx1201 gfx942 sm_90)")
    p.add_argument("--only", nargs="*", metavar="FAMILY",
                   help="families to check: HIP device source stems and Triton module names, e.g. index_store "
                        "(default: all)")  # fmt: skip
    p.add_argument("--json", help="also write the rows as JSON here (default: not written)")
    p.add_argument("--write", help="write the support matrix (Markdown) here, e.g. docs/support-matrix.md "
                                   "(default: not written)")
    p = command("bench", cmd_bench, "time an op on the GPU beside torch and the copy bandwidth")
    p.add_argument("op", choices=sorted(BENCHES), help="what to time")
    p.add_argument("--out", default="benchmarks/results", help="directory for the JSON + Markdown results")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--no-write", action="store_true", help="print only")
    m = p.add_argument_group("model", "options of 'bench model': --arch picks a random model's shape (the shape "
                                      "options are for --arch qwen35moe), --gguf a file's model instead")
    m.add_argument("--arch", choices=sorted(MODEL_ARCHS),
                   help="qwen3moe: the Qwen3-30B-A3B shape; qwen35moe: the Qwen3.6-35B-A3B shape (hybrid DeltaNet) "
                        "(default: qwen3moe)")
    m.add_argument("--gguf", metavar="FILE", help="bench the model of this llama.cpp GGUF file (qwen3moe, qwen35moe, "
                                                 "qwen3next; any quantization mix, e.g. benchmarks/make_kquant_model.sh's "
                                                 "Q4_K_M) with random token ids (default: a random model)")
    m.add_argument("--prefill", metavar="N", type=_option(int, "an int", _at_least_one("--prefill")),
                   help="--gguf: prompt tokens, and the position of the decode steps (default: 512)")
    m.add_argument("--llama-bench", metavar="BIN", help="--gguf: also run llama.cpp's llama-bench (this binary) on "
                                                        "the file, its tokens/s as rows beside ftlab's (default: not run)")
    m.add_argument("--small", action="store_true", help="every width scaled down (hidden 256, 4 layers, 8 experts, "
                                                       "vocab 1024, prompt 32): a CPU smoke run")
    m.add_argument("--layers", type=_option(int, "an int", _at_least_one("--layers")), help="this many layers (default: the shape's, 40; --small: 4)")
    m.add_argument("--experts", type=_option(int, "an int", _at_least_one("--experts")),
                   help="this many experts a layer, top-k capped at them (default: the shape's, 256; --small: 8)")
    m.add_argument("--vocab", type=_option(int, "an int", _at_least_one("--vocab")), help="this vocabulary size (default: the shape's, 248320; --small: 1024)")
    m.add_argument("--tp", type=_option(int, "an int", _at_least_one("--tp")),
                   help="--gguf (qwen3moe): tensor / expert parallelism over this many ranks, each on its own GPU; "
                        "start them with torchrun --nproc-per-node N -m ftlab bench model --gguf FILE --tp N "
                        "(rank 0 reports) (default: 1)")
    m.add_argument("--hybrid-slots", metavar="N", type=_option(int, "an int", check.hybrid_slots),
                   help="--gguf (qwen3moe): also decode with N of every layer's experts on the GPU, the rest on the "
                        "CPU (static and lru residency), and with --llama-bench llama-bench -ncmoe at the same share "
                        "of the expert bytes on the CPU (default: not run)")
    m.add_argument("--device", choices=["cuda", "cpu"], help="--arch qwen35moe or --gguf: cuda, or cpu: eager, host-timed, a smoke "
                                                                 "run (default: cuda)")
    m.add_argument("--write-gguf", metavar="FILE", help="first write the random model as a qwen35moe GGUF file "
                                                        "(Q4_0 matmul weights) for llama-bench (default: none written)")
    return top  # fmt: skip


def _one_line(err: BaseException) -> str:
    """An exception as one line: its first line of text, led by its type where the type says
    more than ValueError / TypeError / RuntimeError do."""
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    kind = "" if type(err) in (ValueError, TypeError, RuntimeError) else f"{type(err).__name__}: "
    if not lines:
        return type(err).__name__
    more = f" (+{len(lines) - 1} more lines: --debug shows them)" if len(lines) > 1 else ""
    return f"{kind}{lines[0]}{more}"


def main(argv: list[str] | None = None) -> int:
    """Run ``ftlab`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = parser().parse_args(argv)
    try:
        status = args.fn(args)
        sys.stdout.flush()  # a reader gone away (ftlab run | head) shows here, not at exit
        return status
    except BrokenPipeError:
        # stop quietly, as other commands in a pipe do: nothing more can reach the reader
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command ended by SIGPIPE
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("ftlab: error: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if args.debug:
            raise
        print(f"ftlab: error: {_one_line(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

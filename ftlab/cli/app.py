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
from collections.abc import Callable
from pathlib import Path

import ftlab
from ftlab.cli import bench, run
from ftlab.cli import eval as eval_cli
from ftlab.cli.options import HelpFormatter, Parser
from ftlab.platform import GFX_CHECK_TARGETS, SM_CHECK_TARGETS


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
    if args.explain:
        from ftlab.backends.explain import explain

        for name in args.names:
            got = explain(
                name,
                args.shape,
                args.dtype,
                args.arch,
                args.device,
                args.backend,
                args.path,
                args.variant,
                args.chunk,
                args.precision,
                args.align,
            )
            print(got.describe())
        return 0
    print("\n\n".join(catalog.format_op(n) for n in args.names))
    return 0


def cmd_demo(_args=None) -> int:
    from ftlab import demo

    return demo.run()


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


def parser() -> argparse.ArgumentParser:
    """The ``ftlab`` argument parser."""
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on an error, show the full traceback instead of one line (default: off)",
    )
    top = Parser(
        prog="ftlab",
        formatter_class=HelpFormatter,
        epilog="'ftlab COMMAND --help' shows a command's options.",
        description="The kernels of a hybrid CPU/GPU MoE inference engine, from the shell. An "
        "error prints one line and exits 2 (a bad option) or 1; --debug shows its traceback.",
    )
    top.add_argument("--version", action="version", version=f"ftlab {ftlab.__version__}")
    top.add_argument(
        "--debug",
        action="store_true",
        help="on an error, show the full traceback instead of one line",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, fn: Callable, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name, parents=[debug], formatter_class=HelpFormatter, help=text, description=text
        )
        p.set_defaults(fn=fn)
        return p

    command("env", cmd_env, "print the platform and what ftlab can use here")
    p = command(
        "ops",
        cmd_ops,
        "list the ops, or where everything about an op lives (reference, kernels, tests, docs)",
    )
    p.add_argument("names", nargs="*", metavar="OP", help="op names (default: list them all)")
    e = p.add_argument_group(
        "explain", "--explain: the plan of a call (backend, path, kernel) and why"
    )
    e.add_argument(
        "--explain", action="store_true", help="print the plan of the call described below"
    )
    e.add_argument(
        "--shape",
        help="the op's dims, comma-separated in its order, e.g. M,K,N for quant_matmul (default: "
        "none; --explain needs it)",
    )
    e.add_argument("--dtype", default="bf16", help="activations' dtype and weights' quant type(s)")
    e.add_argument("--arch", help="plan for this GPU, e.g. gfx1201, sm_90 (default: this device)")
    e.add_argument(
        "--device", choices=("cpu", "cuda"), help="the tensors' device (default: cuda with --arch)"
    )
    e.add_argument("--backend", default="auto", help="the backend asked for")
    e.add_argument("--path", default="auto", help="quantized weights' path: auto, int8, dequant")
    e.add_argument("--variant", help="a kernel variant of the backend (default: its own choice)")
    e.add_argument("--chunk", type=int, default=64, help="gated_delta_rule's chunk_size")
    e.add_argument("--precision", default="fp32", help="gated_delta_rule's precision")
    e.add_argument("--align", type=int, default=16, help="the weights' byte alignment")
    command(
        "demo",
        cmd_demo,
        "every backend of the ops against the reference, then the tiny Qwen3-MoE step by step",
    )
    run.add_parser(sub, [debug])
    eval_cli.add_parser(sub, [debug])
    p = command(
        "compile-check",
        cmd_compile_check,
        "compile every kernel for every gfx/sm target, report resources",
    )
    p.add_argument(
        "--targets",
        nargs="*",
        help=f"subset of targets (default: {' '.join(GFX_CHECK_TARGETS + SM_CHECK_TARGETS)})",
    )
    p.add_argument(
        "--only",
        nargs="*",
        metavar="FAMILY",
        help="families to check: HIP device source stems and Triton module names, e.g. index_store "
        "(default: all)",
    )
    p.add_argument("--json", help="also write the rows as JSON here (default: not written)")
    p.add_argument(
        "--write",
        help="write the support matrix (Markdown) here, e.g. docs/support-matrix.md "
        "(default: not written)",
    )
    bench.add_parser(
        command(
            "bench", bench.cmd_bench, "time an op on the GPU beside torch and the copy bandwidth"
        )
    )
    return top


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

"""``ftlab run``: generate with a model, printing tokens as they come, then what a user's run
took: the load's seconds, the prefill's and the decode's tokens/s."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

from ftlab.cli.options import HelpFormatter, add_device, backend_set, option
from ftlab.models import pipeline_args as check
from ftlab.models import tiny

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
    "FTLAB_CPU_ISA": "native (default) | avx2 (x86-64-v3) | portable (no -march): the CPU "
    "kernels' build",
    "FTLAB_HYBRID_MECHANISM": "host_func | stream_memop | eager: force the hybrid handshake",
    "FTLAB_HYBRID_PROBE_FAIL": "handshakes (comma-separated, or all) whose probe is made to fail",
    "CUDA_HOME, ROCM_HOME": "where nvcc / hipcc are, for the HIP JIT (or CUDA_PATH, ROCM_PATH)",
    "CXX": "the C++ compiler (with OpenMP) of the CPU kernels (default c++)",
}


def cmd_run(args) -> int:
    """Generate with a model, printing tokens as they come and the tokens/s."""
    import time

    import torch

    from ftlab.models.pipeline import Pipeline

    where = args.device
    if where == "auto":
        where = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.hybrid_policy is not None and args.hybrid_slots is None:
        raise ValueError(
            f"--hybrid-policy {args.hybrid_policy} places hybrid experts: give --hybrid-slots N too"
        )
    args.hybrid_policy = args.hybrid_policy or check.DEFAULT_HYBRID_POLICY
    start = time.perf_counter()
    pipe = Pipeline.load(
        args.model,
        where,
        backends=args.backend,
        quant=args.quant,
        max_seq_len=args.max_seq_len,
        hybrid_slots=args.hybrid_slots,
        graphs=args.graphs,
        tp=args.tp,
        hybrid_policy=args.hybrid_policy,
    )
    args.load_s = time.perf_counter() - start
    if pipe.tp is None:
        return run_once(pipe, args)
    from ftlab.models.tensor_parallel import close

    if pipe.tp.rank != 0:  # every rank computes; rank 0 prints
        sys.stdout = open(os.devnull, "w")
    try:
        code = run_once(pipe, args)
    except BaseException:
        close(wait=False)
        raise
    pipe._graph = None  # a captured decode graph goes before the group it captured
    close()
    return code


def run_once(pipe, args) -> int:
    """cmd_run's work once the pipeline is loaded."""
    from ftlab.models.pipeline import format_compare

    if pipe.executors:
        ex = pipe.executors[0]
        where = (
            (
                f"every expert of {len(pipe.executors)} of {pipe.config.num_hidden_layers} layers "
                f"on the CPU, the other layers' on {pipe.device} (the share of {args.hybrid_slots} "
                f"of {pipe.config.num_experts} a layer)"
            )
            if args.hybrid_policy == "layers"
            else (
                f"{args.hybrid_slots} of {pipe.config.num_experts} a layer on {pipe.device} "
                f"({args.hybrid_policy}), the rest on the CPU"
            )
        )
        print(f"[hybrid experts: {where}; handshake {ex.mechanism}: {ex.mechanism_reason}]")
    check.backend_sets(args.compare or [], pipe.device)  # refused now, not after generating
    if args.stages:
        for stage in pipe.stages(args.prompt):
            shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in stage.tensors.items())
            print(f"[{stage.name}] {shapes}")
    if args.load_state:
        held = pipe.load_state(args.load_state)
        print(f"[state: {held} tokens from {args.load_state}]")
    turns = [args.prompt, *(args.then or [])]
    for k, text in enumerate(turns):
        # a turn's prompt: what the pipeline holds (the state read, earlier turns and their
        # answers, as token ids), then this turn's text
        ids = (pipe.tokens if k or args.load_state else []) + pipe.tokenizer.encode(text)
        timing = turn(pipe, args, text, ids)
        if len(turns) > 1 or args.load_state:
            print(
                f"[turn {k + 1}: {pipe.reused} of the prompt's {len(ids)} tokens resumed from "
                "the pipeline's state, not computed again]"
            )
    decode = (
        "graph-captured decode (its capture in the first decode step)"
        if pipe.graph_capturable
        else "eager decode"
    )
    ranks = f", tp = {pipe.tp.world} ranks" if pipe.tp is not None else ""
    print(
        f"[{timing.summary() if timing else 'no tokens'}; {args.backend} backends, "
        f"{pipe.device}{ranks}, {decode}]"
    )
    print(rates(getattr(args, "load_s", None), len(ids) - pipe.reused, timing))
    if args.save_state:
        print(f"[state: {len(pipe.tokens)} tokens written to {pipe.save_state(args.save_state)}]")
    if pipe.executors:
        hits = sum(ex.policy.hits for ex in pipe.executors)
        misses = sum(ex.policy.misses for ex in pipe.executors)
        print(f"[hybrid residency over all layers: {hits} hits, {misses} misses]")
    if args.compare:
        print(format_compare(pipe.compare(args.prompt, args.compare)))
    return 0


def turn(pipe, args, text: str, prompt: list[int]):
    """One generation from ``prompt`` (token ids, ending with ``text``'s), ``text`` and then its
    printed as it comes; the last :class:`~ftlab.models.generation_timing.Timing` (None without
    tokens)."""
    from ftlab.models.pipeline import timed_generate

    pieces = timed_generate(
        pipe,
        prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    print(text, end="", flush=True)
    timing = None
    for piece, now in pieces:
        print(piece, end="", flush=True)
        timing = now
    print()
    return timing


def rates(load_s: float | None, prompt_tokens: int, timing) -> str:
    """The line that says what the run took: the load's seconds, the prefill's tokens/s (the
    prompt's tokens over the time to the first new token) and the steady decode's."""
    parts = [f"load {load_s:.2f} s" if load_s is not None else "load -"]
    if timing is not None:
        parts.append(
            f"prefill {prompt_tokens} tokens in {timing.first_token_s:.3f} s "
            f"({prompt_tokens / timing.first_token_s:.1f} tokens/s)"
        )
        rate = timing.decode_tokens_per_s
        parts.append(
            f"decode {rate:.1f} tokens/s" if rate is not None else "decode - (under 3 tokens)"
        )
    return f"[{'; '.join(parts)}]"


def add_parser(sub, common: list[argparse.ArgumentParser]) -> None:
    env = "\n".join(
        textwrap.fill(what, 100, initial_indent=f"  {name:<25}", subsequent_indent=" " * 27)
        for name, what in ENV_VARS.items()
    )
    p = sub.add_parser(
        "run",
        parents=common,
        formatter_class=HelpFormatter,
        help="generate text with a model (a tiny model name, a HF directory or a .gguf)",
        description="Generate text with a Qwen3-MoE, Qwen3.5-MoE or Qwen3-Next model, printing "
        "tokens as they come and the tokens/s.",
        epilog=f"environment variables:\n{env}\n\nexample:\n  ftlab run --model tiny-qwen3-moe "
        "--stages --compare triton q4_0_matmul=triton,route_topk=reference",
    )
    p.add_argument(
        "--model",
        default=tiny.DEFAULT,
        help="a built-in model's name (trained-qwen3-moe, trained-qwen35-moe, trained-qwen3-next "
        "where shipped; the random tiny-qwen3-moe, tiny-qwen3-moe-wide, tiny-qwen35-moe, "
        "tiny-qwen3-next), a HF directory or a .gguf file (qwen3moe, qwen35moe or qwen3next) "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--prompt",
        default="The router sends every token",
        type=option(str, "text", check.prompt),
        help="the text to continue",
    )
    p.add_argument(
        "--then",
        action="append",
        metavar="TEXT",
        type=option(str, "text", check.prompt),
        help="another turn (repeatable): continues the conversation so far (the prompt, then each "
        "answer) with TEXT, resuming from the pipeline's state instead of computing it again "
        "(default: one turn)",
    )
    p.add_argument(
        "--save-state",
        metavar="FILE",
        help="write the decoding state at the end (its tokens, KV cache, recurrent state) to FILE "
        "(default: not written)",
    )
    p.add_argument(
        "--load-state",
        metavar="FILE",
        help="start from a state --save-state wrote with the same model: the prompt continues it "
        "(default: a fresh sequence)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=option(int, "an int", check.max_new_tokens),
        default=32,
        help="generate at most this many tokens (fewer at end-of-text or max-seq-len)",
    )
    p.add_argument(
        "--backend",
        default="auto",
        choices=["auto", *check.backend_names()],
        help="backend of every op; auto: hip, else triton, else the reference on a GPU, the "
        "reference on the CPU",
    )
    p.add_argument(
        "--quant",
        default="q4_0",
        choices=check.TINY_QUANTS,
        help="which file of a tiny model: its HF directory (hf) or the fp32 / Q4_0 GGUF file (not "
        "used for a path)",
    )
    p.add_argument(
        "--temperature",
        type=option(float, "a number", check.temperature),
        default=0.0,
        help="sampling temperature, >= 0; 0 is greedy",
    )
    p.add_argument(
        "--top-p",
        type=option(float, "a number", check.top_p),
        default=1.0,
        help="nucleus sampling mass, in (0, 1]",
    )
    p.add_argument(
        "--seed", type=option(int, "an int", check.seed), default=0, help="seed of the sampler"
    )
    p.add_argument(
        "--max-seq-len",
        type=option(int, "an int", check.max_seq_len),
        default=512,
        help="KV-cache positions: the prompt and generated tokens together",
    )
    add_device(p)
    p.add_argument(
        "--stages", action="store_true", help="print every stage of the prompt's forward pass first"
    )
    p.add_argument(
        "--hybrid-slots",
        type=option(int, "an int", check.hybrid_slots),
        default=None,
        help="hybrid CPU/GPU experts: this many experts a layer on the device, the rest on the CPU "
        "(default: off, every expert on the device)",
    )
    p.add_argument(
        "--hybrid-policy",
        choices=list(check.HYBRID_POLICIES),
        help="--hybrid-slots: layers puts the share of the expert bytes N / experts leaves on the "
        "CPU there by whole layers, as llama.cpp's --n-cpu-moe (the fastest on routes that do not "
        "repeat); lru moves a step's missed experts in after it; static keeps experts 0 .. N-1 of "
        f"every layer on the device for good (default: {check.DEFAULT_HYBRID_POLICY})",
    )
    p.add_argument(
        "--tp",
        type=option(int, "an int", check.tp),
        default=1,
        help="tensor / expert parallelism over this many processes: start them with torchrun "
        "--nproc-per-node N -m ftlab run --tp N ... (rank 0 prints)",
    )
    p.add_argument(
        "--graphs",
        action=argparse.BooleanOptionalAction,
        default=check.GRAPHS_AUTO,
        help="capture the decode step in a CUDA/HIP graph; auto: on a CUDA/ROCm device, not on "
        "the CPU (--graphs on the CPU is an error)",
    )
    p.add_argument(
        "--compare",
        nargs="*",
        metavar="SET",
        type=option(str, "a backend set", backend_set),
        help="backend sets to compare stage by stage against the reference: NAME (every op) or "
        "OP=NAME[,OP=NAME...] (default: none)",
    )
    p.set_defaults(fn=cmd_run)

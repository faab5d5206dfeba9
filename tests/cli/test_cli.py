import argparse
import re
import subprocess
import sys

import pytest
import torch

import ftlab
from ftlab import cli, environment
from ftlab.cli import app as cli_app
from ftlab.models.pipeline import Pipeline


def run(*args, module="ftlab"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True)


def one_error_line(stderr: str) -> str:
    """The single line an error prints (progress bars aside), checked for its form."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ftlab: error: "), stderr
    return lines[0]


def test_env():
    res = run("env")
    assert res.returncode == 0, res.stderr
    assert "platform :" in res.stdout and "torch    :" in res.stdout and "HIP JIT" in res.stdout


def test_env_with_faked_arch(monkeypatch):
    monkeypatch.setenv("FTLAB_ARCH", "gfx1151")
    text = environment.report()
    assert "gfx1151" in text and "RDNA3.5" in text and "UMA" in text and "wave32" in text


@pytest.fixture(scope="module")
def demo():
    return run("demo")


def test_demo_runs_every_backend(demo):
    res = demo
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert any(line.startswith("index  reference  yes") for line in lines)
    assert any(line.startswith("store  triton     yes") for line in lines)
    assert any(line.startswith("triton     identical       bit-exact") for line in lines)
    assert "NO" not in res.stdout and "DIFFERENT" not in res.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_bench_refuses_without_gpu():
    res = run("bench", "index_store", "--no-write")
    assert res.returncode != 0 and "needs a CUDA or ROCm GPU" in res.stderr


def test_unknown_bench_op():
    res = run("bench", "nope")
    assert res.returncode == 2 and "invalid choice" in res.stderr


def test_demo_runs_the_tiny_pipeline(demo):
    res = demo
    assert "== tiny Qwen3-MoE pipeline ==" in res.stdout
    for stage in (
        "embed",
        "layer 1 router",
        "layer 1 experts",
        "logits",
        "sample",
        "decode steps",
        "generated",
    ):
        assert stage in res.stdout, stage


def test_run_streams_tokens_and_rate(tmp_path):
    res = run(
        "run",
        "--model",
        "tiny-qwen3-moe",
        "--prompt",
        "Hello world",
        "--max-new-tokens",
        "5",
        "--stages",
        "--quant",
        "f32",
        "--compare",
        "reference",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "[layer 0 router]" in res.stdout and "tokens/s" in res.stdout and "max |diff|" in res.stdout
    )
    # what the run took, as a user sees it: the load, the prefill's rate, the decode's
    assert re.search(
        r"\n\[load \d+\.\d\d s; prefill 6 tokens in \d+\.\d{3} s \(\d+\.\d tokens/s\); "
        r"decode \d+\.\d tokens/s\]\n",
        res.stdout,
    ), res.stdout


def test_the_rates_line():
    from ftlab.cli.run import rates
    from ftlab.models.generation_timing import Timing

    assert rates(1.5, 8, Timing(5, 1.0, 0.25, 0.15)) == (
        "[load 1.50 s; prefill 8 tokens in 0.250 s (32.0 tokens/s); decode 5.0 tokens/s]"
    )
    assert rates(None, 8, Timing(1, 0.5, 0.5)) == (
        "[load -; prefill 8 tokens in 0.500 s (16.0 tokens/s); decode - (under 3 tokens)]"
    )
    assert rates(2.0, 3, None) == "[load 2.00 s]"


def test_run_with_hybrid_experts():
    res = run(
        "run",
        "--model",
        "tiny-qwen3-moe",
        "--prompt",
        "Hello world",
        "--max-new-tokens",
        "5",
        "--hybrid-slots",
        "4",
        "--hybrid-policy",
        "lru",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[hybrid experts: 4 of 8 a layer" in res.stdout and "handshake" in res.stdout
    assert "hybrid residency over all layers:" in res.stdout and "tokens/s" in res.stdout
    # the default placement: whole layers, as llama.cpp's --n-cpu-moe (half the expert bytes)
    res = run("run", "--model", "tiny-qwen3-moe", "--prompt", "Hi", "--hybrid-slots", "4")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[hybrid experts: every expert of 1 of 2 layers on the CPU" in res.stdout


def test_run_turns_resume_and_a_state_file_carries_on(tmp_path):
    """--then: each turn resumes from the conversation so far; --save-state / --load-state: a
    later run continues the state, and one of another model is refused naming the mismatch."""
    state = tmp_path / "chat.safetensors"
    common = ("--model", "tiny-qwen35-moe", "--quant", "f32", "--max-new-tokens", "4")
    res = run("run", *common, "--prompt", "Hi", "--then", " Again", "--save-state", str(state))
    assert res.returncode == 0, res.stderr[-3000:]
    first = len(Pipeline.load("tiny-qwen35-moe").tokenizer.encode("Hi"))
    assert f"[turn 1: 0 of the prompt's {first} tokens resumed" in res.stdout
    # turn 2: the prompt and its answer held (the answer's tokens each fed), " Again" after them
    reused, total = re.search(r"\[turn 2: (\d+) of the prompt's (\d+) tokens", res.stdout).groups()
    assert first < int(reused) < int(total)
    assert state.is_file() and "tokens written to" in res.stdout
    res = run("run", *common, "--prompt", " more", "--load-state", str(state))
    assert res.returncode == 0, res.stderr[-3000:]
    held = int(res.stdout.split("[state: ")[1].split(" tokens from")[0])
    assert f"[turn 1: {held} of the prompt's" in res.stdout
    res = run("run", "--model", "tiny-qwen3-moe", "--quant", "f32", "--load-state", str(state))
    assert res.returncode == 1 and "this state is of another model class" in res.stderr


def test_version_from_both_entry_points():
    for module in ("ftlab", "ftlab.cli"):
        res = run("--version", module=module)
        assert res.returncode == 0 and res.stdout.strip() == f"ftlab {ftlab.__version__}", res


@pytest.mark.parametrize(
    "args, message",
    [
        (["--top-p", "0"], "ftlab: error: argument --top-p: top_p must be in (0, 1], got 0.0"),
        (
            ["--max-new-tokens", "-1"],
            "ftlab: error: argument --max-new-tokens: max_new_tokens must be an int >= 0, got -1",
        ),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args, message):
    res = run("run", *args, module="ftlab")
    assert res.returncode == 2 and one_error_line(res.stderr).startswith(message), res.stderr


def test_runtime_errors_are_one_line_and_exit_1():
    res = run("run", "--model", "/nonexistent.gguf")
    assert res.returncode == 1 and res.stdout == ""
    line = one_error_line(res.stderr)
    assert "'/nonexistent.gguf' is none of these" in line and "Traceback" not in res.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(where):
    args = ["run", "--model", "/nonexistent.gguf"]
    res = run(*(["--debug", *args] if where == "before" else [*args, "--debug"]))
    assert res.returncode == 1
    assert (
        "Traceback (most recent call last)" in res.stderr
        and "FileNotFoundError: model must be" in res.stderr
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backend", "cuda"], "argument --backend: invalid choice: 'cuda'"),
        (["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        (["--top-p", "x"], "argument --top-p: expected a number, got 'x'"),
        (["--temperature", "nan"], "temperature must be a finite number >= 0 (0: greedy), got nan"),
        (["--temperature", "-1"], "temperature must be a finite number >= 0"),
        (["--max-new-tokens", "2.5"], "argument --max-new-tokens: expected an int, got '2.5'"),
        (["--max-seq-len", "0"], "max_seq_len must be an int >= 1, got 0"),
        (["--seed", "-1"], "seed must be an int in [0, 18446744073709551615], got -1"),
        (["--hybrid-slots", "-2"], "hybrid_slots must be an int >= 0, got -2"),
        (["--device", "gpu"], "device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
        (["--prompt", ""], "prompt must be a non-empty string, got ''"),
        (
            ["--prompt", "ab\udcff\udcfe"],
            "argument --prompt: prompt must be UTF-8 text, got 'ab\\udcff\\udcfe' (character 2 "
            "is a lone surrogate",
        ),
        (["--quant", "q8_0"], "argument --quant: invalid choice: 'q8_0'"),
        (["--compare", "moe_experts=nope"], "backends['moe_experts'] must be 'auto' or one of"),
        (["--compare", "moe_experts"], "backends must be 'auto', one of"),
        (
            ["--compare", "index=triton,hip"],
            "a backend set must be NAME or OP=NAME[,OP=NAME...], got 'index=triton,hip'",
        ),
    ],
)
def test_bad_options_are_usage_errors(capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", *args])
    assert exit_.value.code == 2
    line = one_error_line(capsys.readouterr().err)
    assert message in line and line.endswith("(see ftlab run --help)"), line


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-seq-len", "3"], "ftlab: error: prompt must fit in max_seq_len = 3 tokens, got"),
        (
            ["--model", "tiny-qwen3-moe", "--hybrid-slots", "9"],
            "ftlab: error: hybrid_slots must be an int in [0, 8], got 9",
        ),
        (
            ["--hybrid-policy", "layers"],
            "ftlab: error: --hybrid-policy layers places hybrid experts: give --hybrid-slots",
        ),
        (
            ["--backend", "hip", "--device", "cpu"],
            "ftlab: error: BackendUnavailable: index: backend 'hip' cannot serve",
        ),
    ],
)
def test_errors_while_running_exit_1_before_any_output(capsys, args, message):
    assert cli.main(["run", *args]) == 1
    out, err = capsys.readouterr()
    assert out == "" and one_error_line(err).startswith(message), err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of --graphs on the CPU")
def test_graphs_on_the_cpu_is_an_error(capsys):
    assert cli.main(["run", "--graphs"]) == 1
    assert "graphs=True needs a CUDA or ROCm device" in one_error_line(capsys.readouterr().err)


def test_an_unexpected_error_names_its_type(monkeypatch, capsys):
    def broken(_args):
        raise KeyError("no such thing\nsecond line")

    monkeypatch.setattr(cli_app, "cmd_env", broken)
    assert cli.main(["env"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line == "ftlab: error: KeyError: no such thing (+1 more lines: --debug shows them)"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_option_has_help_and_its_default_shows(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: no wrap inside a default
    top = cli.parser()
    for name, sub in {"ftlab": top, **_subparsers(top)}.items():
        help_text = sub.format_help()
        for action in sub._actions:
            if not action.option_strings or action.default == argparse.SUPPRESS:
                continue  # positionals, --help, --version, the subcommands' --debug
            assert action.help, (name, action.option_strings)
            if action.default is None:  # the help words what happens when it is not given
                assert "(default: " in action.help, (name, action.option_strings)
            else:
                assert f"(default: {action.default})" in help_text, (name, action.option_strings)


def test_run_help_documents_defaults_and_environment():
    res = run("run", "--help", module="ftlab")
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    assert "--graphs, --no-graphs" in text and "(default: auto)" in text and "(default: 32)" in text
    assert "{auto,reference,triton,hip}" in text
    assert "environment variables:" in text
    for name in cli.ENV_VARS:
        assert name in res.stdout, name


def test_a_closed_pipe_ends_quietly():
    """ftlab run ... | head: the reader goes away; no error line, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftlab", "env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # before the command writes anything
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err == "", err


def test_ops_lists_and_describes():
    res = subprocess.run([sys.executable, "-m", "ftlab", "ops"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "moe_experts      moe           reference, triton, hip, cpu" in res.stdout
    res = subprocess.run(
        [sys.executable, "-m", "ftlab", "ops", "q4_0_matmul"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    for piece in (
        "ftlab/ops/q4_0.py",
        "ftlab/reference/q4_0.py",
        "ftlab/triton/q4_0.py",
        "ftlab/hip/csrc/q4_0.hip",
        "tests/property/test_q4_0.py",
        "docs/OPS.md#q4_0_matmul",
        "paths int8, prefill int8",
    ):
        assert piece in res.stdout, piece
    res = subprocess.run(
        [sys.executable, "-m", "ftlab", "ops", "nope"], capture_output=True, text=True
    )
    assert res.returncode == 1 and res.stderr.startswith("ftlab: error: op must be one of")

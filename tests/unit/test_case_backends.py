"""A property case never passes by comparing the reference with itself: where only the reference
can serve (on the CPU: Triton's interpreter off, or no Triton), ftlab.testing's cases skip, naming
the op and why; with the interpreter on (tests/conftest.py turns it on, as CI runs) they compare."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ftlab.testing as ft
from ftlab import backends as ftbackends

ROOT = Path(__file__).resolve().parents[2]


def test_a_case_only_the_reference_serves_is_skipped_saying_why(monkeypatch):
    real = ftbackends.availability

    def reference_only(op, *args, **kwargs):
        return {
            name: None if name == "reference" else "off here" for name in real(op, *args, **kwargs)
        }

    monkeypatch.setattr(ftbackends, "availability", reference_only)
    x, z, w = torch.randn(2, 2, 16), torch.randn(2, 2, 16), torch.ones(16)
    reason = (
        r"gated_rmsnorm: only the reference can serve cpu torch\.float32, nothing to compare it "
        r"with \(triton: off here; hip: off here\)"
    )
    with pytest.raises(pytest.skip.Exception, match=reason):
        ft.check_gated_rmsnorm_case(x, z, w, 1e-6)
    with pytest.raises(pytest.skip.Exception, match=r"quant_matmul: .* path 'dequant', nothing"):
        ft.backends_for("quant_matmul", torch.device("cpu"), torch.float32, None, path="dequant")
    # named by the caller: run as asked
    assert ft.backends_for("gated_rmsnorm", torch.device("cpu"), torch.float32, ["reference"]) == [
        "reference"
    ]


def test_with_the_interpreter_on_the_cases_compare():
    assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
    for op in (
        "gated_rmsnorm",
        "add_rmsnorm",
        "qk_norm_rope",
        "decode_attention",
        "gated_delta_rule",
    ):
        assert "triton" in ft.backends_for(op, torch.device("cpu"), torch.float32, None), op


def test_property_tests_skip_without_the_interpreter():
    """A property module run with the interpreter off reports its CPU cases skipped, not passed."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "-rs",
            "tests/property/test_gated_norm.py",
            "-k",
            "cpu",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "2 skipped" in res.stdout and "passed" not in res.stdout, res.stdout[-3000:]
    assert "gated_rmsnorm: only the reference can serve cpu" in res.stdout, res.stdout[-3000:]
    assert "output_gate: only the reference can serve cpu" in res.stdout, res.stdout[-3000:]

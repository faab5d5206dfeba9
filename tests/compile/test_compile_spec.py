"""Compile specs are derived from the kernels' signatures: a spec that names a parameter the
kernel lacks, or leaves one untyped, is refused (so a spec cannot drift from its kernel)."""

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from ftlab.triton.compile_spec import spec  # noqa: E402


@triton.jit
def _kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr, MODE: tl.constexpr = 0):
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * scale + MODE, mask=i < n)


def test_signature_in_kernel_order_with_defaults():
    s = spec(
        _kernel,
        "k",
        types={"x_ptr": "*fp32", "out_ptr": "*fp16", "scale": "fp32"},
        constexprs={"BLOCK": 64},
    )
    assert s.signature == {
        "x_ptr": "*fp32",
        "out_ptr": "*fp16",
        "n": "i32",
        "scale": "fp32",
        "BLOCK": "constexpr",
        "MODE": "constexpr",
    }
    assert s.constexprs == {"BLOCK": 64, "MODE": 0}


@pytest.mark.parametrize(
    "types, constexprs, match",
    [
        ({"x_ptr": "*fp32"}, {"BLOCK": 64}, "pointer out_ptr needs"),
        ({"x_ptr": "*fp32", "out_ptr": "fp32"}, {"BLOCK": 64}, "pointer out_ptr needs"),
        ({"x_ptr": "*fp32", "out_ptr": "*fp32"}, {}, "constexpr BLOCK needs a value"),
        (
            {"x_ptr": "*fp32", "out_ptr": "*fp32", "y_ptr": "*fp32"},
            {"BLOCK": 64},
            r"no parameter\(s\) \['y_ptr'\]",
        ),
        ({"x_ptr": "*fp32", "out_ptr": "*fp32"}, {"BLOCK": 64, "n": 3}, "n is a runtime parameter"),
        (
            {"x_ptr": "*fp32", "out_ptr": "*fp32", "BLOCK": "i32"},
            {"BLOCK": 64},
            "BLOCK is a constexpr",
        ),
    ],
)
def test_drift_is_refused(types, constexprs, match):
    with pytest.raises(ValueError, match=match):
        spec(_kernel, "k", types=types, constexprs=constexprs)


def test_multiple_of_16_marks_parameters_by_index():
    """The runtime's divisibility specialization, named per parameter, lands at its index."""
    s = spec(
        _kernel,
        "k",
        types={"x_ptr": "*fp32", "out_ptr": "*fp16", "scale": "fp32"},
        constexprs={"BLOCK": 64},
        multiple_of_16=("x_ptr", "n"),
    )
    assert s.attrs == {(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}
    assert (
        spec(
            _kernel, "k", types={"x_ptr": "*fp32", "out_ptr": "*fp16"}, constexprs={"BLOCK": 64}
        ).attrs
        == {}
    )


@pytest.mark.parametrize("name", ["BLOCK", "y_ptr"])
def test_multiple_of_16_refuses_what_is_not_a_runtime_parameter(name):
    with pytest.raises(ValueError, match=f"multiple_of_16 names '{name}'"):
        spec(
            _kernel,
            "k",
            types={"x_ptr": "*fp32", "out_ptr": "*fp32"},
            constexprs={"BLOCK": 64},
            multiple_of_16=(name,),
        )

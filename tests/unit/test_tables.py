"""ftlab.tables.Table: aligned text in a terminal, a Markdown table in Jupyter."""

import pytest

from ftlab.tables import Table


def test_text_aligns_numbers_right_and_formats_floats():
    t = Table(["backend", "max |err|", "n"], [["triton", 1.23456e-7, 3], ["hip", 0.0, 12]])
    assert str(t).splitlines() == [
        "backend  max |err|   n",
        "-------  ---------  --",
        "triton    1.23e-07   3",
        "hip              0  12",
    ]


def test_markdown_escapes_pipes_and_marks_numeric_columns():
    t = Table(["stage", "max |diff|"], [["layer 0 | experts", 0.5]], float_format=".2f")
    assert (
        t._repr_markdown_()
        == "| stage | max \\|diff\\| |\n|---|---:|\n| layer 0 \\| experts | 0.50 |"
    )


def test_rows_must_match_the_header():
    with pytest.raises(ValueError, match="rows must have 2 cells .* got 3 in row 1"):
        Table(["a", "b"], [[1, 2], [1, 2, 3]])

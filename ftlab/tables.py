"""A table that reads well in a terminal and in Jupyter: ``Table(header, rows)`` prints as
aligned text and shows in a notebook as a Markdown table (as a cell's last expression, or
through ``IPython.display.display``) -- no pandas needed.

    Table(["backend", "max |err|", "bit-exact"], [["triton", 1.2e-07, "yes"], ["hip", 0.0, "yes"]])
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence


class Table:
    """Rows under a header. A cell prints through ``str``, a float through ``float_format``;
    a column of numbers aligns right."""

    def __init__(
        self, header: Sequence[str], rows: Iterable[Sequence[object]], float_format: str = ".3g"
    ):
        self.header = [str(h) for h in header]
        self.rows = [list(row) for row in rows]
        for i, row in enumerate(self.rows):
            if len(row) != len(self.header):
                raise ValueError(
                    f"rows must have {len(self.header)} cells (one per header column), got "
                    f"{len(row)} in row {i}"
                )
        self.float_format = float_format

    def _text(self, cell: object) -> str:
        if isinstance(cell, float):
            return format(cell, self.float_format)
        return str(cell)

    def _numeric(self) -> list[bool]:
        """Per column: every cell a number (bools are not)."""
        return [
            bool(self.rows)
            and all(
                isinstance(r[j], numbers.Number) and not isinstance(r[j], bool) for r in self.rows
            )
            for j in range(len(self.header))
        ]

    def __str__(self) -> str:
        cells = [self.header] + [[self._text(c) for c in row] for row in self.rows]
        widths = [max(len(line[j]) for line in cells) for j in range(len(self.header))]
        right = self._numeric()

        def line(values: list[str]) -> str:
            padded = (
                v.rjust(w) if r else v.ljust(w)
                for v, w, r in zip(values, widths, right, strict=True)
            )
            return "  ".join(padded).rstrip()

        rule = "  ".join("-" * w for w in widths)
        return "\n".join([line(cells[0]), rule, *(line(c) for c in cells[1:])])

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        def line(values: list[str]) -> str:
            return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

        rule = "|" + "|".join("---:" if r else "---" for r in self._numeric()) + "|"
        return "\n".join(
            [line(self.header), rule, *(line([self._text(c) for c in row]) for row in self.rows)]
        )

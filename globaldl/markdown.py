"""Markdown tables: the one helper behind every results file, run report and README section."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any


def markdown_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    right_aligned: Collection[str] = (),
) -> str:
    """A GitHub markdown table of `rows`; floats get 4 significant digits.

    `columns` picks and orders the columns (default: the first row's keys); the columns named
    in `right_aligned` are right-aligned (numbers a reader compares down the column).
    """
    if not rows:
        return "(no rows)\n"
    columns = list(columns or rows[0].keys())
    unknown = sorted(set(right_aligned) - set(columns))
    if unknown:
        raise ValueError(f"right_aligned names columns the table does not have: {unknown}")

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "" if value is None else str(value)

    rule = "".join("---:|" if column in right_aligned else "---|" for column in columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + rule]
    lines += ["| " + " | ".join(cell(row.get(column)) for column in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"

"""Experiment outputs: a CSV of every run, JSON + markdown through write_results, PNG plots."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from globaldl.files import write_bytes_atomically, write_text_atomically


def csv_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every key of every row, in the order first seen."""
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    return columns


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, list | tuple):
        return " ".join(str(item) for item in value)
    return value


def write_csv(
    path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None
) -> Path:
    """Write `rows` as CSV with a header (atomically); missing cells and None stay empty."""
    columns = list(columns or csv_columns(rows))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({column: _csv_cell(row.get(column)) for column in columns})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, buffer.getvalue())
    return path


def save_figure(
    path: Path,
    draw: Callable[[Any], None],
    *,
    width_inches: float = 7.0,
    height_inches: float = 4.5,
) -> Path:
    """Draw on a new matplotlib figure (Agg, no display needed) and write it as a PNG atomically.

    `draw` gets the figure and adds its axes.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    # A Figure without pyplot: no global state, nothing to close, safe in threads and tests.
    figure = Figure(figsize=(width_inches, height_inches), dpi=110)
    draw(figure)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomically(path, buffer.getvalue())
    return path


def number_or_none(value: Any) -> float | None:
    """A plottable float, or None for text cells ("not reached") and missing values."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None

"""Repeats of a run summarised as a benchmark reports them: the median, with the min and max.

An experiment's `rows()` gives one row per run, repeats included (column `repeat`);
`aggregate_rows` folds the repeats of each label into one table row: a number that varies
across repeats becomes its median in the column itself and its range in `<column>_min` and
`<column>_max`; `repeats` counts the finished repeats behind the median and `busy_repeats`
those taken on a busy machine. Targets then read medians (`row_spread` gives the median with
its range, for the text). "not reached" (a time to accuracy never reached) sorts above every
number, so a median of [12 s, not reached, not reached] is "not reached".

For experiments on other branches: keep `plan()` returning ONE repeat and `rows()` one row
per run (start from `run_row`); the runner repeats, `write_outputs` aggregates, and targets
get the aggregated rows. `Spread` and `row_spread` are the helpers for target texts and plots.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from globaldl.experiments.analysis import NOT_REACHED, Spread, as_number, training_seconds

if TYPE_CHECKING:
    from globaldl.experiments.results import RunResult

# A compared figure is a median of at least this many interleaved repeats (the benchmark rule).
MIN_REPEATS = 3
# Columns that identify one run, not the row: not aggregated.
PER_RUN_COLUMNS = ("repeat",)


def _is_measurement(values: Sequence[Any]) -> bool:
    """Numbers (or "not reached"), at least one a number, and not all the same."""
    if not values or any(as_number(value) is None for value in values):
        return False
    return len({as_number(value) for value in values}) > 1


def _status(rows: Sequence[Mapping[str, Any]]) -> str:
    statuses = [str(row.get("status")) for row in rows]
    if len(set(statuses)) == 1:
        return statuses[0]
    problems = sorted({status for status in statuses if status != "ok"})
    return f"{statuses.count('ok')} of {len(statuses)} ok; " + "; ".join(problems)


def aggregate_rows(rows: Sequence[Mapping[str, Any]], key: str = "label") -> list[dict[str, Any]]:
    """One row per `key` (first-seen order) from rows of several repeats, as described above.

    The median is taken over the finished repeats (status ok); a label with none keeps the
    values of its first repeat, so its row still says what failed.
    """
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.get(key), []).append(row)
    table = []
    for group in groups.values():
        finished = [row for row in group if row.get("status") == "ok"]
        basis = finished or group[:1]
        aggregated: dict[str, Any] = {}
        for column in _columns(group):
            if column in PER_RUN_COLUMNS:
                continue
            if column == "status":
                aggregated[column] = _status(group)
                continue
            values = [row.get(column) for row in basis if row.get(column) is not None]
            if not values:
                aggregated[column] = None
            elif _is_measurement(values):
                spread = Spread.of(values)
                assert spread is not None
                aggregated[column] = _cell(spread.median)
                aggregated[f"{column}_min"] = _cell(spread.low)
                aggregated[f"{column}_max"] = _cell(spread.high)
            else:
                aggregated[column] = values[0]
        aggregated["repeats"] = len(finished)
        # None when no finished repeat recorded the machine's load (results from before it).
        recorded = [row for row in finished if row.get("machine_busy") is not None]
        aggregated["busy_repeats"] = (
            sum(1 for row in recorded if row["machine_busy"]) if recorded else None
        )
        table.append(aggregated)
    return table


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [column for column in row if column not in columns]
    return columns


def _cell(value: float) -> float | str:
    return NOT_REACHED if math.isinf(value) else value


def row_spread(row: Mapping[str, Any], column: str) -> Spread | None:
    """The median of `column` in an aggregated row, with its range; None when missing."""
    median = as_number(row.get(column))
    if median is None:
        return None
    low = as_number(row.get(f"{column}_min"))
    high = as_number(row.get(f"{column}_max"))
    count = row.get("repeats")
    return Spread(
        median,
        median if low is None else low,
        median if high is None else high,
        count if isinstance(count, int) and count > 0 else 1,
    )


def presented(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[dict[str, Any]]:
    """Rows for a markdown table: a value with a range shows as `median [min-max]`."""
    shown = []
    for row in rows:
        cells: dict[str, Any] = {}
        for column in columns:
            spread = row_spread(row, column) if f"{column}_min" in row else None
            cells[column] = spread.text(digits=4) if spread is not None else row.get(column)
        shown.append(cells)
    return shown


def error_bars(spreads: Sequence[Spread]) -> list[list[float]]:
    """Matplotlib's `xerr`/`yerr` for medians: distances down to the min and up to the max."""
    return [
        [spread.median - spread.low for spread in spreads],
        [spread.high - spread.median for spread in spreads],
    ]


def representative_results(results: Sequence[RunResult]) -> list[RunResult]:
    """Per label (first-seen order), the finished repeat whose training time is the median.

    For curves (accuracy against time) that cannot be averaged point by point: the repeat
    drawn is the one in the middle (the lower middle for an even count).
    """
    by_label: dict[str, list[RunResult]] = {}
    for result in results:
        if result.ok:
            by_label.setdefault(result.spec.label, []).append(result)
    chosen = []
    for repeats in by_label.values():
        ordered = sorted(repeats, key=lambda r: training_seconds(r.summary or {}))
        chosen.append(ordered[(len(ordered) - 1) // 2])
    return chosen

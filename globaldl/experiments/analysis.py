"""Numbers derived from run summaries (time to accuracy, step time, bytes) and target checks."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from globaldl import summary as summary_module

NOT_REACHED = "not reached"


def epoch_end_seconds(history: Sequence[Mapping[str, Any]]) -> list[float]:
    """Seconds from the first training step to the end of each epoch (validation included).

    Process start-up, the initial weight broadcast and the final digest exchange are outside
    every epoch, so they are not counted; the first epoch does include tracing the step.
    """
    ends: list[float] = []
    elapsed = 0.0
    for index, epoch in enumerate(history):
        seconds = epoch.get("seconds")
        if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"history[{index}] has seconds {seconds!r}; expected a number >= 0")
        elapsed += float(seconds)
        ends.append(elapsed)
    return ends


def time_to_target(history: Sequence[Mapping[str, Any]], target_accuracy: float) -> float | None:
    """Seconds to the end of the first epoch whose val_accuracy >= target; None if never.

    >>> time_to_target([{"seconds": 10, "val_accuracy": 0.8},
    ...                 {"seconds": 12, "val_accuracy": 0.91}], 0.9)
    22.0
    """
    if not 0 < target_accuracy <= 1:
        raise ValueError(f"target_accuracy must be in (0, 1], got {target_accuracy!r}")
    for epoch, end_seconds in zip(history, epoch_end_seconds(history), strict=True):
        if float(epoch.get("val_accuracy", 0.0)) >= target_accuracy:
            return end_seconds
    return None


def seconds_or_not_reached(seconds: float | None) -> float | str:
    """A table cell: the seconds, or "not reached"."""
    return NOT_REACHED if seconds is None else seconds


def training_seconds(summary: Mapping[str, Any]) -> float:
    """Seconds of all epochs together (training and per-epoch validation)."""
    return epoch_end_seconds(summary.get("history", []))[-1] if summary.get("history") else 0.0


def mean_step_seconds(summary: Mapping[str, Any]) -> float | None:
    """Rank 0's mean step time: the sum of its phase seconds over its steps."""
    steps = int(summary.get("steps", 0))
    if steps <= 0:
        return None
    return sum(float(value) for value in summary["phase_seconds"].values()) / steps


def steady_step_seconds(summary: dict[str, Any]) -> float | None:
    """Rank 0's mean step without its first (epoch ends left out).

    A summary older than the first step's record gives the LAST epoch's seconds per step (its
    validation and the epoch's small collectives included): no tracing, warm TCP.
    """
    steady = summary_module.steady_step_seconds(summary)
    if steady is not None:
        return steady
    history = summary.get("history") or []
    epochs = len(history)
    if not epochs or int(summary.get("steps", 0)) <= 0:
        return None
    return float(history[-1]["seconds"]) / (int(summary["steps"]) / epochs)


def wire_bytes_per_step(summary: Mapping[str, Any]) -> float | None:
    """Gradient bytes one rank handed to Horovod per step."""
    steps = int(summary.get("steps", 0))
    return int(summary["gradient_bytes_wire"]) / steps if steps > 0 else None


def device_tx_bytes_per_step(
    accounting: Mapping[str, Any] | None, summary: Mapping[str, Any]
) -> float | None:
    """Bytes a device's interface sent per step, from the fleet's byte accounting.

    Everything counts: gradients, coordination, the broadcast, headers and logs, over the whole
    run; the mean over devices. This is the per-device traffic that `compression_ratio` (a
    payload ratio) does not measure.
    """
    steps = int(summary.get("steps", 0))
    if accounting is None or steps <= 0:
        return None
    return float(accounting["mean_tx_bytes"]) / steps


def add_traffic_ratios(rows: Sequence[dict[str, Any]]) -> None:
    """Give each row `traffic_ratio_vs_dense_measured`: dense bytes per step / its own.

    Both are what a device's interface sent per step (`device_tx_bytes_per_step`, everything
    included). The dense baseline is the run with compression `none` on the same fleet (devices,
    profile, cycle time) and workload; rows without one get None.
    """

    def group(row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(
            row.get(key) for key in ("model", "devices", "profile", "horovod_cycle_time_ms")
        )

    baselines: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("compression") == "none":
            baselines.setdefault(group(row), []).append(row)
    for row in rows:
        candidates = baselines.get(group(row), [])
        dense = candidates[0].get("device_tx_bytes_per_step") if len(candidates) == 1 else None
        row["traffic_ratio_vs_dense_measured"] = ratio(
            _number(dense), _number(row.get("device_tx_bytes_per_step"))
        )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """Numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


@dataclass(frozen=True)
class Spread:
    """A value measured over repeats: median, lowest and highest, and how many repeats.

    `math.inf` stands for "not reached" (a time to accuracy never reached).
    """

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: Iterable[Any]) -> Spread | None:
        """The spread of the numbers among `values` ("not reached" = inf); None if none."""
        numbers = [as_number(value) for value in values]
        present = sorted(number for number in numbers if number is not None)
        if not present:
            return None
        return cls(statistics.median(present), present[0], present[-1], len(present))

    @classmethod
    def single(cls, value: float) -> Spread:
        """One measurement."""
        return cls(value, value, value, 1)

    @property
    def reached(self) -> bool:
        """The median is a number (not "not reached")."""
        return math.isfinite(self.median)

    def ratio_to(self, other: Spread) -> Spread:
        """Ratio to `other`: the ratio of the medians, and the widest ratio the ranges allow."""
        return Spread(
            _divide(self.median, other.median),
            _divide(self.low, other.high),
            _divide(self.high, other.low),
            min(self.count, other.count),
        )

    def contains(self, value: float) -> bool:
        """`value` lies within [low, high]."""
        return self.low <= value <= self.high

    def text(self, unit: str = "", digits: int = 3) -> str:
        """`14.6 s [13.9-15.2]` for unit " s" (`14.6 s` when every repeat gave the same)."""

        def number(value: float) -> str:
            return significant(value, digits) if math.isfinite(value) else NOT_REACHED

        median = number(self.median) + (unit if self.reached else "")
        if self.low == self.high:
            return median
        return f"{median} [{number(self.low)}-{number(self.high)}]"


def significant(value: float, digits: int = 3) -> str:
    """`value` with `digits` significant digits and no exponent: 0.0519, 14.6, 93.2, 1005."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def _divide(numerator: float, denominator: float) -> float:
    if denominator == 0:
        return math.inf
    if math.isinf(numerator) and math.isinf(denominator):
        return math.nan
    return numerator / denominator


def as_number(value: Any) -> float | None:
    """A number from a table cell: "not reached" is inf; text, bools, None and NaN are None."""
    if value == NOT_REACHED:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) else float(value)


@dataclass(frozen=True)
class TargetCheck:
    """A goal globaldl sets itself, evaluated on measured numbers (reported, never asserted).

    `met` is None when the numbers needed are missing (e.g. a run never reached the accuracy
    the goal is about); `measured` then says what is missing.
    """

    goal: str
    measured: str
    met: bool | None

    @property
    def status(self) -> str:
        """met, NOT met, or not evaluated."""
        return {True: "met", False: "NOT met", None: "not evaluated"}[self.met]

    def as_row(self) -> dict[str, str]:
        """A table row."""
        return {"goal": self.goal, "status": self.status, "measured": self.measured}


Measured = float | Spread | None


def _spread(value: Measured) -> Spread | None:
    """A measurement as a Spread; None (and a median of "not reached") stay None."""
    if value is None:
        return None
    spread = value if isinstance(value, Spread) else Spread.single(float(value))
    return spread if spread.reached else None


def _repeats_note(*spreads: Spread | None) -> str:
    counts = sorted({spread.count for spread in spreads if spread is not None})
    if not counts or counts == [1]:
        return ""
    if len(counts) == 1:
        return f"; medians of {counts[0]} repeats"
    return f"; medians of {counts[0]} to {counts[-1]} repeats"


def _ratio_notes(ratio: Spread, factor: float) -> str:
    """Say when the ranges cannot tell the two apart, or straddle the target's factor."""
    if ratio.low == ratio.high:
        return ""
    notes = []
    if ratio.contains(1.0):
        notes.append("the ranges overlap: the two are not distinguishable")
    if factor != 1.0 and ratio.contains(factor):
        notes.append(f"the range crosses {factor:g}x")
    return "".join(f"; {note}" for note in notes)


def at_least_times_sooner(
    goal: str,
    faster_seconds: Measured,
    slower_seconds: Measured,
    factor: float,
    slower_total_seconds: Measured = None,
) -> TargetCheck:
    """Met when the faster median x factor <= the slower median (both: time to the target).

    Values are seconds or Spreads over repeats (None or a median of "not reached": never
    reached). When the slower run never reached the target, its whole training time
    (`slower_total_seconds`) bounds the speed-up from below: met if even that bound clears
    `factor`, otherwise not evaluated.
    """
    faster, slower = _spread(faster_seconds), _spread(slower_seconds)
    if faster is None:
        if slower is None:
            return TargetCheck(goal, f"{NOT_REACHED} by either run", None)
        return TargetCheck(
            goal, f"{NOT_REACHED} by the faster run; baseline {slower.text(' s')}", False
        )
    if slower is None:
        total = _spread(slower_total_seconds)
        if total is None:
            return TargetCheck(goal, f"baseline {NOT_REACHED}", None)
        bound = total.ratio_to(faster)
        return TargetCheck(
            goal,
            f"> {bound.text('x')} ({faster.text(' s')} vs baseline "
            f"{NOT_REACHED} in {total.text(' s')}{_repeats_note(faster, total)})",
            True if bound.median >= factor else None,
        )
    speedup = slower.ratio_to(faster)
    return TargetCheck(
        goal,
        f"{speedup.text('x')} ({faster.text(' s')} vs "
        f"{slower.text(' s')}{_repeats_note(faster, slower)}{_ratio_notes(speedup, factor)})",
        speedup.median >= factor,
    )


def at_most_times(
    goal: str, value: Measured, reference: Measured, factor: float, unit: str = "s"
) -> TargetCheck:
    """Met when the median of `value` <= factor x the median of `reference`."""
    measured, baseline = _spread(value), _spread(reference)
    if measured is None or baseline is None or baseline.median <= 0:
        return TargetCheck(goal, "missing runs", None)
    times = measured.ratio_to(baseline)
    return TargetCheck(
        goal,
        f"{times.text('x')} ({measured.text(f' {unit}')} vs "
        f"{baseline.text(f' {unit}')}{_repeats_note(measured, baseline)}"
        f"{_ratio_notes(times, factor)})",
        times.median <= factor,
    )


def at_most_times_to_target(
    goal: str,
    value: Measured,
    reference: Measured,
    factor: float,
    value_name: str = "the run",
    reference_name: str = "baseline",
) -> TargetCheck:
    """Met when the median time to target of `value` is at most factor x `reference`'s.

    Values as for `at_least_times_sooner` (a median of "not reached": never reached), but None
    is a missing run. A `value` that never reached the target misses the goal when the
    reference reached it; when neither did, the goal is not evaluated.
    """
    if value is not None and _spread(value) is None:
        baseline = _spread(reference)
        if baseline is None:
            return TargetCheck(goal, f"{NOT_REACHED} by either run", None)
        return TargetCheck(
            goal, f"{NOT_REACHED} by {value_name}; {reference_name} {baseline.text(' s')}", False
        )
    return at_most_times(goal, value, reference, factor)


NO_RESULT = "no finished run"


def falls_with_devices(goal: str, seconds_by_devices: Mapping[int, Measured | str]) -> TargetCheck:
    """Met when the time falls at every step from the smallest fleet to the largest (medians).

    One definition for the status and the text: `measured` lists every fleet size and names
    each step where the time does not fall. None (or a Spread whose median is inf) is a fleet
    that never reached the target, slower than any time; NO_RESULT a fleet without a finished
    run, which leaves the goal open.
    """
    if len(seconds_by_devices) < 2:
        return TargetCheck(goal, "fewer than two fleet sizes", None)
    sizes = sorted(seconds_by_devices)
    spreads: dict[int, Spread | None] = {}
    for n in sizes:
        value = seconds_by_devices[n]
        if value is None:
            spreads[n] = Spread.single(math.inf)
        elif isinstance(value, str):
            if value != NO_RESULT:
                raise ValueError(f"fleet size {n}: {value!r} is not a time or {NO_RESULT!r}")
            spreads[n] = None
        else:
            spreads[n] = value if isinstance(value, Spread) else Spread.single(float(value))
    listed = ", ".join(
        f"{n}: {NO_RESULT if spread is None else spread.text(' s')}"
        for n, spread in spreads.items()
    ) + _repeats_note(*spreads.values())
    smallest = spreads[sizes[0]]
    if smallest is None or not smallest.reached:
        # Without the smallest fleet's time there is nothing to fall from.
        return TargetCheck(goal, f"{listed}; no time on the smallest fleet to compare", None)
    missing = [n for n in sizes if spreads[n] is None]
    if missing:
        return TargetCheck(
            goal,
            f"{listed}; not evaluated without a finished run on "
            f"{', '.join(map(str, missing))} devices",
            None,
        )
    medians = {n: spread.median for n, spread in spreads.items() if spread is not None}
    rises = [
        f"{smaller} -> {larger}"
        for smaller, larger in zip(sizes, sizes[1:], strict=False)
        if not medians[larger] < medians[smaller]
    ]
    if rises:
        return TargetCheck(goal, f"{listed}; does not fall at {', '.join(rises)}", False)
    overlaps = [
        f"{smaller} -> {larger}"
        for smaller, larger in zip(sizes, sizes[1:], strict=False)
        # Every spread here is a reached time; ranges overlap when their ratio can be 1.
        if spreads[larger].ratio_to(spreads[smaller]).contains(1.0)
    ]
    note = (
        f"; the ranges overlap at {', '.join(overlaps)}: those falls are within the spread"
        if overlaps
        else ""
    )
    return TargetCheck(goal, f"{listed}; falls at every step{note}", True)

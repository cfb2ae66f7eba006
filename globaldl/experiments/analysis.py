"""Numbers derived from run summaries (time to accuracy, step time, bytes) and target checks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


def _seconds_text(seconds: float | None) -> str:
    return NOT_REACHED if seconds is None else f"{seconds:.1f} s"


def at_least_times_sooner(
    goal: str,
    faster_seconds: float | None,
    slower_seconds: float | None,
    factor: float,
    slower_total_seconds: float | None = None,
) -> TargetCheck:
    """Met when `faster_seconds` * factor <= `slower_seconds` (both: time to the target).

    When the slower run never reached the target, its whole training time
    (`slower_total_seconds`) bounds the speed-up from below: met if even that bound clears
    `factor`, otherwise not evaluated.
    """
    if faster_seconds is None:
        if slower_seconds is None:
            return TargetCheck(goal, f"{NOT_REACHED} by either run", None)
        return TargetCheck(
            goal, f"{NOT_REACHED} by the faster run; baseline {slower_seconds:.1f} s", False
        )
    if slower_seconds is None:
        if slower_total_seconds is None:
            return TargetCheck(goal, f"baseline {NOT_REACHED}", None)
        bound = slower_total_seconds / faster_seconds if faster_seconds > 0 else math.inf
        return TargetCheck(
            goal,
            f"> {bound:.1f}x ({faster_seconds:.1f} s vs baseline {NOT_REACHED} in "
            f"{slower_total_seconds:.1f} s)",
            True if bound >= factor else None,
        )
    speedup = slower_seconds / faster_seconds if faster_seconds > 0 else math.inf
    return TargetCheck(
        goal,
        f"{speedup:.1f}x ({faster_seconds:.1f} s vs {slower_seconds:.1f} s)",
        speedup >= factor,
    )


def at_most_times(
    goal: str, value: float | None, reference: float | None, factor: float, unit: str = "s"
) -> TargetCheck:
    """Met when value <= factor * reference."""
    if value is None or reference is None or reference <= 0:
        return TargetCheck(goal, "missing runs", None)
    times = value / reference
    return TargetCheck(
        goal, f"{times:.2f}x ({value:.4g} {unit} vs {reference:.4g} {unit})", times <= factor
    )


def falls_with_devices(goal: str, seconds_by_devices: Mapping[int, float | None]) -> TargetCheck:
    """Met when the largest fleet reaches the target sooner than the smallest one.

    `measured` lists every fleet size and says whether the fall is monotone.
    """
    if len(seconds_by_devices) < 2:
        return TargetCheck(goal, "fewer than two fleet sizes", None)
    sizes = sorted(seconds_by_devices)
    listed = ", ".join(f"{n}: {_seconds_text(seconds_by_devices[n])}" for n in sizes)
    first, last = seconds_by_devices[sizes[0]], seconds_by_devices[sizes[-1]]
    if first is None:
        # Without the smallest fleet's time there is nothing to fall from.
        return TargetCheck(goal, f"{listed}; no time on the smallest fleet to compare", None)
    if last is None:
        return TargetCheck(goal, listed, False)
    values = [seconds_by_devices[n] for n in sizes]
    monotone = all(
        later is not None and earlier is not None and later < earlier
        for earlier, later in zip(values, values[1:], strict=False)
    )
    return TargetCheck(
        goal, f"{listed}; falls at every step: {'yes' if monotone else 'no'}", last < first
    )

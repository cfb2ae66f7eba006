"""The order of an experiment's runs (repeats interleaved) and an honest estimate of what is left.

Repeats are interleaved as benchmark bodies do: repeat 1 of every run of the plan, then
repeat 2 of every run, ... A slow hour on the machine then touches one repeat of many runs,
not every repeat of one, and the median of each run's repeats shrugs it off.

The estimate of the time left says what it rests on: the runs already timed in this session
(the same label's earlier repeats, the best guess: repeats are the same work), the durations
recorded in the results folder by an earlier session, or, for runs neither has timed, the mean
run of this session; before any run has finished and without earlier results it is unknown.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from globaldl.experiments.spec import RunSpec

if TYPE_CHECKING:
    from globaldl.experiments.results import RunResult


@dataclass(frozen=True)
class ScheduledRun:
    """One run of the schedule: a spec of the plan and its repeat number (1-based)."""

    spec: RunSpec
    repeat: int
    repeats: int


def interleave(
    specs: Sequence[RunSpec], repeats: int, done: Collection[tuple[str, int]] = ()
) -> list[ScheduledRun]:
    """Repeat 1 of every spec in plan order, then repeat 2, ..., up to `repeats`.

    Without the runs in `done` (label, repeat): those already recorded, when an experiment
    resumes where an earlier session stopped.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number >= 1, got {repeats!r}")
    return [
        ScheduledRun(spec, repeat, repeats)
        for repeat in range(1, repeats + 1)
        for spec in specs
        if (spec.label, repeat) not in done
    ]


def fleet_ups(schedule: Sequence[ScheduledRun]) -> int:
    """How many times a fleet comes up: once per stretch of runs on the same fleet."""
    changes = sum(
        1 for before, after in zip(schedule, schedule[1:], strict=False)
        if before.spec.fleet != after.spec.fleet
    )  # fmt: skip
    return changes + 1 if schedule else 0


def duration_text(seconds: float) -> str:
    """`1h05m`, `12m30s`, `45s`."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class RunClock:
    """Times the runs and fleet start-ups of one session and estimates the rest.

    `earlier_seconds` maps labels to the run seconds an earlier session recorded (a median
    over its repeats), used for labels this session has not timed yet.
    """

    def __init__(
        self, schedule: Sequence[ScheduledRun], earlier_seconds: Mapping[str, float] | None = None
    ) -> None:
        self.schedule = list(schedule)
        self.earlier_seconds = dict(earlier_seconds or {})
        self.run_seconds: dict[str, list[float]] = {}
        self.fleet_up_seconds: list[float] = []
        self.done = 0

    def fleet_up(self, seconds: float) -> None:
        """A fleet came up in `seconds`."""
        self.fleet_up_seconds.append(seconds)

    def finished(self, run: ScheduledRun, seconds: float) -> None:
        """A run of the schedule finished (in any way) after `seconds`."""
        self.run_seconds.setdefault(run.spec.label, []).append(seconds)
        self.done += 1

    def position(self, run: ScheduledRun) -> str:
        """`[3/24] ablation fp16 (repeat 1/3)`."""
        index = self.schedule.index(run) + 1
        return (
            f"[{index}/{len(self.schedule)}] {run.spec.experiment} {run.spec.label} "
            f"(repeat {run.repeat}/{run.repeats})"
        )

    def estimate(self, remaining: Iterable[ScheduledRun]) -> tuple[float | None, str]:
        """Seconds the `remaining` runs will take (fleet start-ups included), and its basis."""
        remaining = list(remaining)
        timed = [seconds for values in self.run_seconds.values() for seconds in values]
        # Runs nobody timed count at the mean run of this session (or of the earlier one).
        timed = timed or list(self.earlier_seconds.values())
        mean_run = statistics.fmean(timed) if timed else None
        total = 0.0
        from_earlier = guessed = 0
        for run in remaining:
            label = run.spec.label
            if label in self.run_seconds:
                total += statistics.median(self.run_seconds[label])
            elif label in self.earlier_seconds:
                total += self.earlier_seconds[label]
                from_earlier += 1
            elif mean_run is not None:
                total += mean_run
                guessed += 1
            else:
                return None, "unknown until the first run finishes"
        if self.fleet_up_seconds:
            total += statistics.fmean(self.fleet_up_seconds) * max(0, fleet_ups(remaining) - 1)
        notes = []
        if from_earlier:
            notes.append(f"{from_earlier} of them as an earlier session timed them")
        if guessed:
            notes.append(f"{guessed} runs not timed yet, counted at the mean run")
        return total, "; ".join(notes)

    def eta_text(self, remaining: Iterable[ScheduledRun]) -> str:
        """`ETA 1h05m`, `ETA ~1h05m (...)`, or `ETA unknown until the first run finishes`."""
        seconds, basis = self.estimate(remaining)
        if seconds is None:
            return f"ETA {basis}"
        if basis:
            return f"ETA ~{duration_text(seconds)} ({basis})"
        return f"ETA {duration_text(seconds)}"


def earlier_run_seconds(earlier: Iterable[RunResult], specs: Sequence[RunSpec]) -> dict[str, float]:
    """Per label, the median run seconds of the finished earlier runs of the very same spec.

    A run of the same label with other arguments (a --quick run, an older plan) is other
    work and says nothing about this one's time.
    """
    by_label: dict[str, list[float]] = {}
    for result in earlier:
        if result.ok and result.run_seconds is not None and result.spec in specs:
            by_label.setdefault(result.spec.label, []).append(result.run_seconds)
    return {label: statistics.median(values) for label, values in by_label.items()}

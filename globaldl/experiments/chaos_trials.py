"""Chaos trials: a seeded schedule of kills and revives, and what each trial cost, from events.

A trial kills one device (never device 1, so the worker that ends as rank 0 and writes the
summary has been in every ring and saw every membership change) once the ring trains at full
size, and revives it once the survivors train again. Horovod orders the first ranks as a set
iterates, so rank 0 may start on another device, and a trial may kill the coordinator. Its
measurements come from the runner's fault times and the summary's `elastic.events`: nothing is
timed by the experiment itself.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from globaldl.experiments.spec import Fault

# Seconds after the trigger line: random within these ranges, so kills strike at any point of
# a step, a commit or an epoch end.
KILL_DELAY_SECONDS = (5.0, 25.0)
REVIVE_DELAY_SECONDS = (3.0, 15.0)


@dataclass(frozen=True)
class Trial:
    """One kill and revive of `device` (1-based), each after its delay past its trigger line."""

    device: int
    kill_delay_seconds: float
    revive_delay_seconds: float


def trial_schedule(trials: int, devices: int, seed: int) -> list[Trial]:
    """`trials` kill/revive trials on devices 2..`devices`, drawn from `seed`.

    Raises ValueError when there are no trials or no device but device 1 to kill.
    """
    if trials < 1:
        raise ValueError(f"chaos needs at least 1 trial, got {trials}")
    if devices < 3:
        raise ValueError(
            f"chaos needs at least 3 devices (device 1 stays; 2 must remain), got {devices}"
        )
    draw = random.Random(seed)
    return [
        Trial(
            device=draw.randint(2, devices),
            kill_delay_seconds=round(draw.uniform(*KILL_DELAY_SECONDS), 1),
            revive_delay_seconds=round(draw.uniform(*REVIVE_DELAY_SECONDS), 1),
        )
        for _ in range(trials)
    ]


def split_trials(trials: Sequence[Trial], per_run: int) -> list[list[Trial]]:
    """The trials in consecutive runs of at most `per_run` each."""
    if per_run < 1:
        raise ValueError(f"trials per run must be >= 1, got {per_run}")
    return [list(trials[start : start + per_run]) for start in range(0, len(trials), per_run)]


def trial_faults(trials: Sequence[Trial], devices: int) -> tuple[Fault, ...]:
    """The faults of one run: kill after the ring trains at full size, revive after survivors do.

    The first kill waits for the end of epoch 1; later kills for the log line of the ring
    re-formed with every device ("elastic: N workers now (was N-1)"), revives for the
    survivors' ring ("elastic: N-1 workers now (was N)").
    """
    faults: list[Fault] = []
    full = rf"elastic: {devices} workers now \(was {devices - 1}\)"
    shrunk = rf"elastic: {devices - 1} workers now \(was {devices}\)"
    for index, trial in enumerate(trials):
        trigger = r"epoch 1/" if index == 0 else full
        faults.append(Fault("kill", trial.device, trigger, trial.kill_delay_seconds))
        faults.append(Fault("revive", trial.device, shrunk, trial.revive_delay_seconds))
    return tuple(faults)


@dataclass(frozen=True)
class TrialMeasurement:
    """What one kill cost, in seconds from the kill (None: not seen)."""

    device: str
    killed_at: float
    seconds_kill_to_detect: float | None
    seconds_kill_to_next_step: float | None
    lost_steps: int | None
    seconds_revive_to_first_step: float | None
    hang: bool

    @property
    def seconds_detect_to_next_step(self) -> float | None:
        """The re-formation: rendezvous, trainer rebuilt for the new size, sync, first step."""
        if self.seconds_kill_to_detect is None or self.seconds_kill_to_next_step is None:
            return None
        return self.seconds_kill_to_next_step - self.seconds_kill_to_detect

    def as_row(self) -> dict[str, Any]:
        """Plain data for the trials CSV."""
        return {**self.__dict__, "seconds_detect_to_next_step": self.seconds_detect_to_next_step}


def _first(events: Sequence[Mapping[str, Any]], start: float, end: float) -> list[Any]:
    return [
        event
        for event in events
        if start <= event["detected_at"] < end and event.get("first_step_at") is not None
    ]


def measure_trials(
    faults: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    *,
    run_finished: bool,
) -> list[TrialMeasurement]:
    """One measurement per kill that was done, from the fault times and the elastic events.

    A kill's window runs to the next kill: the earliest membership change seen in it (a
    failed collective, or a removal noticed at a commit) is the survivors' reaction. A revive
    is measured to the first step of a ring that grew after it. A kill is a hang when no step
    followed it and the run did not finish (a kill after the last step is not a hang).
    """
    done = [fault for fault in faults if "error" not in fault]
    kills = [fault for fault in done if fault["action"] == "kill"]
    measurements = []
    for index, kill in enumerate(kills):
        end = kills[index + 1]["at"] if index + 1 < len(kills) else float("inf")
        reactions = _first(events, kill["at"], end)
        revive = next(
            (
                fault
                for fault in done
                if fault["action"] == "revive" and kill["at"] <= fault["at"] < end
            ),
            None,
        )
        grew = (
            [
                event
                for event in _first(events, revive["done_at"], end)
                if event.get("size_after", 0) > event.get("size_before", 0)
            ]
            if revive is not None
            else []
        )
        measurements.append(
            TrialMeasurement(
                device=kill["device"],
                killed_at=kill["at"],
                seconds_kill_to_detect=(
                    min(e["detected_at"] for e in reactions) - kill["at"] if reactions else None
                ),
                seconds_kill_to_next_step=(
                    min(e["first_step_at"] for e in reactions) - kill["at"] if reactions else None
                ),
                lost_steps=max(int(e.get("lost_steps", 0)) for e in reactions)
                if reactions
                else None,
                seconds_revive_to_first_step=(
                    min(e["first_step_at"] for e in grew) - revive["done_at"]
                    if grew and revive is not None
                    else None
                ),
                hang=not reactions and not run_finished,
            )
        )
    return measurements


def compute_utilisation(summary: Mapping[str, Any]) -> float | None:
    """Share of rank 0's wall time spent in the forward/backward pass (re-run steps included)."""
    return _share_of_wall(summary, ("compute",))


def step_utilisation(summary: Mapping[str, Any]) -> float | None:
    """Share of rank 0's wall time spent inside training steps (every phase, the exchange too).

    What is left is what churn costs (stalls, re-formations, rebuilt trainers) plus validation
    and commits; the gap to `compute_utilisation` is the exchange's cost.
    """
    return _share_of_wall(summary, None)


def _share_of_wall(summary: Mapping[str, Any], phases: Sequence[str] | None) -> float | None:
    wall = float(summary.get("wall_seconds") or 0.0)
    phase_seconds = summary.get("phase_seconds") or {}
    names = list(phase_seconds) if phases is None else list(phases)
    if wall <= 0 or not names or any(name not in phase_seconds for name in names):
        return None
    return sum(float(phase_seconds[name]) for name in names) / wall

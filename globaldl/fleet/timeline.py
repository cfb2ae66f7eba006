"""Horovod's background loop as rank 0's timeline shows it: exchanges and the cycles between.

A run started with `HOROVOD_TIMELINE=PATH` and `HOROVOD_TIMELINE_MARK_CYCLES=1` leaves rank 0's
timeline (Chrome trace events, written as the run goes, so an interrupted run leaves it without
its closing bracket). Every collective is a `B`/`E` pair of events on its tensor's row
(ALLREDUCE, ALLGATHER, BROADCAST, ...) and every coordination cycle of the loop a `CYCLE_START`
instant. Collectives that run one after another with no cycle between them came from one
cycle's responses: together they are one exchange.

Between one exchange's end and the next one's start the loop ran cycles; on a delayed link each
is a round trip of messages around the ranks, so how many it took is most of the wait. The
training thread's work after an exchange decides it: a round whose tensors are ready before
the loop's next cycle begins waits for that cycle; ready a moment later, for one more.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from globaldl.bench.results import spread

COLLECTIVES = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")
CYCLE_MARK = "CYCLE_START"


@dataclass(frozen=True)
class Exchange:
    """Collectives of one cycle's responses, run back to back."""

    kinds: tuple[str, ...]
    tensors: tuple[str, ...]
    start_seconds: float
    end_seconds: float

    @property
    def seconds(self) -> float:
        """From its first collective's start to its last one's end."""
        return self.end_seconds - self.start_seconds

    @property
    def kind(self) -> str:
        """Its collectives' kinds, each once (`ALLGATHER`, `ALLREDUCE+BROADCAST`)."""
        return "+".join(sorted(set(self.kinds)))


@dataclass(frozen=True)
class Wait:
    """The loop between two exchanges: how long, and the cycles it began meanwhile."""

    after: Exchange
    before: Exchange
    cycle_seconds: tuple[float, ...]  # each cycle's length: to the next cycle, or to `before`

    @property
    def seconds(self) -> float:
        """From one exchange's end to the next one's start."""
        return self.before.start_seconds - self.after.end_seconds

    @property
    def cycles(self) -> int:
        """Cycles begun between the two exchanges."""
        return len(self.cycle_seconds)

    def as_row(self) -> dict[str, Any]:
        """One table row: the next exchange, the wait before it and its cycles."""
        return {
            "start_seconds": round(self.before.start_seconds, 6),
            "kinds": self.before.kind,
            "wait_seconds": round(self.seconds, 6),
            "exchange_seconds": round(self.before.seconds, 6),
            "cycles": self.cycles,
            "cycle_seconds": [round(value, 6) for value in self.cycle_seconds],
        }


def read_events(path: Path) -> list[dict[str, Any]]:
    """A timeline's events, whether or not Horovod closed the file's JSON array."""
    text = Path(path).read_text().strip()
    if not text.startswith("["):
        raise ValueError(f"{path} is not a Horovod timeline (a JSON array of trace events)")
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    try:
        events = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not a readable Horovod timeline ({error})") from error
    return [event for event in events if isinstance(event, dict)]


def exchanges(
    events: Sequence[dict[str, Any]], cycles: Sequence[float] | None = None
) -> list[Exchange]:
    """The run's exchanges in time order: collectives merged while no cycle began between.

    `cycles`: the timeline's `cycle_starts`, where the caller has them already.
    """
    tensors = {
        event["pid"]: event["args"]["name"]
        for event in events
        if event.get("ph") == "M"
        and event.get("name") == "process_name"
        and "name" in event.get("args", {})
    }
    open_events: dict[Any, list[dict[str, Any]]] = {}
    operations: list[tuple[float, float, str, str]] = []
    for event in sorted(
        (event for event in events if event.get("ph") in ("B", "E")), key=lambda e: e["ts"]
    ):
        stack = open_events.setdefault(event.get("pid"), [])
        if event["ph"] == "B":
            stack.append(event)
        elif stack:
            begun = stack.pop()
            if begun.get("name") in COLLECTIVES:
                operations.append(
                    (
                        begun["ts"] / 1e6,
                        event["ts"] / 1e6,
                        str(begun["name"]),
                        tensors.get(begun.get("pid"), ""),
                    )
                )
    operations.sort()
    if cycles is None:
        cycles = cycle_starts(events)
    merged: list[Exchange] = []
    for start, end, kind, tensor in operations:
        if merged and not _cycles_between(cycles, merged[-1].end_seconds, start):
            last = merged[-1]
            merged[-1] = Exchange(
                (*last.kinds, kind),
                (*last.tensors, tensor),
                last.start_seconds,
                max(last.end_seconds, end),
            )
        else:
            merged.append(Exchange((kind,), (tensor,), start, end))
    return merged


def cycle_starts(events: Sequence[dict[str, Any]]) -> list[float]:
    """When each coordination cycle began, in seconds, in order."""
    return sorted(event["ts"] / 1e6 for event in events if event.get("name") == CYCLE_MARK)


def _cycles_between(cycles: Sequence[float], start: float, end: float) -> Sequence[float]:
    """The cycle starts at or after `start` and before `end` (`cycles` in order)."""
    return cycles[bisect.bisect_left(cycles, start) : bisect.bisect_left(cycles, end)]


def waits(events: Sequence[dict[str, Any]]) -> list[Wait]:
    """The loop between every two consecutive exchanges."""
    cycles = cycle_starts(events)
    if not cycles:
        raise ValueError(
            "the timeline marks no cycles: record it with HOROVOD_TIMELINE_MARK_CYCLES=1"
        )
    found = exchanges(events, cycles)
    result = []
    for after, before in zip(found, found[1:], strict=False):
        begun = list(_cycles_between(cycles, after.end_seconds, before.start_seconds))
        ends = [*begun[1:], before.start_seconds]
        lengths = tuple(end - start for start, end in zip(begun, ends, strict=True))
        result.append(Wait(after, before, lengths))
    return result


def summarize(found: Sequence[Wait], kinds: str | None = None) -> dict[str, Any]:
    """Medians and ranges of the waits before exchanges of `kinds` (e.g. "ALLGATHER"; all)."""
    chosen = [wait for wait in found if kinds is None or wait.before.kind == kinds]
    if not chosen:
        raise ValueError(f"no exchange of kinds {kinds!r} follows another in the timeline")
    cycle_lengths = [length for wait in chosen for length in wait.cycle_seconds]
    return {
        "kinds": kinds or "all",
        "exchanges": len(chosen),
        "wait_seconds": spread([wait.seconds for wait in chosen]),
        "exchange_seconds": spread([wait.before.seconds for wait in chosen]),
        "cycles_per_wait": dict(sorted(Counter(wait.cycles for wait in chosen).items())),
        "cycle_seconds": spread(cycle_lengths) if cycle_lengths else None,
    }

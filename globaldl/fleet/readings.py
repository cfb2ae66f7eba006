"""What `fleet run` reads from a run: device counters, each rank's output, Horovod's cycles.

From these and the run summary it builds the byte accounting (globaldl/fleet/accounting.py).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from globaldl.fleet.accounting import ByteAccounting, account_bytes
from globaldl.fleet.calibration import find_calibration
from globaldl.fleet.coordination import count_cycles
from globaldl.fleet.fleet import read_interface_counters
from globaldl.fleet.system import run

# Horovod's own default when HOROVOD_CYCLE_TIME is not set.
HOROVOD_DEFAULT_CYCLE_TIME_MS = 1.0


@dataclass
class WorkerOutput:
    """Bytes and lines of each rank's output, as horovodrun relays it (`[RANK]<stdout>:...`).

    A worker's output crosses its device's uplink inside the ssh session; horovodrun adds the
    prefix on this side, so the bytes on the wire are the line without it.
    """

    bytes_by_rank: Counter[int] = field(default_factory=Counter)
    lines_by_rank: Counter[int] = field(default_factory=Counter)

    PREFIX = re.compile(rb"\[(\d+)\]<(?:stdout|stderr)>:")

    def count(self, line: bytes) -> None:
        """Count one line of horovodrun's output (its own lines carry no rank and are skipped)."""
        match = self.PREFIX.search(line)
        if match:
            rank = int(match.group(1))
            self.bytes_by_rank[rank] += len(line) - match.end()
            self.lines_by_rank[rank] += 1


def read_tcp_counters(netns: str) -> dict[str, int]:
    """TCP segments a device sent and retransmitted (its namespace's /proc/net/snmp).

    A retransmitted segment crosses the uplink twice: on a shaped link whose queue outgrows
    the retransmission timeout, TCP resends data that was only delayed.
    """
    lines = [
        line.split()
        for line in run(["ip", "netns", "exec", netns, "cat", "/proc/net/snmp"]).stdout.splitlines()
        if line.startswith("Tcp:")
    ]
    if len(lines) != 2:
        raise ValueError(f"no Tcp counters in /proc/net/snmp of {netns}")
    values = dict(zip(lines[0][1:], lines[1][1:], strict=True))
    return {
        "tcp_out_segments": int(values["OutSegs"]),
        "tcp_retransmitted_segments": int(values["RetransSegs"]),
    }


def device_counters(name: str) -> dict[str, int]:
    """A device's interface counters and TCP segment counters, read from its namespace."""
    return {**read_interface_counters(name), **read_tcp_counters(name)}


def cycles_in_timeline(env: dict[str, str] | None, since_unix_seconds: float) -> int | None:
    """Horovod's cycles in the run, when it wrote a timeline marking them; else None.

    With HOROVOD_TIMELINE=PATH and HOROVOD_TIMELINE_MARK_CYCLES=1 rank 0 marks every cycle,
    and every rank runs the same cycles: the byte accounting then models coordination per
    cycle instead of per second. (The timeline's writer thread spins on rank 0's CPU: for
    accounting runs, not for timing ones.)
    """
    variables = env if env is not None else os.environ
    timeline = Path(variables.get("HOROVOD_TIMELINE", ""))
    if variables.get("HOROVOD_TIMELINE_MARK_CYCLES", "0") in ("", "0") or not timeline.is_file():
        return None
    if timeline.stat().st_mtime < since_unix_seconds:
        return None
    return count_cycles(timeline)


def cycle_time_ms_of(env: dict[str, str] | None) -> float:
    """HOROVOD_CYCLE_TIME of the run's environment, in ms (Horovod's default if unset)."""
    value = (env if env is not None else os.environ).get("HOROVOD_CYCLE_TIME")
    try:
        return float(value) if value else HOROVOD_DEFAULT_CYCLE_TIME_MS
    except ValueError:
        raise ValueError(f"HOROVOD_CYCLE_TIME must be a number of ms, got {value!r}") from None


def relay_output(source: IO[bytes], sink: IO[str], output: WorkerOutput) -> None:
    """Copy horovodrun's lines to our own stream, counting each rank's bytes."""
    target = getattr(sink, "buffer", None)
    for line in iter(source.readline, b""):
        output.count(line)
        if target is not None:
            target.write(line)
            target.flush()
        else:
            sink.write(line.decode(errors="replace"))
            sink.flush()


def account_fleet_run(
    counters_before: dict[str, dict[str, int]],
    counters_after: dict[str, dict[str, int]],
    summary_path: Path,
    seconds: float,
    *,
    output: WorkerOutput,
    env: dict[str, str] | None,
    started_unix_seconds: float,
    cpu_cores_per_device: float | None,
    round_trip_seconds: float = 0.0,
) -> ByteAccounting:
    """The byte accounting of a finished run, with the committed calibration if one matches."""
    summary = json.loads(Path(summary_path).read_text())
    cycle_time_ms = cycle_time_ms_of(env)
    return account_bytes(
        counters_before,
        counters_after,
        summary,
        seconds,
        log_bytes_by_rank=output.bytes_by_rank,
        summary_written_unix_seconds=Path(summary_path).stat().st_mtime,
        cycle_time_ms=cycle_time_ms,
        calibration=find_calibration(
            ranks=int(summary["ranks"]),
            cycle_time_ms=cycle_time_ms,
            cpu_cores_per_device=cpu_cores_per_device,
        ),
        coordination_cycles=cycles_in_timeline(env, since_unix_seconds=started_unix_seconds),
        round_trip_seconds=round_trip_seconds,
    )

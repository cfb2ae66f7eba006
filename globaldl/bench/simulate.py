"""What a projection costs: wall and CPU seconds of `globaldl simulate project` per device count.

Each repeat projects every device count once (counts interleaved across repeats, so a load
change hits them alike) with every exchange mode and the requested steps, in this process and
its SimGrid children. Reported per count: the median of the repeats with min-max, the machine's
load average around each measurement, and how the cost grows (the exponent of a power law
through consecutive counts).
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from globaldl.simulate.calibration import SimParameters
from globaldl.simulate.fleetdata import Observation
from globaldl.simulate.projection import ProjectionRequest, project

# The speed target: 10,000 devices for 100 steps in under 10 minutes on 2 cores.
TARGET_DEVICES = 10_000
TARGET_SECONDS = 600.0
COLUMNS = (
    "devices",
    "wall_seconds_median",
    "wall_seconds_min",
    "wall_seconds_max",
    "cpu_seconds_median",
    "cpu_seconds_min",
    "cpu_seconds_max",
    "load_average_1min",
    "repeats",
    "growth_exponent_from_previous",
)


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (SimGrid runs in children)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure_projection_cost(
    request: ProjectionRequest,
    observations: Sequence[Observation],
    parameters: SimParameters,
    profiles: dict[str, Any],
    repeats: int,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per device count: wall and CPU seconds (median, min, max) and load."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    samples: dict[int, list[tuple[float, float, float]]] = {n: [] for n in request.devices}
    for repeat in range(repeats):
        for devices in request.devices:
            single = ProjectionRequest(**{**request.__dict__, "devices": (devices,)})
            load_before = os.getloadavg()[0]
            cpu_before, started = _cpu_seconds(), time.monotonic()
            project(single, observations, parameters, profiles)
            wall = time.monotonic() - started
            cpu = _cpu_seconds() - cpu_before
            load = (load_before + os.getloadavg()[0]) / 2
            samples[devices].append((wall, cpu, load))
            if progress is not None:
                progress(
                    f"repeat {repeat + 1}/{repeats}, {devices} devices: {wall:.1f} s wall, "
                    f"{cpu:.1f} s CPU, load {load:.1f}"
                )
    rows = []
    for devices in request.devices:
        walls, cpus, loads = (np.array(values) for values in zip(*samples[devices], strict=True))
        rows.append(
            {
                "devices": devices,
                "wall_seconds_median": float(np.median(walls)),
                "wall_seconds_min": float(walls.min()),
                "wall_seconds_max": float(walls.max()),
                "cpu_seconds_median": float(np.median(cpus)),
                "cpu_seconds_min": float(cpus.min()),
                "cpu_seconds_max": float(cpus.max()),
                "load_average_1min": float(np.median(loads)),
                "repeats": len(walls),
            }
        )
    for previous, row in zip(rows, rows[1:], strict=False):
        row["growth_exponent_from_previous"] = math.log(
            row["cpu_seconds_median"] / max(previous["cpu_seconds_median"], 1e-9)
        ) / math.log(row["devices"] / previous["devices"])
    return rows


def target_verdict(rows: Sequence[dict[str, Any]]) -> str:
    """Whether 10,000 devices took under 10 minutes (median wall), as a sentence."""
    row = next((row for row in rows if row["devices"] == TARGET_DEVICES), None)
    if row is None:
        return f"target not evaluated: {TARGET_DEVICES} devices were not measured"
    met = row["wall_seconds_median"] < TARGET_SECONDS
    return (
        f"{TARGET_DEVICES} devices: median {row['wall_seconds_median']:.0f} s wall "
        f"(min {row['wall_seconds_min']:.0f}, max {row['wall_seconds_max']:.0f}), target "
        f"< {TARGET_SECONDS:.0f} s: {'met' if met else 'NOT met'}"
    )

"""`globaldl bench coordination`: Horovod's idle coordination per device count and cycle time.

For each device count a fleet comes up (its own state dir, prefix and subnet, an unshaped
link so that the traffic measured is Horovod's demand, not a link's cap); on it the
coordination probe (globaldl/fleet/coordination.py) runs once per cycle time and repeat,
cycle times interleaved. Each measurement is the byte accounting's calibration for that
fleet: per rank, frame and payload bytes per second and per cycle while idle, its init, and
the launch's ssh sessions. Rows give the median over repeats with min-max and the machine's
load average while they ran.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from globaldl.fleet.coordination import Calibration

STATE_DIR = Path("/run/globaldl-coordination")
PREFIX = "gdlc"
SUBNET = "10.79.0.0/24"
# tbf at 10 Gbit/s: far above what a device can push, so nothing queues or drops.
PROFILE = "custom:10000:10000"
DEFAULT_DEVICE_COUNTS = (2, 4, 8)
DEFAULT_CYCLE_TIMES_MS = (1.0, 5.0, 20.0, 50.0)
DEFAULT_CPU_CORES_PER_DEVICE = 0.25

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Measurement:
    """One probe run: a calibration, with the repeat it belongs to and the machine's load."""

    repeat: int
    load_average_1min: float
    calibration: Calibration

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "repeat": self.repeat,
            "load_average_1min": self.load_average_1min,
            **self.calibration.to_dict(),
        }


def _spread(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def summarise(measurements: Sequence[Measurement]) -> dict[str, Any]:
    """One table row for the repeats of one device count and cycle time: medians, min-max."""
    idle = [m.calibration.idle for m in measurements]
    first = idle[0]
    row: dict[str, Any] = {
        "devices": first.ranks,
        "horovod_cycle_time_ms": first.cycle_time_ms,
        "cpu_cores_per_device": measurements[0].calibration.cpu_cores_per_device,
        "repeats": len(measurements),
    }
    for name, values in (
        ("tx_bytes_per_second_per_device", [i.mean_tx_bytes_per_second for i in idle]),
        ("max_tx_bytes_per_cycle", [i.max_tx_bytes_per_cycle for i in idle]),
        (
            "payload_bytes_per_cycle_per_device",
            [statistics.fmean(i.payload_bytes_per_cycle) for i in idle],
        ),
        ("cycles_on_time_share", [i.cycles_on_time_share for i in idle]),
        ("launch_payload_bytes", [m.calibration.launch_payload_bytes for m in measurements]),
    ):
        median, low, high = _spread(values)
        row[name] = median
        row[f"{name}_min"] = low
        row[f"{name}_max"] = high
    row["load_average_1min_max"] = max(m.load_average_1min for m in measurements)
    return row


def median_calibration(measurements: Sequence[Measurement]) -> Calibration:
    """The repeat whose mean idle bytes per second is the median one (the committed entry)."""
    ordered = sorted(measurements, key=lambda m: m.calibration.idle.mean_tx_bytes_per_second)
    return ordered[(len(ordered) - 1) // 2].calibration


def run_coordination_bench(
    *,
    device_counts: Sequence[int] = DEFAULT_DEVICE_COUNTS,
    cycle_times_ms: Sequence[float] = DEFAULT_CYCLE_TIMES_MS,
    cpu_cores_per_device: float = DEFAULT_CPU_CORES_PER_DEVICE,
    repeats: int = 3,
    idle_seconds: float = 8.0,
    progress: Progress = print,
) -> dict[tuple[int, float], list[Measurement]]:
    """Every (device count, cycle time) measured `repeats` times, cycle times interleaved."""
    from globaldl.fleet.calibration import measure_calibration
    from globaldl.fleet.fleet import Fleet
    from globaldl.fleet.plan import plan_fleet
    from globaldl.fleet.profiles import DEFAULT_PROFILES_PATH, device_profiles, load_profiles
    from globaldl.fleet.state import DEFAULT_STATE_DIR

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not idle_seconds > 0:
        raise ValueError(f"idle_seconds must be > 0, got {idle_seconds}")
    for state_dir in (STATE_DIR, DEFAULT_STATE_DIR):
        if Fleet(state_dir).state() is not None:
            raise ValueError(
                f"a fleet is up in {state_dir}: it would compete for the cores and skew the "
                f"cycle rate; bring it down with `globaldl fleet down --state-dir {state_dir}`"
            )
    profiles = load_profiles(DEFAULT_PROFILES_PATH)
    plans = {
        devices: plan_fleet(
            device_profiles(profiles, devices=devices, profile=PROFILE),
            prefix=PREFIX,
            subnet=SUBNET,
            cpu_cores=cpu_cores_per_device,
        )
        for devices in device_counts
    }
    results: dict[tuple[int, float], list[Measurement]] = {}
    total = len(device_counts) * len(cycle_times_ms) * repeats
    for devices, plan in plans.items():
        fleet = Fleet(STATE_DIR)
        fleet.up(plan, latency="off")
        try:
            for repeat in range(repeats):
                # Rotate the order each repeat, so that no cycle time always runs first.
                order = [*cycle_times_ms[repeat % len(cycle_times_ms) :], *cycle_times_ms]
                for cycle_time_ms in order[: len(cycle_times_ms)]:
                    load = os.getloadavg()[0]
                    calibration = measure_calibration(
                        fleet, cycle_time_ms=cycle_time_ms, idle_seconds=idle_seconds
                    )
                    measurements = results.setdefault((devices, cycle_time_ms), [])
                    measurements.append(Measurement(repeat, load, calibration))
                    done = sum(len(m) for m in results.values())
                    progress(
                        f"[{done}/{total}] {devices} devices, cycle {cycle_time_ms:g} ms: "
                        f"{calibration.idle.mean_tx_bytes_per_second / 1000:.1f} kB/s per "
                        f"device, {calibration.idle.cycles_on_time_share:.0%} of cycles on time, "
                        f"load {load:.1f}"
                    )
        finally:
            fleet.down()
    return results


def coordination_rule_check(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Whether the auto cycle-time rule's bytes per cycle cover the busiest rank measured."""
    from globaldl.fleet.cycle_time import COORDINATION_BYTES_PER_CYCLE

    measured = max((row["max_tx_bytes_per_cycle"] for row in rows), default=None)
    if measured is None:
        return {"goal": "rule covers the busiest rank", "status": "not evaluated", "measured": ""}
    return {
        "goal": f"COORDINATION_BYTES_PER_CYCLE ({COORDINATION_BYTES_PER_CYCLE} B, the auto "
        "cycle-time rule's figure) >= the busiest rank's frame bytes per cycle",
        "status": "met" if COORDINATION_BYTES_PER_CYCLE >= measured else "NOT met",
        "measured": f"{measured:.0f} B per cycle (median of repeats, worst device count and "
        "cycle time)",
    }


def plot(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """coordination.png: idle bytes per second per device against the cycle time."""
    from globaldl.experiments.outputs import save_figure
    from globaldl.fleet.cycle_time import COORDINATION_BYTES_PER_CYCLE

    def draw(figure: Any) -> None:
        axis = figure.subplots()
        for index, devices in enumerate(sorted({row["devices"] for row in rows})):
            points = sorted(
                (row for row in rows if row["devices"] == devices),
                key=lambda row: row["horovod_cycle_time_ms"],
            )
            medians = [row["tx_bytes_per_second_per_device"] / 1000 for row in points]
            axis.errorbar(
                [row["horovod_cycle_time_ms"] for row in points],
                medians,
                yerr=[
                    [
                        m - row["tx_bytes_per_second_per_device_min"] / 1000
                        for m, row in zip(medians, points, strict=True)
                    ],
                    [
                        row["tx_bytes_per_second_per_device_max"] / 1000 - m
                        for m, row in zip(medians, points, strict=True)
                    ],
                ],
                marker="o",
                capsize=3,
                color=f"C{index}",
                label=f"{devices} devices (median, min-max)",
            )
        cycles = sorted({row["horovod_cycle_time_ms"] for row in rows})
        axis.plot(
            cycles,
            [COORDINATION_BYTES_PER_CYCLE / cycle for cycle in cycles],
            linestyle="--",
            color="grey",
            label=f"auto rule: {COORDINATION_BYTES_PER_CYCLE} B per cycle",
        )
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        axis.set_xscale("log")
        axis.set_yscale("log")
        for scale in (axis.xaxis, axis.yaxis):
            # Plain numbers on the log axes, no minor-tick labels.
            scale.set_major_formatter(ScalarFormatter())
            scale.set_minor_formatter(NullFormatter())
        axis.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_xticks(cycles, [f"{cycle:g}" for cycle in cycles])
        axis.set_xlabel("HOROVOD_CYCLE_TIME (ms)")
        axis.set_ylabel("kB/s sent per device while idle (frames)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)

    return save_figure(path, draw)

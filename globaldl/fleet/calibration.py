"""The byte accounting's calibration: measure it on a fleet, and find the committed one.

`globaldl bench coordination` measures, per device count and HOROVOD_CYCLE_TIME, what a
device sends to launch a run (horovodrun's ssh sessions), to start Horovod, and per second of
idle coordination, and commits it to results/bench/coordination.json. `fleet run` looks up
the entry for its run there; the accounting then models those parts too.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from globaldl.fleet.coordination import (
    Calibration,
    IdleCoordination,
    InterfaceDelta,
    probe_argv,
    probe_payload_bytes,
    read_probe_records,
)

DEFAULT_CALIBRATION_PATH = Path(__file__).resolve().parents[2] / "results/bench/coordination.json"
DEFAULT_IDLE_SECONDS = 8.0
DEFAULT_SETTLE_SECONDS = 2.0


def load_calibrations(path: Path = DEFAULT_CALIBRATION_PATH) -> list[Calibration]:
    """Every calibration in a `globaldl bench coordination` results file ([] if none)."""
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return []
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read calibration file {path}: {error}") from error
    return [Calibration.from_dict(entry) for entry in document.get("calibrations", [])]


def find_calibration(
    *,
    ranks: int,
    cycle_time_ms: float,
    cpu_cores_per_device: float | None,
    path: Path = DEFAULT_CALIBRATION_PATH,
) -> Calibration | None:
    """The committed calibration for `ranks` devices at `cycle_time_ms` (nearest CPU), or None."""
    matching = [
        calibration
        for calibration in load_calibrations(path)
        if calibration.idle.ranks == ranks and calibration.idle.cycle_time_ms == cycle_time_ms
    ]
    if not matching:
        return None
    if cpu_cores_per_device is None:
        return matching[0]
    return min(
        matching,
        key=lambda calibration: abs(
            (calibration.cpu_cores_per_device or cpu_cores_per_device) - cpu_cores_per_device
        ),
    )


def _environment(cycle_time_ms: float) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GLOBALDL_")}
    env["HOROVOD_CYCLE_TIME"] = f"{cycle_time_ms:g}"
    # The probe opens rank 0's timeline over its idle window only, to count the cycles.
    env["HOROVOD_TIMELINE"] = "DYNAMIC"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def measure_calibration(
    fleet: Any,
    *,
    cycle_time_ms: float,
    idle_seconds: float = DEFAULT_IDLE_SECONDS,
    settle_seconds: float = DEFAULT_SETTLE_SECONDS,
    run_id: str = "calibrate",
) -> Calibration:
    """Run the coordination probe on every live device at `cycle_time_ms`.

    The idle rates and init bytes come from the probe's own counters; the launch cost of a
    device is its whole run (interface counters around `fleet run`) minus the probe's spans
    and its output lines: horovodrun's ssh sessions.
    """
    from globaldl.fleet.fleet import DEVICE_INTERFACE
    from globaldl.fleet.launcher import run_on_fleet
    from globaldl.fleet.request import ProgramRequest

    with tempfile.TemporaryDirectory(prefix="gdl-coordination-") as directory:
        probe = probe_argv(Path(directory), settle_seconds, idle_seconds, DEVICE_INTERFACE)
        result = run_on_fleet(
            fleet,
            ProgramRequest(tuple(probe), run_id=run_id),
            timeout_seconds=idle_seconds + settle_seconds + 300,
            env=_environment(cycle_time_ms),
        )
        if result.returncode != 0:
            raise RuntimeError(f"the coordination probe failed with exit {result.returncode}")
        records = read_probe_records(Path(directory))
    idle = IdleCoordination.from_probe_records(records)
    launch = []
    for record in records:
        name = record["host"]
        if name not in result.counters_before:
            raise RuntimeError(f"probe rank {record['rank']} ran on unknown device {name!r}")
        whole = InterfaceDelta(
            result.counters_after[name]["tx_bytes"] - result.counters_before[name]["tx_bytes"],
            result.counters_after[name]["tx_packets"] - result.counters_before[name]["tx_packets"],
        )
        launch.append(
            whole.payload_bytes
            - probe_payload_bytes(record)
            - result.worker_output.bytes_by_rank[record["rank"]]
        )
    devices = fleet.live_devices()
    return Calibration(
        launch_payload_bytes=statistics.fmean(launch),
        idle=idle,
        cpu_cores_per_device=devices[0].cpu_cores if devices else None,
    )

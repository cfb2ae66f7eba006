"""The coordination probe's records, combined into a calibration (no root needed)."""

from __future__ import annotations

import json

import pytest

from globaldl.fleet.calibration import find_calibration
from globaldl.fleet.coordination import (
    HEADER_BYTES_PER_PACKET,
    Calibration,
    IdleCoordination,
    count_cycles,
    probe_payload_bytes,
)


def _record(rank: int, idle_tx: int, idle_packets: int, **extra: object) -> dict:
    span = {"tx_bytes": 1_000, "tx_packets": 10}
    return {
        "rank": rank,
        "ranks": 2,
        "host": f"d{rank + 1}",
        "cycle_time_ms": 50.0,
        "init": span,
        "settle": span,
        "idle": {"tx_bytes": idle_tx, "tx_packets": idle_packets},
        "idle_seconds": 4.0,
        "shutdown": span,
        **extra,
    }


def test_idle_rates_per_rank_and_per_cycle_come_from_the_probe_records():
    records = [_record(1, 40_000, 400), _record(0, 20_000, 200, idle_cycles=60)]
    idle = IdleCoordination.from_probe_records(records)
    assert idle.ranks == 2 and idle.cycles_per_second == 15
    assert idle.tx_bytes_per_second == (5_000, 10_000)
    payload_rank0 = (20_000 - HEADER_BYTES_PER_PACKET * 200) / 4
    assert idle.payload_bytes_per_second[0] == payload_rank0
    assert idle.payload_bytes_per_cycle[0] == pytest.approx(payload_rank0 / 15)
    # 15 cycles/s where 50 ms allows 20: the loop ran late a quarter of the time.
    assert idle.cycles_on_time_share == pytest.approx(0.75)
    assert idle.max_tx_bytes_per_cycle == pytest.approx(10_000 / 15)
    assert IdleCoordination.from_dict(idle.to_dict()) == idle
    assert probe_payload_bytes(records[0]) == 3 * (1_000 - HEADER_BYTES_PER_PACKET * 10) + (
        40_000 - HEADER_BYTES_PER_PACKET * 400
    )


def test_records_that_miss_a_rank_or_the_cycle_count_are_refused():
    with pytest.raises(ValueError, match="do not cover ranks 0..N-1 once"):
        IdleCoordination.from_probe_records([_record(1, 1, 1)])
    with pytest.raises(ValueError, match="HOROVOD_TIMELINE=DYNAMIC"):
        IdleCoordination.from_probe_records([_record(0, 1, 1), _record(1, 1, 1)])


def test_cycles_are_counted_from_horovods_timeline_markers(tmp_path):
    timeline = tmp_path / "t.json"
    events = [{"ph": "i", "name": "CYCLE_START", "ts": t, "s": "g"} for t in range(3)]
    events.append({"ph": "B", "name": "NEGOTIATE_ALLGATHER", "ts": 5})
    # Horovod writes `"name": "..."` with a space after the colon, as json.dumps does.
    timeline.write_text(json.dumps(events))
    assert count_cycles(timeline) == 3


def test_the_committed_calibration_is_found_by_device_count_cycle_time_and_nearest_cpu(tmp_path):
    def calibration(ranks: int, cycle: float, cpu: float) -> dict:
        idle = IdleCoordination(
            ranks, cycle, (1.0,) * ranks, (1.0,) * ranks, (1.0,) * ranks, (1,) * ranks, 10.0
        )
        return Calibration(100.0, idle, cpu).to_dict()

    path = tmp_path / "coordination.json"
    path.write_text(
        json.dumps(
            {
                "calibrations": [
                    calibration(4, 5.0, 0.25),
                    calibration(4, 5.0, 0.5),
                    calibration(2, 5.0, 0.5),
                ]
            }
        )
    )
    found = find_calibration(ranks=4, cycle_time_ms=5.0, cpu_cores_per_device=0.4, path=path)
    assert found is not None and found.cpu_cores_per_device == 0.5
    assert find_calibration(ranks=8, cycle_time_ms=5.0, cpu_cores_per_device=0.5, path=path) is None
    assert (
        find_calibration(
            ranks=4, cycle_time_ms=5.0, cpu_cores_per_device=0.5, path=tmp_path / "none.json"
        )
        is None
    )

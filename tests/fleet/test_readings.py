"""What `fleet run` reads back from a run: output per rank, cycle time, cycles (no root)."""

from __future__ import annotations

import json
import time

import pytest

from globaldl.fleet import readings


def test_each_ranks_output_is_counted_without_horovods_prefix():
    output = readings.WorkerOutput()
    output.count(b"[0]<stdout>:epoch 1/1  loss 2.1\n")
    output.count(b"[1]<stderr>:warning\n")
    output.count(b"[1]<stdout>:x\n")
    output.count(b"Launching horovod task function\n")  # horovodrun's own line
    assert output.bytes_by_rank == {0: len(b"epoch 1/1  loss 2.1\n"), 1: len(b"warning\n") + 2}
    assert output.lines_by_rank == {0: 1, 1: 2}


def test_the_cycle_time_comes_from_the_runs_environment():
    assert readings.cycle_time_ms_of({"HOROVOD_CYCLE_TIME": "5"}) == 5.0
    assert readings.cycle_time_ms_of({}) == readings.HOROVOD_DEFAULT_CYCLE_TIME_MS
    with pytest.raises(ValueError, match="HOROVOD_CYCLE_TIME must be a number of ms, got 'x'"):
        readings.cycle_time_ms_of({"HOROVOD_CYCLE_TIME": "x"})


def test_cycles_are_read_from_this_runs_cycle_marking_timeline_only(tmp_path):
    timeline = tmp_path / "timeline.json"
    timeline.write_text(json.dumps([{"ph": "i", "name": "CYCLE_START", "ts": 1, "s": "g"}] * 7))
    env = {"HOROVOD_TIMELINE": str(timeline), "HOROVOD_TIMELINE_MARK_CYCLES": "1"}
    assert readings.cycles_in_timeline(env, since_unix_seconds=0) == 7
    # Cycles not marked, or a timeline older than the run: not counted.
    assert readings.cycles_in_timeline({**env, "HOROVOD_TIMELINE_MARK_CYCLES": "0"}, 0) is None
    assert readings.cycles_in_timeline(env, since_unix_seconds=time.time() + 60) is None
    assert readings.cycles_in_timeline({}, since_unix_seconds=0) is None

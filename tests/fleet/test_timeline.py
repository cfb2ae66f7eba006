"""`globaldl fleet timeline`: exchanges and coordination cycles read from a Horovod timeline.

The events below have the shape Horovod 0.28.1 writes (a fleet run's rank 0, LeNet in rounds of
16 on 50 ms links): a row per tensor named by a metadata event, `B`/`E` pairs per operation
(the negotiation, the collective, its Gloo part nested inside), `CYCLE_START` instants. A real
timeline from a fleet run is read in tests/fleet/test_horovod_run.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from globaldl.fleet.timeline import exchanges, read_events, summarize, waits

BIN = Path(sys.executable).parent


def _tensor(pid: int, name: str) -> dict:
    return {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}


def _span(pid: int, name: str, start: float, end: float) -> list[dict]:
    return [
        {"ph": "B", "name": name, "ts": int(start * 1e6), "pid": pid},
        {"ph": "E", "ts": int(end * 1e6), "pid": pid},
    ]


def _cycle(at: float) -> dict:
    return {"ph": "i", "name": "CYCLE_START", "ts": int(at * 1e6), "s": "g"}


def _run() -> list[dict]:
    """Two broadcasts in one cycle, then two rounds: a 2-cycle and a 3-cycle wait."""
    events = [_tensor(1, "w0"), _tensor(2, "w1"), _tensor(3, "gradients"), _cycle(0.5)]
    events += _span(1, "BROADCAST", 1.0, 1.2) + _span(2, "BROADCAST", 1.2, 1.4)
    # Round 1: cycles at 1.4 and 1.8, the allgather at 2.4 (its Gloo part nested inside).
    events += [_cycle(1.4), _cycle(1.8)]
    events += _span(3, "NEGOTIATE_ALLGATHER", 2.4, 2.4)
    events += [
        {"ph": "B", "name": "ALLGATHER", "ts": 2_400_000, "pid": 3},
        {"ph": "B", "name": "GLOO_ALLGATHER", "ts": 2_400_010, "pid": 3},
        {"ph": "E", "ts": 3_199_990, "pid": 3},
        {"ph": "E", "ts": 3_200_000, "pid": 3},
    ]
    # Round 2: one cycle more (the round's work ended after the second cycle began).
    events += [_cycle(3.2), _cycle(3.6), _cycle(4.3)]
    events += _span(3, "ALLGATHER", 4.9, 5.7)
    return events


def test_back_to_back_collectives_are_one_exchange_and_waits_count_cycles() -> None:
    events = _run()
    found = exchanges(events)
    assert [exchange.kinds for exchange in found] == [
        ("BROADCAST", "BROADCAST"),
        ("ALLGATHER",),
        ("ALLGATHER",),
    ]
    assert found[0].seconds == pytest.approx(0.4)
    first, second = waits(events)
    assert first.cycles == 2 and first.seconds == pytest.approx(1.0)
    assert first.cycle_seconds == pytest.approx((0.4, 0.6))
    assert second.cycles == 3 and second.seconds == pytest.approx(1.7)
    assert second.before.seconds == pytest.approx(0.8)
    summary = summarize(waits(events), "ALLGATHER")
    assert summary["exchanges"] == 2
    assert summary["cycles_per_wait"] == {2: 1, 3: 1}
    assert summary["wait_seconds"]["median"] == pytest.approx(1.35)
    assert summary["cycle_seconds"]["max"] == pytest.approx(0.7)


def test_an_unclosed_timeline_is_read_and_bad_ones_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "timeline.json"
    # Horovod writes events as the run goes: a run that was stopped leaves no closing bracket.
    path.write_text("[\n" + ",\n".join(json.dumps(event) for event in _run()) + ",\n")
    assert len(waits(read_events(path))) == 2
    path.write_text('{"not": "a timeline"}')
    with pytest.raises(ValueError, match="not a Horovod timeline"):
        read_events(path)
    no_cycles = [event for event in _run() if event.get("name") != "CYCLE_START"]
    with pytest.raises(ValueError, match="HOROVOD_TIMELINE_MARK_CYCLES=1"):
        waits(no_cycles)
    with pytest.raises(ValueError, match="no exchange of kinds 'ALLREDUCE'"):
        summarize(waits(_run()), "ALLREDUCE")


def test_the_command_prints_every_wait_and_writes_them(tmp_path: Path) -> None:
    path, out = tmp_path / "timeline.json", tmp_path / "waits.json"
    path.write_text(json.dumps(_run()))
    command = [str(BIN / "globaldl"), "fleet", "timeline", str(path), "--kinds", "ALLGATHER"]
    done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "2 exchanges (ALLGATHER)" in done.stdout and "2: 1x, 3: 1x" in done.stdout
    written = json.loads(out.read_text())
    assert [row["cycles"] for row in written["waits"]] == [2, 3]
    missing = subprocess.run(
        [str(BIN / "globaldl"), "fleet", "timeline", str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and "no timeline at" in missing.stderr

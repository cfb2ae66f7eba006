"""What `fleet run` tells horovodrun, and what it reads back from a run (no root needed)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from globaldl.fleet import launcher
from globaldl.fleet.profiles import LinkProfile
from globaldl.fleet.state import DeviceState


def _addresses(**interfaces: int) -> dict[str, list[SimpleNamespace]]:
    return {name: [SimpleNamespace(family=family)] for name, family in interfaces.items()}


def test_horovodrun_gets_the_devices_interface_unless_another_is_asked_for(monkeypatch):
    import psutil

    monkeypatch.setattr(
        psutil, "net_if_addrs", lambda: _addresses(lo=socket.AF_INET, eth0=socket.AF_INET)
    )
    # Never left to Horovod's probe, which picks lo or eth0 at random on one device.
    assert launcher.horovod_network_interface(None) == "eth0"
    assert launcher.horovod_network_interface("lo") == "lo"


def test_an_interface_without_an_ipv4_address_on_this_host_is_refused(monkeypatch):
    import psutil

    monkeypatch.setattr(
        psutil, "net_if_addrs", lambda: _addresses(ens3=socket.AF_INET, eth0=socket.AF_INET6)
    )
    with pytest.raises(ValueError, match="no IPv4 address on 'eth0'.*with one: ens3"):
        launcher.horovod_network_interface(None)


def test_horovodrun_checks_ssh_afresh_on_every_run():
    device = DeviceState(
        name="a-1",
        address="10.1.0.2",
        host_interface="a-1-h",
        profile=LinkProfile("p", 1, 1),
        cpu_cores=1,
        memory_bytes=2**30,
        cpu_group="/c",
        memory_group="/m",
        host_key_public="ssh-ed25519 AAAA",
    )
    argv = launcher.horovodrun_argv([device], Path("/k"), ["true"], network_interface="eth0")
    assert "--disable-cache" in argv
    assert argv[argv.index("--network-interface") + 1] == "eth0"


def test_each_ranks_output_is_counted_without_horovods_prefix():
    output = launcher.WorkerOutput()
    output.count(b"[0]<stdout>:epoch 1/1  loss 2.1\n")
    output.count(b"[1]<stderr>:warning\n")
    output.count(b"[1]<stdout>:x\n")
    output.count(b"Launching horovod task function\n")  # horovodrun's own line
    assert output.bytes_by_rank == {0: len(b"epoch 1/1  loss 2.1\n"), 1: len(b"warning\n") + 2}
    assert output.lines_by_rank == {0: 1, 1: 2}


def test_the_cycle_time_comes_from_the_runs_environment():
    assert launcher.cycle_time_ms_of({"HOROVOD_CYCLE_TIME": "5"}) == 5.0
    assert launcher.cycle_time_ms_of({}) == launcher.HOROVOD_DEFAULT_CYCLE_TIME_MS
    with pytest.raises(ValueError, match="HOROVOD_CYCLE_TIME must be a number of ms, got 'x'"):
        launcher.cycle_time_ms_of({"HOROVOD_CYCLE_TIME": "x"})


def test_cycles_are_read_from_this_runs_cycle_marking_timeline_only(tmp_path):
    timeline = tmp_path / "timeline.json"
    timeline.write_text(json.dumps([{"ph": "i", "name": "CYCLE_START", "ts": 1, "s": "g"}] * 7))
    env = {"HOROVOD_TIMELINE": str(timeline), "HOROVOD_TIMELINE_MARK_CYCLES": "1"}
    assert launcher.cycles_in_timeline(env, since_unix_seconds=0) == 7
    # Cycles not marked, or a timeline older than the run: not counted.
    assert launcher.cycles_in_timeline({**env, "HOROVOD_TIMELINE_MARK_CYCLES": "0"}, 0) is None
    assert launcher.cycles_in_timeline(env, since_unix_seconds=time.time() + 60) is None
    assert launcher.cycles_in_timeline({}, since_unix_seconds=0) is None

"""The machine-load record: CPU outside the fleet from /proc/stat and cgroup accounting."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from globaldl.experiments.load import (
    BusyLimits,
    CpuSample,
    LoadSources,
    MachineLoad,
    ProcessGroupCpu,
    machine_busy_seconds,
)

TICKS = os.sysconf("SC_CLK_TCK")


def _sample(at: float, machine: float, fleet: float | None, runner: float = 0.0) -> CpuSample:
    return CpuSample(
        at=at,
        machine_seconds=machine,
        fleet_seconds=fleet,
        emulation_seconds=None,
        emulation_in_fleet=False,
        launcher_seconds=0.0,
        runner_seconds=runner,
        load_average_1m=1.0,
    )


def test_machine_busy_time_counts_every_state_but_idle_and_iowait(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(f"cpu  {TICKS * 10} {TICKS} {TICKS * 2} 999999 777 0 {TICKS} 0 5 0\ncpu0 1\n")
    assert machine_busy_seconds(stat) == pytest.approx(14.0)


def test_a_run_is_busy_when_work_outside_the_fleet_uses_more_than_a_tenth_of_a_core() -> None:
    # 100 s: the machine used 150 CPU s, the fleet 120, the runner 10: 20 s outside = 0.2 cores.
    samples = [_sample(0, 0, 0), _sample(50, 75, 60, 5), _sample(100, 150, 120, 10)]
    load = MachineLoad.from_samples(samples, BusyLimits())
    assert load.outside_cores_mean == pytest.approx(0.2)
    assert load.devices_cpu_seconds == pytest.approx(120)
    assert load.driver_cpu_seconds == pytest.approx(10)
    assert load.busy is True and "0.20 cores used outside the fleet on average" in load.busy_reason
    quiet = MachineLoad.from_samples([_sample(0, 0, 0), _sample(100, 125, 120, 2)], BusyLimits())
    assert quiet.busy is False and quiet.text().endswith("quiet")


def test_a_short_burst_outside_the_fleet_is_caught_by_the_peak_though_the_mean_is_low() -> None:
    # 300 s sampled every 2 s; outside work takes one core from 100 s to 110 s only.
    samples, outside = [], 0.0
    for step in range(151):
        at = 2.0 * step
        if 100 < at <= 110:
            outside += 2.0
        samples.append(_sample(at, machine=at * 1.5 + outside, fleet=at * 1.5))
    load = MachineLoad.from_samples(samples, BusyLimits())
    assert load.outside_cores_mean == pytest.approx(10 / 300)
    assert load.outside_cores_peak == pytest.approx(1.0)
    assert load.busy is True and "for 10 s" in load.busy_reason
    assert MachineLoad.from_dict(load.to_dict()) == load


def test_without_cgroup_accounting_the_outside_load_is_unknown_not_zero() -> None:
    load = MachineLoad.from_samples([_sample(0, 0, None), _sample(10, 15, None)], BusyLimits())
    assert load.outside_cpu_seconds is None and load.busy is None
    assert "not measured" in load.text()


def test_sources_read_the_fleet_link_emulation_and_launcher_groups_apart(tmp_path: Path) -> None:
    fleet = tmp_path / "gdlx-fleet"
    for group, nanoseconds in (("", 9e9), ("emulation", 2e9), ("launcher", 1e9)):
        (fleet / group).mkdir(parents=True, exist_ok=True)
        (fleet / group / "cpuacct.usage").write_text(f"{int(nanoseconds)}\n")
    stat = tmp_path / "stat"
    stat.write_text(f"cpu  {TICKS * 20} 0 0 0 0 0 0 0 0 0\n")
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.42 0.30 0.20 1/90 1234\n")
    sources = LoadSources(
        fleet_group=fleet,
        emulation_group=fleet / "emulation",
        launcher_group=fleet / "launcher",
        proc_stat=stat,
        loadavg=loadavg,
    )
    first = sources.sample()
    assert (first.fleet_seconds, first.emulation_seconds, first.launcher_seconds) == (9, 2, 1)
    assert first.emulation_in_fleet and first.load_average_1m == 0.42
    # Later: devices +4 s, emulation +1 s, launcher +1 s (all inside the fleet's 9 -> 15 s).
    (fleet / "cpuacct.usage").write_text(str(int(15e9)))
    (fleet / "emulation" / "cpuacct.usage").write_text(str(int(3e9)))
    (fleet / "launcher" / "cpuacct.usage").write_text(str(int(2e9)))
    stat.write_text(f"cpu  {TICKS * 28} 0 0 0 0 0 0 0 0 0\n")
    second = sources.sample()
    load = MachineLoad.from_samples([first, replace(second, at=first.at + 10)], BusyLimits())
    assert load.devices_cpu_seconds == pytest.approx(4)
    assert load.emulation_cpu_seconds == pytest.approx(1)
    runner = second.runner_seconds - first.runner_seconds
    assert load.driver_cpu_seconds == pytest.approx(1 + runner)
    assert load.outside_cpu_seconds == pytest.approx(8 - 6 - runner)


def test_processes_of_a_group_without_accounting_are_summed_from_proc(tmp_path: Path) -> None:
    group = tmp_path / "emulation"
    group.mkdir()
    (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    counter = ProcessGroupCpu(group)
    assert counter.read() == 0.0  # the first read is the baseline
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert counter.read() >= 0.2
    assert ProcessGroupCpu(tmp_path / "missing").read() is None

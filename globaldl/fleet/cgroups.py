"""CPU quota, memory limit and CPU accounting of the emulated devices, as cgroup v1 groups."""

from __future__ import annotations

import os
import time
from pathlib import Path

from globaldl.fleet.system import kill_processes

CPU_PERIOD_MICROSECONDS = 100_000
# The kernel refuses cfs quotas below 1 ms.
MIN_CPU_QUOTA_MICROSECONDS = 1_000
CONTROLLERS = ("cpu", "memory")
# Counts the CPU time of a group and its children (cpuacct.usage); the machine-load record of
# the experiments reads it. Where cpu and cpuacct share a hierarchy the cpu group counts.
ACCOUNTING_CONTROLLER = "cpuacct"
# User-space link emulation (vde_switch, wirefilter) runs in `<prefix>-fleet/emulation`, never in
# a device's group: its CPU is the network's, counted apart (cpuacct) and outside device quotas.
EMULATION_GROUP = "emulation"
# Forwarding stands for the network, which on real devices costs them no CPU: weigh it far above
# any device group (1024 each) so that a busy fleet does not delay its own packets. No quota.
EMULATION_CPU_SHARES = 16384


def cgroup_v1_mount(controller: str, mountinfo: Path = Path("/proc/self/mountinfo")) -> Path:
    """Where the cgroup v1 hierarchy holding `controller` is mounted; ValueError if it is not."""
    for line in mountinfo.read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        filesystem, super_options = fields[separator + 1], fields[separator + 3]
        if filesystem == "cgroup" and controller in super_options.split(","):
            return Path(fields[4])
    raise ValueError(
        f"the cgroup v1 {controller!r} controller is not mounted (see /proc/self/mountinfo); the "
        f"fleet limits devices with cgroup v1 {', '.join(CONTROLLERS)} controllers"
    )


def fleet_controllers() -> tuple[str, ...]:
    """The controllers a fleet creates its groups in: cpu, memory, and cpuacct if separate.

    cpuacct gets groups only where it has a hierarchy of its own; where it is not mounted at
    all the fleet's CPU time goes unaccounted.
    """
    try:
        accounting = cgroup_v1_mount(ACCOUNTING_CONTROLLER)
    except ValueError:
        return CONTROLLERS
    if accounting == cgroup_v1_mount("cpu"):
        return CONTROLLERS
    return (*CONTROLLERS, ACCOUNTING_CONTROLLER)


def accounting_group(cpu_group: Path) -> Path:
    """The group that counts the CPU time of `cpu_group`'s processes (same path in cpuacct)."""
    return cgroup_v1_mount(ACCOUNTING_CONTROLLER) / Path(cpu_group).relative_to(
        cgroup_v1_mount("cpu")
    )


def groups_to_join(cpu_group: Path, memory_group: Path) -> list[Path]:
    """The groups a device's processes belong to: its limits, and its accounting if separate."""
    groups = [Path(cpu_group), Path(memory_group)]
    if ACCOUNTING_CONTROLLER in fleet_controllers():
        accounting = accounting_group(cpu_group)
        if accounting.exists():  # a fleet brought up before accounting existed has none
            groups.append(accounting)
    return groups


def cpu_seconds(group: Path) -> float | None:
    """CPU seconds the group's processes (children's included) used since it was created.

    None when the group does not exist or counts nothing (no cpuacct.usage).
    """
    try:
        return int((Path(group) / "cpuacct.usage").read_text()) / 1e9
    except (FileNotFoundError, ValueError):
        return None


def cpu_quota_microseconds(cpu_cores: float) -> int:
    """cfs_quota_us for `cpu_cores` cores over CPU_PERIOD_MICROSECONDS."""
    quota = round(cpu_cores * CPU_PERIOD_MICROSECONDS)
    if quota < MIN_CPU_QUOTA_MICROSECONDS:
        raise ValueError(
            f"cpu_cores must be at least {MIN_CPU_QUOTA_MICROSECONDS / CPU_PERIOD_MICROSECONDS} "
            f"(the kernel's smallest quota), got {cpu_cores}"
        )
    return quota


def create_group(controller: str, relative_path: str) -> Path:
    """Create one cgroup (the parent must exist); FileExistsError if it already does."""
    path = cgroup_v1_mount(controller) / relative_path
    path.mkdir()
    return path


def set_cpu_limit(group: Path, cpu_cores: float) -> None:
    """Hold the group's processes to `cpu_cores` cores in every 100 ms period."""
    (group / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_MICROSECONDS))
    (group / "cpu.cfs_quota_us").write_text(str(cpu_quota_microseconds(cpu_cores)))


def set_cpu_shares(group: Path, shares: int) -> None:
    """Weigh the group against its siblings when the CPU is contended (cgroup v1 cpu.shares)."""
    (group / "cpu.shares").write_text(str(shares))


def emulation_cpu_seconds(prefix: str) -> float | None:
    """CPU seconds a fleet's link emulation used so far; None when its group does not exist."""
    try:
        cpu_group = cgroup_v1_mount("cpu") / f"{prefix}-fleet" / EMULATION_GROUP
        return cpu_seconds(accounting_group(cpu_group))
    except ValueError:
        return None


def set_memory_limit(group: Path, memory_bytes: int) -> None:
    """Cap the group's memory (beyond it the kernel reclaims, then OOM-kills inside the group)."""
    (group / "memory.limit_in_bytes").write_text(str(memory_bytes))


def read_limits(cpu_group: Path, memory_group: Path) -> dict[str, float | int | None]:
    """The limits as the kernel holds them (None = unlimited), and how often they bit.

    `cpu_throttled_seconds` is time the device's processes were ready to run but held back by
    the quota; `memory_failcnt` counts allocations that hit the memory limit.
    """
    quota = int((cpu_group / "cpu.cfs_quota_us").read_text())
    period = int((cpu_group / "cpu.cfs_period_us").read_text())
    cpu_stat = dict(line.split() for line in (cpu_group / "cpu.stat").read_text().splitlines())
    return {
        "cpu_cores": quota / period if quota > 0 else None,
        "cpu_throttled_periods": int(cpu_stat.get("nr_throttled", 0)),
        "cpu_throttled_seconds": int(cpu_stat.get("throttled_time", 0)) / 1e9,
        "memory_limit_bytes": int((memory_group / "memory.limit_in_bytes").read_text()),
        "memory_usage_bytes": int((memory_group / "memory.usage_in_bytes").read_text()),
        "memory_max_usage_bytes": int((memory_group / "memory.max_usage_in_bytes").read_text()),
        "memory_failcnt": int((memory_group / "memory.failcnt").read_text()),
    }


def join_groups(groups: list[str]) -> None:
    """Move the calling process into `groups` (used between fork and exec, so children inherit)."""
    for group in groups:
        with open(Path(group) / "cgroup.procs", "w") as procs:
            procs.write(str(os.getpid()))


def move_process(group: Path, pid: int) -> None:
    """Move process `pid` into `group`; the children it starts afterwards are born there."""
    (Path(group) / "cgroup.procs").write_text(str(pid))


def group_pids(group: Path) -> list[int]:
    """Processes currently in the group (empty if the group is gone)."""
    try:
        return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def remove_group(group: Path, timeout_seconds: float = 10.0) -> None:
    """Kill what runs in the group and its children, then remove them (idempotent).

    Children go first: a `fleet up` killed between creating a device's group and recording
    it in the fleet state leaves a child the state does not know, and a parent with a child
    stays busy.
    """
    deadline = time.monotonic() + timeout_seconds
    for child in sorted(path for path in group.glob("*") if path.is_dir()):
        remove_group(child, timeout_seconds)
    while group.exists():
        kill_processes(group_pids(group), grace_seconds=1.0)
        try:
            group.rmdir()
        except FileNotFoundError:
            return
        except OSError:
            # EBUSY while the last killed tasks are still being reaped.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)

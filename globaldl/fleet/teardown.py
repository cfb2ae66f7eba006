"""Undo what `fleet up` journaled, newest first, and find the processes a fleet runs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from globaldl.fleet import cgroups, sshd
from globaldl.fleet.state import DeviceState, FleetState
from globaldl.fleet.system import CommandError, is_same_process, kill_processes, run

Log = Callable[[str], None]


def teardown(state: FleetState, log: Log) -> list[str]:
    """Kill the fleet's processes, undo the journal newest first; return what stayed."""
    kill_processes(fleet_pids(state))
    failures: list[str] = []
    for resource in reversed(list(state.resources)):
        try:
            _undo(resource, state)
        except (OSError, CommandError, RuntimeError) as error:
            failures.append(
                f"{resource['kind']} "
                f"{resource.get('name') or resource.get('path') or resource.get('pid')}: {error}"
            )
            continue
        state.resources.remove(resource)
        if state.path.parent.exists():
            state.save()
    if failures:
        if state.path.parent.exists():
            state.save()
        for failure in failures:
            log(f"could not remove {failure}")
        return failures
    state.path.unlink(missing_ok=True)
    return []


def sshd_alive(device: DeviceState) -> bool:
    """True while the device's recorded sshd is still that process."""
    return (
        device.sshd_pid is not None
        and device.sshd_start_ticks is not None
        and is_same_process(device.sshd_pid, device.sshd_start_ticks)
    )


def netns_pids(name: str) -> list[int]:
    """Processes whose network namespace is `name` (empty if it does not exist)."""
    if not Path(f"/run/netns/{name}").exists():
        return []
    completed = run(["ip", "netns", "pids", name], check=False)
    return [int(pid) for pid in completed.stdout.split()]


def device_pids(device: DeviceState) -> set[int]:
    """Everything running on a device: in its namespace or its cgroups, and its sshd."""
    pids = set(netns_pids(device.name))
    for group in (device.cpu_group, device.memory_group):
        pids.update(cgroups.group_pids(Path(group)))
    if sshd_alive(device) and device.sshd_pid is not None:
        pids.add(device.sshd_pid)
    return pids


def emulation_pids(state: FleetState) -> list[int]:
    """The link emulation's live processes (vde_switch, wirefilter) the journal recorded."""
    return [
        resource["pid"]
        for resource in state.resources
        if resource["kind"] == "process"
        and is_same_process(resource["pid"], resource["start_ticks"])
    ]


def fleet_pids(state: FleetState) -> set[int]:
    """Every process of the fleet: devices, link emulation, and anything in its cgroups."""
    pids: set[int] = set(emulation_pids(state))
    for device in state.devices:
        pids |= device_pids(device)
    for resource in state.resources:
        if resource["kind"] == "netns":
            pids.update(netns_pids(resource["name"]))
        elif resource["kind"] == "cgroup":
            pids.update(cgroups.group_pids(Path(resource["path"])))
    return pids


def _undo(resource: dict[str, Any], state: FleetState) -> None:
    kind = resource["kind"]
    if kind == "netns":
        kill_processes(netns_pids(resource["name"]))
        if Path(f"/run/netns/{resource['name']}").exists():
            run(["ip", "netns", "del", resource["name"]])
    elif kind in ("link", "bridge"):
        if Path(f"/sys/class/net/{resource['name']}").exists():
            run(["ip", "link", "del", resource["name"]])
    elif kind == "process":
        if is_same_process(resource["pid"], resource["start_ticks"]):
            survivors = kill_processes([resource["pid"]])
            if survivors:
                raise RuntimeError(f"pid {resource['pid']} survived SIGKILL")
    elif kind == "cgroup":
        cgroups.remove_group(Path(resource["path"]))
    elif kind == "directory":
        _remove_directory(Path(resource["path"]), resource["remove"])
    elif kind == "file":
        Path(resource["path"]).unlink(missing_ok=True)
    elif kind == "sysctl":
        Path(resource["path"]).write_text(resource["previous"] + "\n")
    elif kind == "known_hosts":
        path = Path(resource["path"])
        sshd.forget_host_keys(path, [device.host_key_public for device in state.devices])
        if not resource["file_existed"] and path.exists() and not path.read_text().strip():
            path.unlink()
        if not resource["dir_existed"] and path.parent.exists() and not any(path.parent.iterdir()):
            path.parent.rmdir()
    else:
        raise RuntimeError(f"unknown resource kind {kind!r} in the state file")


def _remove_directory(path: Path, mode: str) -> None:
    if not path.exists():
        return
    if mode == "tree":
        shutil.rmtree(path)
    elif mode == "if_empty":
        if not any(path.iterdir()):
            path.rmdir()
    elif mode == "sshd_privsep":
        # Another sshd (the system's, another fleet's) still needs its chroot directory.
        if not any(path.iterdir()) and not _any_sshd_running():
            path.rmdir()
    else:
        raise RuntimeError(f"unknown directory removal mode {mode!r}")


def _any_sshd_running() -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "exe") == sshd.SSHD:
                    return True
            except OSError:
                continue
    return False

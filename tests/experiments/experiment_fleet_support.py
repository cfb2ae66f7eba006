"""For the experiment tests that bring a real fleet up: skip reasons, a free subnet, leftovers."""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import subprocess
from pathlib import Path

from globaldl.fleet.fleet import host_networks


def fleet_skip_reason() -> str | None:
    """Why a real fleet cannot be brought up here, or None."""
    if os.geteuid() != 0:
        return "a fleet needs root (namespaces, links, qdiscs, cgroups)"
    for tool in ("ip", "tc", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/usr/sbin/sshd").exists():
        return "/usr/sbin/sshd is not installed"
    for controller in ("cpu", "memory"):
        if not Path(f"/sys/fs/cgroup/{controller}/cgroup.procs").exists():
            return f"cgroup v1 {controller} controller is not mounted"
    return None


def free_subnet() -> str:
    """A /24 in 10.224-10.234 that overlaps no address or route of this machine."""
    used = [network for network, _ in host_networks()]
    for _ in range(200):
        candidate = ipaddress.ip_network(
            f"10.{random.randint(224, 234)}.{random.randint(0, 255)}.0/24"
        )
        if not any(candidate.overlaps(network) for network in used):
            return str(candidate)
    raise RuntimeError("no free subnet for the test fleet")


def leftovers(prefix: str, state_dir: Path) -> dict[str, list[str]]:
    """Everything on the machine carrying the test fleet's prefix (empty after `fleet down`)."""
    found = {
        "namespaces": [
            line.split()[0]
            for line in _run(["ip", "netns", "list"]).splitlines()
            if line.startswith(f"{prefix}-")
        ],
        "links": [
            link["ifname"]
            for link in json.loads(_run(["ip", "-j", "link"]))
            if link["ifname"].startswith(f"{prefix}-")
        ],
        "cgroups": [
            str(path)
            for controller in ("cpu", "memory", "cpuacct")
            for path in [Path(f"/sys/fs/cgroup/{controller}/{prefix}-fleet")]
            if path.exists()
        ],
        "state": [str(state_dir)] if (state_dir / "fleet.json").exists() else [],
        "processes": _processes_mentioning(str(state_dir)),
    }
    return {kind: items for kind, items in found.items() if items}


def _processes_mentioning(text: str) -> list[str]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(f"{entry.name}: {cmdline[:120]}")
    return pids


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30).stdout

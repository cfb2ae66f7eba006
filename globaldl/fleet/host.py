"""What the fleet needs from the host before and while it runs: root, free subnets, counters."""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from pathlib import Path

from globaldl.fleet.links import DEVICE_INTERFACE
from globaldl.fleet.state import DEFAULT_STATE_DIR
from globaldl.fleet.system import run


def require_root() -> None:
    """PermissionError unless running as root (namespaces, links, qdiscs and cgroups need it)."""
    if os.geteuid() != 0:
        raise PermissionError(
            "the fleet creates namespaces, links, qdiscs and cgroups: run it as root"
        )


def check_state_dir_is_private(state_dir: Path) -> None:
    """Sshd (StrictModes) refuses keys below group/world-writable directories; say so up front."""
    for directory in [state_dir, *state_dir.parents]:
        if not directory.exists():
            continue
        info = directory.stat()
        if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(
                f"state dir {state_dir}: {directory} is not owned by root or is "
                "group/world-writable, and sshd refuses keys kept below it; use a root-owned path "
                f"such as {DEFAULT_STATE_DIR}"
            )


def host_networks() -> list[tuple[ipaddress.IPv4Network, str]]:
    """Every IPv4 network this host has an address in or a route to, with what owns it."""
    found = []
    for entry in json.loads(run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]"):
        for address in entry.get("addr_info", []):
            interface = ipaddress.ip_interface(f"{address['local']}/{address['prefixlen']}")
            found.append((interface.network, f"{interface} on {entry['ifname']}"))
    for route in json.loads(run(["ip", "-j", "-4", "route", "show"]).stdout or "[]"):
        destination = route.get("dst", "default")
        if destination != "default":
            found.append(
                (
                    ipaddress.ip_network(destination, strict=False),
                    f"route {destination} via {route.get('dev')}",
                )
            )
    return found


def check_subnet_is_free(subnet: str) -> None:
    """Refuse a subnet that overlaps any address or route the host already has."""
    network = ipaddress.ip_network(subnet)
    for used, owner in host_networks():
        if used.overlaps(network):
            raise ValueError(f"subnet {subnet} clashes with {owner}; choose another --subnet")


def read_interface_counters(netns: str, interface: str = DEVICE_INTERFACE) -> dict[str, int]:
    """rx/tx bytes and packets of a device's interface, read inside its namespace."""
    entries = json.loads(
        run(["ip", "-n", netns, "-j", "-s", "link", "show", "dev", interface]).stdout
    )
    stats = entries[0]["stats64"]
    return {
        "rx_bytes": stats["rx"]["bytes"],
        "tx_bytes": stats["tx"]["bytes"],
        "rx_packets": stats["rx"]["packets"],
        "tx_packets": stats["tx"]["packets"],
    }

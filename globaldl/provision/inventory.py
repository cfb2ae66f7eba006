"""An Ansible inventory for the emulated fleet, in the form of deploy/ansible/inventory.example.

Each emulated device is reached over its own sshd like a real one; what differs is written in
its host variables: the devices share this machine's filesystem, so each gets its own install
prefix and its own authorized_keys file, and is marked `globaldl_emulated` (the playbook then
starts node-exporter itself rather than through systemd, and checks that /etc/hostname is the
device's own before it sets it).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import yaml

from globaldl.fleet.fleet import device_authorized_keys
from globaldl.fleet.state import FleetState
from globaldl.fleet.system import write_atomically

# What every device entry must say (checked by the playbook's first play as well).
DEVICE_FIELDS: tuple[str, ...] = ("ansible_host", "ansible_user", "site", "link_profile", "arch")


def fleet_inventory(
    state: FleetState, prefix_root: Path, *, site: str = "emulated", slots: int = 1
) -> dict[str, Any]:
    """The inventory of every device of `state`, installing below `prefix_root/DEVICE`."""
    if slots < 1:
        raise ValueError(f"slots {slots!r} is not allowed; use a whole number >= 1")
    hosts: dict[str, dict[str, Any]] = {}
    for device in state.devices:
        hosts[device.name] = {
            "ansible_host": device.address,
            "ansible_user": "root",
            "site": site,
            "link_profile": device.profile.name,
            "arch": platform.machine(),
            "slots": slots,
            "globaldl_emulated": True,
            "globaldl_prefix": str(Path(prefix_root) / device.name),
            "globaldl_authorized_keys_file": str(
                device_authorized_keys(Path(state.state_dir) / "devices" / device.name)
            ),
        }
    return {
        "all": {
            "vars": {
                "ansible_ssh_private_key_file": state.identity_file,
                # Fresh host keys every `fleet up`: never add them to the user's known_hosts.
                "ansible_ssh_common_args": (
                    "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
                ),
            },
            "children": {"devices": {"hosts": hosts}},
        }
    }


def write_inventory(path: Path, inventory: dict[str, Any]) -> None:
    """Write the inventory as YAML, atomically."""
    header = "# Written by `globaldl provision inventory` from an emulated fleet's state.\n"
    write_atomically(Path(path), header + yaml.safe_dump(inventory, sort_keys=False))

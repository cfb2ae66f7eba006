"""The fleet's state file: what `fleet up` created, so `fleet down` can remove exactly that."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from globaldl.files import write_json_atomically
from globaldl.fleet.profiles import LinkProfile

STATE_SCHEMA_VERSION = 1
STATE_FILE_NAME = "fleet.json"
DEFAULT_STATE_DIR = Path("/run/globaldl-fleet")

# Kinds of resource in the journal, each undone by its own step in fleet teardown.
RESOURCE_KINDS = ("directory", "bridge", "netns", "link", "cgroup", "known_hosts")


@dataclass
class DeviceState:
    """One emulated device: its namespace and address, link profile, limits and sshd."""

    name: str
    address: str
    host_interface: str
    profile: LinkProfile
    cpu_cores: float
    memory_bytes: int
    cpu_group: str
    memory_group: str
    host_key_public: str
    status: str = "creating"
    sshd_pid: int | None = None
    sshd_start_ticks: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        data = asdict(self)
        data["profile"] = self.profile.get_config()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceState:
        """Inverse of `to_dict`."""
        return cls(**{**data, "profile": LinkProfile.from_config(data["profile"])})


@dataclass
class FleetState:
    """Everything one `fleet up` made; `resources` is the creation journal, oldest first."""

    prefix: str
    subnet: str
    bridge: str
    host_address: str
    state_dir: str
    identity_file: str
    netem_available: bool
    latency_emulated: bool
    phase: str = "creating"
    devices: list[DeviceState] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)

    @property
    def path(self) -> Path:
        """The state file."""
        return Path(self.state_dir) / STATE_FILE_NAME

    def device(self, name: str) -> DeviceState:
        """The device called `name`; ValueError naming the fleet's devices otherwise."""
        for device in self.devices:
            if device.name == name:
                return device
        raise ValueError(
            f"no device {name!r} in this fleet; devices: {', '.join(d.name for d in self.devices)}"
        )

    def record(self, kind: str, **fields: Any) -> None:
        """Journal a resource that now exists and save at once, so a crash cannot orphan it."""
        if kind not in RESOURCE_KINDS:
            raise ValueError(f"unknown resource kind {kind!r}; allowed: {RESOURCE_KINDS}")
        self.resources.append({"kind": kind, **fields})
        self.save()

    def save(self) -> None:
        """Write the state file atomically."""
        data = asdict(self)
        data["schema_version"] = STATE_SCHEMA_VERSION
        data["devices"] = [device.to_dict() for device in self.devices]
        write_json_atomically(self.path, data, mode=0o600)

    @classmethod
    def load(cls, state_dir: Path) -> FleetState | None:
        """The state in `state_dir`, or None when no fleet is recorded there."""
        path = Path(state_dir) / STATE_FILE_NAME
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}: corrupt fleet state ({error}); inspect it and remove by hand"
            ) from None
        version = data.pop("schema_version", None)
        if version != STATE_SCHEMA_VERSION:
            raise ValueError(
                f"{path}: state schema_version {version!r}, this globaldl reads "
                f"{STATE_SCHEMA_VERSION}"
            )
        data["devices"] = [DeviceState.from_dict(device) for device in data["devices"]]
        return cls(**data)

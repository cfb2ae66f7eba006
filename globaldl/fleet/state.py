"""The fleet's state file: what `fleet up` created, so `fleet down` can remove exactly that."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from globaldl.files import write_json_atomically
from globaldl.fleet.profiles import LinkProfile

STATE_SCHEMA_VERSION = 2
STATE_FILE_NAME = "fleet.json"
DEFAULT_STATE_DIR = Path("/run/globaldl-fleet")

# Kinds of resource in the journal, each undone by its own step in fleet teardown.
RESOURCE_KINDS = (
    "directory",
    "bridge",
    "netns",
    "link",
    "cgroup",
    "known_hosts",
    "process",
    "file",
    "sysctl",
)
LINK_KINDS = ("veth", "vde")


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
    site: str | None = None
    link: str = "veth"  # "vde" when user-space emulation adds delay, jitter or loss
    # Its TCP congestion control, read back from its namespace ("" in older state files).
    congestion_control: str = ""

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
class SiteState:
    """One site: its LAN bridge, its shared WAN link and the devices behind it."""

    name: str
    bridge: str
    wan: LinkProfile
    uplink_interface: str
    core_interface: str
    devices: list[str]
    link: str = "veth"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "wan": self.wan.get_config()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SiteState:
        """Inverse of `to_dict`."""
        return cls(**{**data, "wan": LinkProfile.from_config(data["wan"])})


@dataclass
class FleetState:
    """Everything one `fleet up` made; `resources` is the creation journal, oldest first."""

    prefix: str
    subnet: str
    bridge: str
    host_address: str
    state_dir: str
    identity_file: str
    # What adds delay, jitter and loss here ("vde2 wirefilter"), or why nothing can.
    emulator: str
    emulator_available: bool
    latency_emulated: bool
    phase: str = "creating"
    devices: list[DeviceState] = field(default_factory=list)
    sites: list[SiteState] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)

    @property
    def site_map_path(self) -> Path | None:
        """The site map file (`sites: {SITE: [HOST, ...]}`) when the fleet has sites."""
        from globaldl.fleet.sites import SITE_MAP_FILE_NAME

        return Path(self.state_dir) / SITE_MAP_FILE_NAME if self.sites else None

    def site(self, name: str) -> SiteState:
        """The site called `name`; ValueError naming the fleet's sites otherwise."""
        for site in self.sites:
            if site.name == name:
                return site
        raise ValueError(
            f"no site {name!r} in this fleet; sites: {', '.join(s.name for s in self.sites)}"
        )

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
        data["sites"] = [site.to_dict() for site in self.sites]
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
                f"{STATE_SCHEMA_VERSION}; bring that fleet down with the globaldl that made it, "
                "or remove its namespaces, links and cgroups by hand"
            )
        data["devices"] = [DeviceState.from_dict(device) for device in data["devices"]]
        data["sites"] = [SiteState.from_dict(site) for site in data.get("sites", [])]
        return cls(**data)

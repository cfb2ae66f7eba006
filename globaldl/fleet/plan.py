"""Plan a fleet before touching the system: names, addresses, links and limits that fit."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from globaldl.fleet.cgroups import CPU_PERIOD_MICROSECONDS, MIN_CPU_QUOTA_MICROSECONDS
from globaldl.fleet.profiles import LinkProfile, device_profiles
from globaldl.fleet.sites import DEFAULT_LAN_PROFILE, MAX_SITES, SiteLayout, parse_sites
from globaldl.fleet.system import machine_cores, machine_memory_bytes

DEFAULT_PREFIX = "gdl"
DEFAULT_SUBNET = "10.77.0.0/24"
# A mid-sized edge device (Raspberry Pi 4 / Jetson Nano class) has 2-4 GB.
DEFAULT_MEMORY_MB = 2048
MIN_MEMORY_MB = 64
MAX_DEVICES = 999
# Interface names are at most 15 bytes: "<prefix>-<999>-h" must fit.
_PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,7}$")


@dataclass(frozen=True)
class DeviceSpec:
    """One device to create: name (= namespace = host name), address, link and limits."""

    name: str
    address: str
    host_interface: str
    profile: LinkProfile
    cpu_cores: float
    memory_bytes: int
    site: str | None = None


@dataclass(frozen=True)
class SiteSpec:
    """One site to create: its LAN bridge and the WAN link that joins it to the core.

    The WAN link's inner end (`uplink_interface`) sits on the site bridge, its outer end
    (`core_interface`) on the core bridge; the site's up direction leaves the site.
    """

    name: str
    bridge: str
    wan: LinkProfile
    uplink_interface: str
    core_interface: str
    devices: tuple[str, ...]


@dataclass(frozen=True)
class FleetPlan:
    """Everything `fleet up` will create, decided and validated up front."""

    prefix: str
    subnet: str
    bridge: str
    host_address: str
    devices: tuple[DeviceSpec, ...]
    sites: tuple[SiteSpec, ...] = ()
    # Every device's TCP congestion control (`net.ipv4.tcp_congestion_control` in its
    # namespace); None: the host's default, which new namespaces take.
    congestion_control: str | None = None

    def bridge_of(self, device: DeviceSpec) -> str:
        """The bridge a device's link ends on: its site's LAN, or the core."""
        for site in self.sites:
            if site.name == device.site:
                return site.bridge
        return self.bridge

    @property
    def prefix_length(self) -> int:
        """Bits of the subnet's network part (24 for a /24)."""
        return ipaddress.ip_network(self.subnet).prefixlen

    @property
    def total_cpu_cores(self) -> float:
        """CPU cores promised to all devices together."""
        return sum(device.cpu_cores for device in self.devices)

    @property
    def total_memory_bytes(self) -> int:
        """Memory promised to all devices together."""
        return sum(device.memory_bytes for device in self.devices)


def plan_fleet(
    profiles: list[LinkProfile],
    *,
    prefix: str = DEFAULT_PREFIX,
    subnet: str = DEFAULT_SUBNET,
    cpu_cores: float | None = None,
    memory_mb: int | None = None,
    force: bool = False,
    cpu_cores_each: Sequence[float] | None = None,
    available_cores: float | None = None,
    available_memory_bytes: int | None = None,
    sites: Sequence[SiteLayout] | None = None,
    congestion_control: str | None = None,
    available_congestion_controls: Sequence[str] | None = None,
) -> FleetPlan:
    """Name and address one device per profile and give each a CPU and memory share.

    By default the machine's cores and memory are split evenly (`--cpu` = cores / devices);
    `cpu_cores_each` gives every device its own share instead (a fleet of fast and slow devices).
    Promising more than the machine has is refused unless `force` is set. With `sites`, the
    devices are given to the sites in order (`profiles` is then every device's LAN profile,
    see `site_device_profiles`). `congestion_control` must be one the kernel offers
    (`available_congestion_controls`, default: read from the kernel).
    """
    if congestion_control is not None:
        offered = (
            list(available_congestion_controls)
            if available_congestion_controls is not None
            else kernel_congestion_controls()
        )
        if congestion_control not in offered:
            raise ValueError(
                f"--congestion-control {congestion_control!r} is not offered by this kernel; "
                f"available: {', '.join(offered) or 'none listed'}"
            )
    count = len(profiles)
    if count < 1:
        raise ValueError(f"a fleet needs at least 1 device, got {count}")
    if count > MAX_DEVICES:
        raise ValueError(f"at most {MAX_DEVICES} devices, got {count}")
    if not _PREFIX_PATTERN.match(prefix):
        raise ValueError(
            f"prefix must be 1-8 lowercase letters/digits starting with a letter, got {prefix!r}"
        )
    try:
        network = ipaddress.ip_network(subnet, strict=True)
    except ValueError as error:
        raise ValueError(f"bad subnet {subnet!r}: {error}") from None
    if network.version != 4:
        raise ValueError(f"subnet must be IPv4, got {subnet!r}")
    hosts = list(network.hosts())
    if len(hosts) < count + 1:
        raise ValueError(
            f"subnet {subnet} has room for {len(hosts) - 1} devices, {count} asked for"
        )

    cores = float(available_cores if available_cores is not None else machine_cores())
    memory_total_bytes = (
        available_memory_bytes if available_memory_bytes is not None else machine_memory_bytes()
    )
    if cpu_cores_each is not None:
        if cpu_cores is not None:
            raise ValueError(
                "give --cpu (one share for all) or --cpu-each (one per device), not both"
            )
        if len(cpu_cores_each) != count:
            raise ValueError(
                f"--cpu-each needs one value per device ({count}), got {len(cpu_cores_each)}: "
                f"{','.join(f'{value:g}' for value in cpu_cores_each)}"
            )
        device_cores = [float(value) for value in cpu_cores_each]
    else:
        device_cores = [cpu_cores if cpu_cores is not None else cores / count] * count
    min_cores = MIN_CPU_QUOTA_MICROSECONDS / CPU_PERIOD_MICROSECONDS
    if not min(device_cores) >= min_cores:
        raise ValueError(
            f"--cpu must be at least {min_cores} core per device, got {min(device_cores):g}"
        )
    if sum(device_cores) > cores + 1e-9 and not force:
        raise ValueError(
            f"{count} devices with {'+'.join(f'{value:g}' for value in device_cores)} = "
            f"{sum(device_cores):g} cores is more than this machine's {cores:g}; lower --cpu "
            f"(default {cores:g}/devices), use fewer devices, or pass --force to oversubscribe"
        )
    if memory_mb is None:
        memory_mb = min(DEFAULT_MEMORY_MB, memory_total_bytes // (count * 1024 * 1024))
    if memory_mb < MIN_MEMORY_MB:
        raise ValueError(
            f"--memory must be at least {MIN_MEMORY_MB} MB per device, got {memory_mb}"
        )
    memory_bytes = memory_mb * 1024 * 1024
    if memory_bytes * count > memory_total_bytes and not force:
        raise ValueError(
            f"{count} devices x {memory_mb} MB = {memory_mb * count} MB, more than this machine's "
            f"{memory_total_bytes // 2**20} MB; lower --memory, use fewer devices, or pass --force"
        )

    site_of = _site_of_each_device(sites, count)
    devices = tuple(
        DeviceSpec(
            name=f"{prefix}-{index}",
            address=str(hosts[index]),
            host_interface=f"{prefix}-{index}-h",
            profile=profile,
            cpu_cores=device_cores[index - 1],
            memory_bytes=memory_bytes,
            site=site_of[index - 1],
        )
        for index, profile in enumerate(profiles, start=1)
    )
    site_specs = tuple(
        SiteSpec(
            name=layout.name,
            bridge=f"{prefix}-s{number}",
            wan=layout.wan,
            uplink_interface=f"{prefix}-s{number}-u",
            core_interface=f"{prefix}-s{number}-w",
            devices=tuple(d.name for d in devices if d.site == layout.name),
        )
        for number, layout in enumerate(sites or (), start=1)
    )
    return FleetPlan(
        prefix=prefix,
        subnet=str(network),
        bridge=f"{prefix}-br",
        host_address=str(hosts[0]),
        devices=devices,
        sites=site_specs,
        congestion_control=congestion_control,
    )


def kernel_congestion_controls(
    listing: Path = Path("/proc/sys/net/ipv4/tcp_available_congestion_control"),
) -> list[str]:
    """The TCP congestion controls this kernel offers (built in or loaded), or [] if unknown."""
    try:
        return listing.read_text().split()
    except OSError:
        return []


def plan_from_options(
    profiles: dict[str, LinkProfile],
    *,
    devices: int | None = None,
    profile: str | None = None,
    mix: str | None = None,
    up_mbit: float | None = None,
    down_mbit: float | None = None,
    sites: str | None = None,
    lan: str | None = None,
    wan: str | None = None,
    **limits: Any,
) -> FleetPlan:
    """The plan `fleet up` options describe: devices on one bridge, or devices in sites.

    `limits` are plan_fleet's keyword arguments (prefix, subnet, cpu_cores, memory_mb, force,
    cpu_cores_each, congestion_control).
    """
    if sites is None:
        if lan is not None or wan is not None:
            raise ValueError("--lan and --wan describe sites; they need --sites")
        return plan_fleet(
            device_profiles(
                profiles,
                devices=devices,
                profile=profile,
                mix=mix,
                up_mbit=up_mbit,
                down_mbit=down_mbit,
            ),
            **limits,
        )
    if profile is not None or mix is not None or up_mbit is not None or down_mbit is not None:
        raise ValueError(
            "--sites takes --lan (each device's link) and --wan (each site's shared link), "
            "not --profile/--mix/--up-mbit/--down-mbit"
        )
    layouts = parse_sites(sites, profiles, lan or DEFAULT_LAN_PROFILE, wan)
    lan_profiles = site_device_profiles(layouts)
    if devices is not None and devices != len(lan_profiles):
        raise ValueError(
            f"--devices {devices} does not match --sites {sites}, which makes "
            f"{len(lan_profiles)} devices"
        )
    return plan_fleet(lan_profiles, sites=layouts, **limits)


def site_device_profiles(sites: Sequence[SiteLayout]) -> list[LinkProfile]:
    """Every device's link profile (its site's LAN), in the order plan_fleet assigns them."""
    return [layout.lan for layout in sites for _ in range(layout.devices)]


def _site_of_each_device(sites: Sequence[SiteLayout] | None, count: int) -> list[str | None]:
    if not sites:
        return [None] * count
    if len(sites) > MAX_SITES:
        raise ValueError(f"at most {MAX_SITES} sites, got {len(sites)}")
    names = [layout.name for layout in sites]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"site names must be unique; repeated: {repeated}")
    site_of = [layout.name for layout in sites for _ in range(layout.devices)]
    if len(site_of) != count:
        raise ValueError(
            f"the sites hold {len(site_of)} devices but {count} device profiles were given"
        )
    return site_of

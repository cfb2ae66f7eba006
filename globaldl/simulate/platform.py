"""Devices, sites and link mixes for the simulator, read from the fleet's link profiles.

A device is a link profile (rates, one-way latency, jitter, loss) and a CPU share; a site groups
devices behind one shared WAN uplink. This module turns them into the engine's `Platform`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from globaldl.fleet.profiles import DEFAULT_PROFILES_PATH, LinkProfile, load_profiles, parse_mix
from globaldl.simulate.topology import Link, Platform

DEFAULT_MIXES_PATH = DEFAULT_PROFILES_PATH.parent / "mixes.yaml"
# tc tbf shapes Ethernet frames; TCP carries 1448 payload bytes in a 1514-byte frame. The
# remaining TCP inefficiency (ACK clocking, idle gaps, coordination traffic) is calibrated.
ETHERNET_PAYLOAD_SHARE = 1448 / 1514


@dataclass(frozen=True)
class Direction:
    """One direction of a device's access link, as the simulator needs it."""

    kbit_per_second: float
    one_way_latency_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0

    def bytes_per_second(self) -> float:
        """Payload bytes per second the shaped rate carries in full frames.

        Random loss cuts TCP's rate by the Mathis et al. bound (MSS / RTT x 1.22 / sqrt(p)),
        evaluated at this direction's own latency; without loss the frame rate is the limit.
        """
        rate = self.kbit_per_second * 1000 / 8 * ETHERNET_PAYLOAD_SHARE
        if self.loss_percent <= 0:
            return rate
        round_trip_seconds = max(2 * self.one_way_latency_ms / 1000, 1e-3)
        mathis = 1448 / round_trip_seconds * 1.22 / math.sqrt(self.loss_percent / 100)
        return min(rate, mathis)


def link_directions(profile: LinkProfile) -> tuple[Direction, Direction]:
    """(uplink, downlink) of a profile: its rate, one-way delay, jitter and loss per direction."""
    return tuple(  # type: ignore[return-value]
        Direction(
            kbit_per_second=float(getattr(profile, f"{direction}_kbit_per_second")),
            one_way_latency_ms=float(getattr(profile, f"{direction}_delay_ms")),
            jitter_ms=float(getattr(profile, f"{direction}_jitter_ms")),
            loss_percent=float(getattr(profile, f"{direction}_loss_percent")),
        )
        for direction in ("up", "down")
    )


@dataclass(frozen=True)
class Site:
    """Devices behind one shared WAN link (a farm, a factory floor, a building)."""

    name: str
    wan_up: Direction
    wan_down: Direction


@dataclass(frozen=True)
class Device:
    """One simulated device: its access link, its CPU share and its speed.

    `cpu_cores` is the share of one reference core (the fleet's cgroup quota); `speed` scales
    it for a device whose cores are faster or slower than the reference machine's.
    """

    profile: LinkProfile
    cpu_cores: float = 1.0
    speed: float = 1.0
    site: int = -1

    @property
    def up(self) -> Direction:
        """The device's uplink."""
        return _directions(self.profile)[0]

    @property
    def down(self) -> Direction:
        """The device's downlink."""
        return _directions(self.profile)[1]


@lru_cache(maxsize=256)
def _directions(profile: LinkProfile) -> tuple[Direction, Direction]:
    return link_directions(profile)


@dataclass(frozen=True)
class Fleet:
    """The devices of one simulated run and the sites some of them share."""

    devices: tuple[Device, ...]
    sites: tuple[Site, ...] = ()
    # The cores of the one machine every device runs on (the emulated fleet, less what its
    # links and launcher used); None: every device has a core of its own (real devices).
    host_cores: float | None = None

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("a fleet needs at least one device")
        if self.host_cores is not None and not self.host_cores > 0:
            raise ValueError(f"host_cores must be > 0 or None, got {self.host_cores!r}")
        for device in self.devices:
            if not -1 <= device.site < len(self.sites):
                raise ValueError(f"device site index {device.site} out of range")

    @property
    def size(self) -> int:
        """Number of devices (Horovod ranks)."""
        return len(self.devices)

    def device_rates(self) -> np.ndarray:
        """Cores each device computes at while it runs: one, or its share of a shared host.

        The emulated fleet's devices share one machine and compute in step (every round starts
        when the collective ends), so while they compute each gets the host's cores divided
        among them; real devices (`host_cores` None) each have a core of their own.
        """
        if self.host_cores is None:
            return np.ones(self.size)
        return np.full(self.size, min(1.0, self.host_cores / self.size))

    def members(self) -> list[list[int]]:
        """Device indices per site, then one single-device group per device without a site."""
        groups: list[list[int]] = [[] for _ in self.sites]
        alone: list[list[int]] = []
        for index, device in enumerate(self.devices):
            if device.site >= 0:
                groups[device.site].append(index)
            else:
                alone.append([index])
        return [group for group in groups if group] + alone

    def platform(self, link_factor: float = 1.0) -> Platform:
        """The engine's platform; `link_factor` scales every rate (for what-if studies)."""
        cache: dict[tuple[float, float], Link] = {}

        def link(direction: Direction) -> Link:
            key = (direction.bytes_per_second() * link_factor, direction.one_way_latency_ms)
            if key not in cache:
                cache[key] = Link(key[0], key[1] / 1000)
            return cache[key]

        return Platform(
            device_up=tuple(link(device.up) for device in self.devices),
            device_down=tuple(link(device.down) for device in self.devices),
            site_of_device=tuple(device.site for device in self.devices),
            site_up=tuple(link(site.wan_up) for site in self.sites),
            site_down=tuple(link(site.wan_down) for site in self.sites),
        )

    def jitter_seconds_each_way(self) -> tuple[np.ndarray, np.ndarray]:
        """Per device, the +- jitter its uplink and its downlink add to a message (seconds)."""
        up = np.array([device.up.jitter_ms / 1000 for device in self.devices])
        down = np.array([device.down.jitter_ms / 1000 for device in self.devices])
        return up, down


def uniform_fleet(
    profile: LinkProfile, devices: int, speeds: Sequence[float] | None = None
) -> Fleet:
    """`devices` devices on one profile, each with its relative speed (1.0 when not given)."""
    speeds = list(speeds) if speeds is not None else [1.0] * devices
    if len(speeds) != devices:
        raise ValueError(f"{len(speeds)} speeds given for {devices} devices")
    return Fleet(tuple(Device(profile, speed=speed) for speed in speeds))


@dataclass(frozen=True)
class LinkMix:
    """Shares of link profiles in a population of devices, with the sources of the shares."""

    name: str
    shares_percent: Mapping[str, float]
    description: str = ""
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.shares_percent:
            raise ValueError(f"mix {self.name!r} has no profiles")
        for profile, share in self.shares_percent.items():
            if not isinstance(share, int | float) or share <= 0:
                raise ValueError(
                    f"mix {self.name!r}: share of {profile!r} must be > 0, got {share!r}"
                )

    def counts(self, devices: int) -> dict[str, int]:
        """Device counts per profile for `devices` devices (largest remainders, sum exact)."""
        return _largest_remainders(self.shares_percent, devices)

    def fleet(
        self, devices: int, profiles: Mapping[str, LinkProfile], cpu_cores: float = 1.0
    ) -> Fleet:
        """`devices` devices in this mix's shares, interleaved as a random ring would be."""
        counts = self.counts(devices)
        spec = ",".join(f"{name}:{count}" for name, count in counts.items() if count > 0)
        expanded = parse_mix(spec, dict(profiles))
        # Horovod orders ranks by host file, not by link type; interleave deterministically.
        order = np.random.default_rng(0).permutation(len(expanded))
        return Fleet(tuple(Device(expanded[index], cpu_cores) for index in order))


@dataclass(frozen=True)
class SpeedMix:
    """Shares of device speeds in a population: a heterogeneous fleet's CPUs.

    A speed is a device's core against the reference core the fleet measured compute on (0.25:
    four times slower); it scales the device's CPU work, compute and exchange alike, under its
    quota (`Device.speed`). Projections assign speeds independently of links.
    """

    shares_percent: Mapping[float, float]

    def __post_init__(self) -> None:
        if not self.shares_percent:
            raise ValueError("a speed mix needs at least one SPEED:SHARE entry")
        for speed, share in self.shares_percent.items():
            if not (isinstance(speed, int | float) and math.isfinite(speed) and speed > 0):
                raise ValueError(f"device speed must be a number > 0, got {speed!r}")
            if not (isinstance(share, int | float) and math.isfinite(share) and share > 0):
                raise ValueError(f"share of speed {speed:g} must be > 0, got {share!r}")

    @classmethod
    def uniform(cls) -> SpeedMix:
        """Every device at the reference speed."""
        return cls({1.0: 100.0})

    @property
    def is_uniform(self) -> bool:
        """Whether every device runs at the reference speed."""
        return set(self.shares_percent) == {1.0}

    def describe(self) -> str:
        """As `--speeds` takes it: `1:70,0.25:30`."""
        return ",".join(f"{speed:g}:{share:g}" for speed, share in self.shares_percent.items())

    def speeds(self, devices: int) -> np.ndarray:
        """Each of `devices` devices' speed, the shares split by largest remainders.

        The speeds come in a fixed random order, seeded apart from the links' order, so that
        speed and link do not go together.
        """
        counts = _largest_remainders(self.shares_percent, devices)
        expanded = np.repeat(list(counts), list(counts.values())).astype(float)
        return expanded[np.random.default_rng(1).permutation(devices)]


def parse_speed_shares(text: str) -> SpeedMix:
    """`1:70,0.25:30` as a speed mix: RELATIVE_SPEED:SHARE entries, shares in percent."""
    shares: dict[float, float] = {}
    for entry in (part.strip() for part in text.split(",")):
        speed_text, separator, share_text = entry.partition(":")
        try:
            speed, share = float(speed_text), float(share_text)
        except ValueError:
            speed = share = math.nan
        if not separator or math.isnan(speed) or math.isnan(share):
            raise ValueError(
                f"bad --speeds entry {entry!r}; expected RELATIVE_SPEED:SHARE with two numbers, "
                "e.g. 1:70,0.25:30 (70% of devices at the reference speed, 30% four times slower)"
            )
        if speed in shares:
            raise ValueError(f"--speeds {text!r} gives speed {speed:g} twice")
        shares[speed] = share
    return SpeedMix(shares)


def _largest_remainders(shares: Mapping[Any, float], devices: int) -> dict[Any, int]:
    """`devices` split in proportion to `shares` by largest remainders (the counts sum exactly)."""
    if devices < 1:
        raise ValueError(f"devices must be at least 1, got {devices}")
    total = sum(shares.values())
    exact = {key: devices * share / total for key, share in shares.items()}
    counts = {key: int(math.floor(value)) for key, value in exact.items()}
    remainder = devices - sum(counts.values())
    for key in sorted(exact, key=lambda key: exact[key] - counts[key], reverse=True)[:remainder]:
        counts[key] += 1
    return counts


def parse_mix_shares(text: str) -> LinkMix:
    """`lte:60,lte-m:30,nb-iot:10` as a mix (percent shares, any positive numbers)."""
    shares: dict[str, float] = {}
    for entry in (part.strip() for part in text.split(",")):
        name, separator, share_text = entry.rpartition(":")
        if not separator or not name:
            raise ValueError(f"bad --mix entry {entry!r}; expected PROFILE:SHARE, e.g. lte:60")
        try:
            shares[name] = float(share_text)
        except ValueError:
            raise ValueError(
                f"bad --mix entry {entry!r}: share {share_text!r} is not a number"
            ) from None
    return LinkMix(name=text, shares_percent=shares)


def load_mixes(path: Path = DEFAULT_MIXES_PATH) -> dict[str, LinkMix]:
    """The named link mixes with their cited sources (deploy/fleet/mixes.yaml)."""
    document: Any = yaml.safe_load(Path(path).read_text())
    if not isinstance(document, dict) or not isinstance(document.get("mixes"), dict):
        raise ValueError(f"{path}: expected a mapping with a 'mixes' mapping")
    mixes = {}
    for name, entry in document["mixes"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("shares_percent"), dict):
            raise ValueError(f"{path}: mix {name!r} needs a 'shares_percent' mapping")
        mixes[name] = LinkMix(
            name=name,
            shares_percent=dict(entry["shares_percent"]),
            description=str(entry.get("description", "")),
            sources=tuple(str(source) for source in entry.get("sources", [])),
        )
    return mixes


def resolve_mix(
    text: str, profiles: Mapping[str, LinkProfile], mixes: Mapping[str, LinkMix]
) -> LinkMix:
    """A named mix from mixes.yaml, or PROFILE:SHARE,... checked against the profiles."""
    mix = mixes[text] if text in mixes else parse_mix_shares(text)
    unknown = sorted(set(mix.shares_percent) - set(profiles))
    if unknown:
        raise ValueError(
            f"--mix {text!r}: unknown profiles {unknown}; valid: {sorted(profiles)} or a named mix "
            f"{sorted(mixes)}"
        )
    return mix


def default_profiles() -> dict[str, LinkProfile]:
    """The fleet's link profiles (deploy/fleet/profiles.yaml)."""
    return load_profiles()

"""Links, platforms and message phases: the plain data the SimGrid adapter simulates.

Also the routes messages take and the independent-flow reduction: flows that share no link
with any other flow of their phase cannot slow each other down in SimGrid's max-min model, so
of every class of identical independent flows (same links, same size) only one needs to be
simulated; this is exact, and it is what keeps a 10,000-device ring hop to a handful of
SimGrid flows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Link:
    """One direction of a link: its rate and one-way latency."""

    bytes_per_second: float
    latency_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.bytes_per_second > 0:
            raise ValueError(f"bytes_per_second must be > 0, got {self.bytes_per_second!r}")
        if not self.latency_seconds >= 0:
            raise ValueError(f"latency_seconds must be >= 0, got {self.latency_seconds!r}")


@dataclass(frozen=True)
class Platform:
    """Devices with their own up- and downlinks, optionally grouped into sites.

    A site's devices reach each other through their own links only; traffic leaving a site also
    crosses the site's shared WAN uplink, and traffic entering it the site's WAN downlink.
    `site_of_device[d]` is -1 for a device on its own (no shared link).
    """

    device_up: tuple[Link, ...]
    device_down: tuple[Link, ...]
    site_of_device: tuple[int, ...] = ()
    site_up: tuple[Link, ...] = ()
    site_down: tuple[Link, ...] = ()

    def __post_init__(self) -> None:
        if len(self.device_up) != len(self.device_down):
            raise ValueError("device_up and device_down must list the same devices")
        if self.site_of_device and len(self.site_of_device) != len(self.device_up):
            raise ValueError("site_of_device must have one entry per device")
        if len(self.site_up) != len(self.site_down):
            raise ValueError("site_up and site_down must list the same sites")
        for site in self.site_of_device:
            if not -1 <= site < len(self.site_up):
                raise ValueError(f"site index {site} out of range (sites: {len(self.site_up)})")

    @property
    def devices(self) -> int:
        """How many devices the platform has."""
        return len(self.device_up)

    def site(self, device: int) -> int:
        """The site index of `device`, -1 if it has none."""
        return self.site_of_device[device] if self.site_of_device else -1

    @classmethod
    def union(cls, platforms: Sequence[Platform]) -> tuple[Platform, list[int]]:
        """Disjoint platforms side by side, and the first device index of each."""
        up: list[Link] = []
        down: list[Link] = []
        site_of: list[int] = []
        site_up: list[Link] = []
        site_down: list[Link] = []
        offsets = []
        for platform in platforms:
            offsets.append(len(up))
            first_site = len(site_up)
            up.extend(platform.device_up)
            down.extend(platform.device_down)
            site_of.extend(
                platform.site(device) + first_site if platform.site(device) >= 0 else -1
                for device in range(platform.devices)
            )
            site_up.extend(platform.site_up)
            site_down.extend(platform.site_down)
        union = cls(tuple(up), tuple(down), tuple(site_of), tuple(site_up), tuple(site_down))
        return union, offsets

    def subset(self, devices: Sequence[int]) -> Platform:
        """The platform of only `devices` (in that order) and the sites they belong to."""
        sites = sorted({self.site(device) for device in devices} - {-1})
        new_site = {site: index for index, site in enumerate(sites)}
        return Platform(
            device_up=tuple(self.device_up[device] for device in devices),
            device_down=tuple(self.device_down[device] for device in devices),
            site_of_device=tuple(new_site.get(self.site(device), -1) for device in devices),
            site_up=tuple(self.site_up[site] for site in sites),
            site_down=tuple(self.site_down[site] for site in sites),
        )


@dataclass(frozen=True)
class Phase:
    """Messages that start together; a phase starts when every message of the previous one is in.

    `sources[i]` sends `sizes_bytes[i]` bytes to `targets[i]`.
    """

    sources: np.ndarray
    targets: np.ndarray
    sizes_bytes: np.ndarray

    @classmethod
    def of(
        cls, sources: Sequence[int], targets: Sequence[int], sizes_bytes: Sequence[int]
    ) -> Phase:
        """Build a phase from three equally long sequences."""
        phase = cls(
            np.asarray(sources, dtype=np.int64),
            np.asarray(targets, dtype=np.int64),
            np.asarray(sizes_bytes, dtype=np.int64),
        )
        if not len(phase.sources) == len(phase.targets) == len(phase.sizes_bytes):
            raise ValueError("a phase needs as many targets and sizes as sources")
        return phase


def route_links(platform: Platform, source: int, target: int) -> tuple[Link, ...]:
    """The links a message from `source` to `target` crosses, in order."""
    links = [platform.device_up[source]]
    source_site, target_site = platform.site(source), platform.site(target)
    if source_site != target_site:
        if source_site >= 0:
            links.append(platform.site_up[source_site])
        if target_site >= 0:
            links.append(platform.site_down[target_site])
    links.append(platform.device_down[target])
    return tuple(links)


def route_latency_seconds(
    platform: Platform, sources: np.ndarray, targets: np.ndarray
) -> np.ndarray:
    """One-way latency of each message's route (the sum of its links' latencies)."""
    return np.array(
        [
            sum(link.latency_seconds for link in route_links(platform, int(source), int(target)))
            for source, target in zip(sources, targets, strict=True)
        ]
    )


def _link_uses(platform: Platform, source: int, target: int) -> tuple[tuple[str, int], ...]:
    """Identities of the links a message uses (which device's or site's link, which way)."""
    uses = [("device-up", source)]
    source_site, target_site = platform.site(source), platform.site(target)
    if source_site != target_site:
        if source_site >= 0:
            uses.append(("site-up", source_site))
        if target_site >= 0:
            uses.append(("site-down", target_site))
    uses.append(("device-down", target))
    return tuple(uses)


def representative_flows(
    platform: Platform, phase: Phase, reduce: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(positions to simulate, position whose time each message takes).

    A message whose links no other message of the phase uses is independent; independent
    messages with the same route links and size take the same time, so one represents all.
    Messages that share a link are all simulated, and every message when `reduce` is off.
    Empty and self messages are not simulated; they take no time.
    """
    count = len(phase.sources)
    uses = [
        _link_uses(platform, int(source), int(target))
        for source, target in zip(phase.sources, phase.targets, strict=True)
    ]
    active = [
        position
        for position in range(count)
        if phase.sizes_bytes[position] > 0 and phase.sources[position] != phase.targets[position]
    ]
    if not reduce:
        return np.array(active, dtype=np.int64), np.arange(count)
    users: dict[tuple[str, int], int] = {}
    for position in active:
        for use in uses[position]:
            users[use] = users.get(use, 0) + 1
    represented_by = np.arange(count)
    simulated: list[int] = []
    first_of_class: dict[tuple[Any, ...], int] = {}
    for position in active:
        if any(users[use] > 1 for use in uses[position]):
            simulated.append(position)
            continue
        key = (
            route_links(platform, int(phase.sources[position]), int(phase.targets[position])),
            int(phase.sizes_bytes[position]),
        )
        if key not in first_of_class:
            first_of_class[key] = position
            simulated.append(position)
        represented_by[position] = first_of_class[key]
    return np.array(sorted(simulated), dtype=np.int64), represented_by

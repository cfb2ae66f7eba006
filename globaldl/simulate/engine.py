"""The SimGrid adapter: load Debian's SimGrid and simulate message phases on a device platform.

SimGrid's flow-level TCP model (LV08 by default) decides how long each message takes when it
shares links with others: max-min fair sharing weighted by round-trip time, a bandwidth factor
(TCP's payload efficiency) and a latency factor (slow start), as calibrated and published by
the SimGrid team. Everything here talks to SimGrid; the rest of `globaldl.simulate` deals in
plain data (`Platform`, `Phase`, seconds).

SimGrid allows one engine per process, so every simulation runs in a forked child process and
returns plain numbers; the caller's process never creates an engine.

Flows that share no link with any other flow of their phase cannot slow each other down in
SimGrid's max-min model, so of every class of identical independent flows (same links, same
size) only one is simulated and its time is given to all; this is exact, and it is what keeps
a 10,000-device ring hop to a handful of SimGrid flows.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import numpy as np

# Debian installs python3-simgrid as one extension module in its system dist-packages folder.
DEBIAN_DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")
SIMGRID_MODULE_ENV = "GLOBALDL_SIMGRID_MODULE"
# SimGrid's LV08 network model, as published (Velho and Legrand 2009) and used by default.
LV08_LATENCY_FACTOR = 13.01
LV08_BANDWIDTH_FACTOR = 0.97
LV08_WEIGHT_S = 20537.0

Result = TypeVar("Result")


class SimGridUnavailable(RuntimeError):
    """SimGrid's Python module is not installed where it is looked for."""


def simgrid_module_path() -> Path:
    """The SimGrid extension module for this interpreter (env GLOBALDL_SIMGRID_MODULE first)."""
    override = os.environ.get(SIMGRID_MODULE_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise SimGridUnavailable(f"{SIMGRID_MODULE_ENV}={override}: no such file")
        return path
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    path = DEBIAN_DIST_PACKAGES / f"simgrid{suffix}"
    if not path.is_file():
        raise SimGridUnavailable(
            f"SimGrid's Python module {path} is missing: install Debian's python3-simgrid "
            f"(scripts/setup.sh does) or point {SIMGRID_MODULE_ENV} at a simgrid*.so built for "
            f"Python {sys.version_info.major}.{sys.version_info.minor}"
        )
    return path


@lru_cache(maxsize=1)
def load_simgrid() -> ModuleType:
    """Import SimGrid from its file alone.

    Putting Debian's dist-packages folder on sys.path would let Debian's numpy, yaml and friends
    shadow the virtual environment's; loading the one extension by path brings in nothing else.
    """
    import importlib.util

    path = simgrid_module_path()
    spec = importlib.util.spec_from_file_location("simgrid", path)
    if spec is None or spec.loader is None:
        raise SimGridUnavailable(f"{path} is not a loadable Python module")
    module = importlib.util.module_from_spec(spec)
    with _quiet_stderr():  # SimGrid logs its context factory choice when it loads
        spec.loader.exec_module(module)
    sys.modules["simgrid"] = module
    return module


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


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


@dataclass(frozen=True)
class TcpModel:
    """SimGrid's network model settings: the factors calibration may fit.

    Cross-traffic (SimGrid's reverse flow for each flow's ACKs) is off by default: it couples
    every flow of a ring to its neighbours' and defeats the independent-flow reduction; the
    fitted bandwidth factor carries the ACKs' share of the links instead.
    """

    latency_factor: float = LV08_LATENCY_FACTOR
    bandwidth_factor: float = LV08_BANDWIDTH_FACTOR
    weight_s: float = LV08_WEIGHT_S
    model: str = "LV08"
    crosstraffic: bool = False
    extra_config: tuple[str, ...] = field(default=())

    def engine_arguments(self) -> list[str]:
        """Command-line style arguments for simgrid.Engine."""
        return [
            "globaldl-simulate",
            "--log=root.thres:critical",
            f"--cfg=network/model:{self.model}",
            f"--cfg=network/latency-factor:{float(self.latency_factor)!r}",
            f"--cfg=network/bandwidth-factor:{float(self.bandwidth_factor)!r}",
            f"--cfg=network/weight-S:{float(self.weight_s)!r}",
            f"--cfg=network/crosstraffic:{int(self.crosstraffic)}",
            *(f"--cfg={entry}" for entry in self.extra_config),
        ]


def run_in_child(function: Callable[..., Result], *arguments: Any) -> Result:
    """Run `function(*arguments)` in a forked process (SimGrid allows one engine per process)."""
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_quietly, function, *arguments).result()


def _quietly(function: Callable[..., Result], *arguments: Any) -> Result:
    # SimGrid logs its configuration changes on stderr; failures come back as exceptions.
    with _quiet_stderr():
        return function(*arguments)


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


def simulate_phases(
    platform: Platform, phases: Sequence[Phase], tcp: TcpModel, reduce: bool = True
) -> list[np.ndarray]:
    """Seconds each message of each phase takes, phases one after the other, in SimGrid.

    With `reduce`, only one of each class of identical independent messages is simulated
    (exact: see the module docstring); `reduce=False` simulates every message, for checks.
    """
    plans = []
    for phase in phases:
        simulated, represented_by = representative_flows(platform, phase, reduce)
        plans.append(
            (
                Phase(
                    phase.sources[simulated], phase.targets[simulated], phase.sizes_bytes[simulated]
                ),
                simulated,
                represented_by,
            )
        )
    # Only the devices of simulated messages need hosts: a 10,000-device ring hop becomes a
    # platform of a few dozen hosts. Their messages use no link of any device left out.
    involved = sorted(
        {int(device) for plan in plans for device in (*plan[0].sources, *plan[0].targets)}
    )
    position_of = np.full(platform.devices, -1, dtype=np.int64)
    position_of[involved] = np.arange(len(involved))
    compact = [
        Phase(position_of[phase.sources], position_of[phase.targets], phase.sizes_bytes)
        for phase, _, _ in plans
    ]
    simulated_seconds = (
        run_in_child(_simulate_phases, platform.subset(involved), compact, tcp)
        if involved
        else [np.zeros(0) for _ in plans]
    )
    durations = []
    for (_, simulated, represented_by), seconds in zip(plans, simulated_seconds, strict=True):
        full = np.zeros(len(represented_by))
        full[simulated] = seconds
        durations.append(full[represented_by])
    return durations


def build_platform(simgrid: ModuleType, platform: Platform) -> list[Any]:
    """Hosts for `platform`: a star zone of devices per site under a star zone of the world."""
    world = simgrid.NetZone.create_star_zone("world")
    hosts: list[Any] = [None] * platform.devices
    members: dict[int, list[int]] = {}
    for device in range(platform.devices):
        members.setdefault(platform.site(device), []).append(device)

    def add_device(zone: Any, device: int) -> None:
        host = zone.create_host(f"device-{device}", 1.0e9)
        up = _make_link(zone, f"device-{device}-up", platform.device_up[device])
        down = _make_link(zone, f"device-{device}-down", platform.device_down[device])
        zone.add_route(host.netpoint, None, None, None, [simgrid.LinkInRoute(up)], False)
        zone.add_route(None, host.netpoint, None, None, [simgrid.LinkInRoute(down)], False)
        host.seal()
        hosts[device] = host

    # Devices without a site sit in one zone of their own: SimGrid's star zone routes hosts or
    # child zones, not both. Its link to the world is empty, so nothing of it is shared.
    for site in sorted(members):
        zone = simgrid.NetZone.create_star_zone(f"site-{site}")
        zone.set_parent(world)
        gateway = zone.create_router(f"site-{site}-gateway")
        for device in members[site]:
            add_device(zone, device)
        zone.add_route(gateway, None, None, None, [], False)
        zone.add_route(None, gateway, None, None, [], False)
        zone.seal()
        if site < 0:
            up_links, down_links = [], []
        else:
            up_links = [
                simgrid.LinkInRoute(_make_link(world, f"site-{site}-up", platform.site_up[site]))
            ]
            down_links = [
                simgrid.LinkInRoute(
                    _make_link(world, f"site-{site}-down", platform.site_down[site])
                )
            ]
        world.add_route(zone.netpoint, None, gateway, None, up_links, False)
        world.add_route(None, zone.netpoint, None, gateway, down_links, False)
    world.seal()
    return hosts


def _make_link(zone: Any, name: str, link: Link) -> Any:
    return (
        zone.create_link(name, float(link.bytes_per_second))
        .set_latency(float(link.latency_seconds))
        .seal()
    )


def start_engine(tcp: TcpModel) -> tuple[ModuleType, Any]:
    """SimGrid's module and a new engine configured for `tcp` (once per process)."""
    simgrid = load_simgrid()
    engine = simgrid.Engine(tcp.engine_arguments())
    return simgrid, engine


def _simulate_phases(platform: Platform, phases: list[Phase], tcp: TcpModel) -> list[np.ndarray]:
    simgrid, engine = start_engine(tcp)
    hosts = build_platform(simgrid, platform)
    durations: list[np.ndarray] = [np.zeros(len(phase.sources)) for phase in phases]

    def run_phase(index: int) -> None:
        phase = phases[index]
        started = engine.clock
        comms = [
            simgrid.Comm.sendto_async(hosts[source], hosts[target], int(size))
            for source, target, size in zip(
                phase.sources, phase.targets, phase.sizes_bytes, strict=True
            )
        ]
        for position, comm in enumerate(comms):
            comm.wait()
            durations[index][position] = comm.finish_time - started

    def controller() -> None:
        # A fresh actor per phase: one long-lived actor issuing every phase's messages makes
        # SimGrid slower with each phase (its bookkeeping of finished activities grows).
        for index in range(len(phases)):
            simgrid.Actor.create(f"phase-{index}", hosts[0], run_phase, index).join()

    simgrid.Actor.create("controller", hosts[0], controller)
    engine.run()
    return durations

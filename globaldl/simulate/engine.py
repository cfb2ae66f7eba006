"""The SimGrid adapter: load Debian's SimGrid and simulate message phases on a device platform.

SimGrid's flow-level TCP model (LV08 by default) decides how long each message takes when it
shares links with others: max-min fair sharing weighted by round-trip time, a bandwidth factor
(TCP's payload efficiency) and a latency factor (slow start), as calibrated and published by
the SimGrid team. Everything here talks to SimGrid; the rest of `globaldl.simulate` deals in
plain data (`Platform`, `Phase`, seconds).

SimGrid allows one engine per process, so every simulation runs in a forked child process and
returns plain numbers; the caller's process never creates an engine. The platforms and phases
it simulates are plain data (`globaldl.simulate.topology`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
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

from globaldl.simulate.topology import Link, Phase, Platform, representative_flows

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
    """Run `function(*arguments)` in a forked process (SimGrid allows one engine per process).

    The child must never collect an object it inherited: a caller that loaded TensorFlow (the
    test suite does) leaves traced functions whose finalizers call into TensorFlow's runtime,
    which does not survive a fork, and the child crashed with a segmentation fault when its
    collector happened to run them. So the parent's objects are frozen (`gc.freeze`, moved out
    of the collector's reach) with collection off across the fork, and the child collects only
    what it creates itself.
    """
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=1, mp_context=context, initializer=gc.enable
    ) as pool:
        with _objects_frozen():  # the executor forks its worker on the first submit
            future = pool.submit(_quietly, function, *arguments)
        return future.result()


@contextlib.contextmanager
def _objects_frozen() -> Iterator[None]:
    """Collection off and every object frozen (`gc.freeze`), then both as they were."""
    was_enabled = gc.isenabled()
    gc.disable()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def _quietly(function: Callable[..., Result], *arguments: Any) -> Result:
    # SimGrid logs its configuration changes on stderr; failures come back as exceptions.
    with _quiet_stderr():
        return function(*arguments)


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

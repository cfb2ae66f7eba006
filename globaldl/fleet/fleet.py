"""Bring an emulated device fleet up and down on one Linux machine, and inspect or disturb it."""

from __future__ import annotations

import fcntl
import functools
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from globaldl.fleet import cgroups, sshd, vde
from globaldl.fleet.build import (
    create_fleet,
    device_authorized_keys,
    host_round_trip_ms,
    install_neighbours,
    running_congestion_control,
    start_sshd,
)
from globaldl.fleet.errors import FleetError
from globaldl.fleet.host import (
    check_state_dir_is_private,
    check_subnet_is_free,
    host_networks,
    read_interface_counters,
    require_root,
)
from globaldl.fleet.links import DEVICE_INTERFACE
from globaldl.fleet.paths import HOST
from globaldl.fleet.plan import FleetPlan
from globaldl.fleet.profiles import LinkProfile
from globaldl.fleet.shaping import read_qdiscs
from globaldl.fleet.state import DEFAULT_STATE_DIR, DeviceState, FleetState
from globaldl.fleet.system import kill_processes, run
from globaldl.fleet.teardown import device_pids, emulation_pids, sshd_alive, teardown

# Re-exported: tests and the launcher read these through the fleet module.
__all__ = [
    "Fleet",
    "FleetError",
    "FleetLockTimeoutError",
    "LinkEmulationUnavailableError",
    "device_authorized_keys",
    "emulation_cpu_seconds",
    "host_networks",
    "read_interface_counters",
]

LOCK_TIMEOUT_SECONDS = 120.0
Log = Callable[[str], None]
_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")


LATENCY_MODES: tuple[str, ...] = ("auto", "require", "off")


class FleetLockTimeoutError(FleetError):
    """Another fleet operation on the same state dir held its lock too long."""


class LinkEmulationUnavailableError(ValueError):
    """A profile asks for delay, jitter or loss, and this machine cannot emulate them."""


def _quiet(_: str) -> None:
    pass


def _serialised(method: Callable[_Params, _Result]) -> Callable[_Params, _Result]:
    """Run a state-changing Fleet method under the fleet lock (see Fleet._lock)."""

    @functools.wraps(method)
    def locked(*args: _Params.args, **kwargs: _Params.kwargs) -> _Result:
        fleet = args[0]
        assert isinstance(fleet, Fleet)
        with fleet._lock():
            return method(*args, **kwargs)

    return locked


class Fleet:
    """One emulated fleet, identified by its state directory.

    Each device is a network namespace named after it, joined to a bridge by its access link
    (`eth0` inside; globaldl/fleet/links.py): a veth pair, or a vde2 chain where the profile
    adds delay, jitter or loss. Its uplink is shaped on `eth0`, its downlink on the bridge end.
    With sites, a device's bridge is its site's LAN, joined to the core bridge by the site's
    shared WAN link. Each device's processes are held to a CPU quota and memory limit (cgroup
    v1), and it runs its own sshd with its own host name so horovodrun reaches it as it reaches
    a real host.

    Example:
        >>> fleet = Fleet(Path("/run/globaldl-fleet"))
        >>> fleet.up(plan_fleet([lte, lte]), latency="auto")    # doctest: +SKIP
        >>> fleet.hosts()                                            # doctest: +SKIP
        ['10.77.0.2:1', '10.77.0.3:1']
        >>> fleet.down()                                             # doctest: +SKIP

    """

    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR) -> None:
        self.state_dir = Path(state_dir)

    # ----------------------------------------------------------------- state

    def state(self) -> FleetState | None:
        """The recorded fleet, or None if none is up in this state directory."""
        return FleetState.load(self.state_dir)

    def require_state(self) -> FleetState:
        """The recorded fleet; ValueError saying how to create one otherwise."""
        state = self.state()
        if state is None:
            raise ValueError(
                f"no fleet is up (no state in {self.state_dir}); run `globaldl fleet up` first"
            )
        return state

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """Hold an exclusive flock on this state dir's lock file while the state changes.

        Two `up`s into one state dir would otherwise both find no state and overwrite each
        other's journal. The lock file sits beside the state dir (which itself comes and goes),
        one per state dir, so fleets in other state dirs never wait for this one: an `up` on
        slow links waits minutes for its logins. The holder removes the file; a waiter that
        then finds its file gone or replaced starts over.
        """
        parent = self.state_dir.parent
        parent.mkdir(parents=True, exist_ok=True)
        path = parent / f".{self.state_dir.name}.lock"
        deadline = time.monotonic() + LOCK_TIMEOUT_SECONDS
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise FleetLockTimeoutError(
                                f"another fleet operation on {self.state_dir} has held {path} "
                                f"for {LOCK_TIMEOUT_SECONDS:g} s"
                            ) from None
                        time.sleep(0.1)
                if _same_file(fd, path):
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
            os.close(fd)

    @property
    def identity_file(self) -> Path:
        """The private key that logs in to every device as root."""
        return self.state_dir / "ssh" / "id_ed25519"

    # -------------------------------------------------------------------- up

    @_serialised
    def up(self, plan: FleetPlan, *, latency: str = "auto", log: Log = _quiet) -> FleetState:
        """Create the planned fleet; on any failure remove everything created so far and raise."""
        require_root()
        if self.state() is not None:
            raise ValueError(
                f"a fleet is already up in {self.state_dir}; run `globaldl fleet down` first"
            )
        check_state_dir_is_private(self.state_dir)
        for controller in cgroups.CONTROLLERS:
            cgroups.cgroup_v1_mount(controller)
        check_subnet_is_free(plan.subnet)
        emulator_available, emulator = self._check_link_emulation(plan, latency, log)
        emulate = emulator_available and latency != "off"

        state_dir_existed = self.state_dir.exists()
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        state = FleetState(
            prefix=plan.prefix,
            subnet=plan.subnet,
            bridge=plan.bridge,
            host_address=plan.host_address,
            state_dir=str(self.state_dir),
            identity_file=str(self.identity_file),
            emulator=emulator,
            emulator_available=emulator_available,
            latency_emulated=emulate and any(profile.impaired for profile in _profiles(plan)),
        )
        state.save()
        try:
            if not state_dir_existed:
                state.record("directory", path=str(self.state_dir), remove="tree")
            create_fleet(state, plan, emulate=emulate, identity_file=self.identity_file, log=log)
        except BaseException as error:
            log(f"fleet up failed ({error}); rolling back")
            leftovers = teardown(state, log)
            message = f"fleet up failed: {error}"
            message += (
                f"; rollback could not remove: {leftovers}"
                if leftovers
                else "; everything it created was removed"
            )
            if isinstance(error, ValueError | KeyboardInterrupt):
                raise
            raise FleetError(message) from error
        return state

    def _check_link_emulation(self, plan: FleetPlan, latency: str, log: Log) -> tuple[bool, str]:
        """Decide whether the profiles' delay, jitter and loss are emulated.

        `auto` emulates them where vde2 is installed and otherwise shapes rates only, saying so
        loudly (and `status` keeps saying so); `require` refuses to run without emulation;
        `off` shapes rates only. Returns (available, what emulates or why nothing can).
        """
        if latency not in LATENCY_MODES:
            raise ValueError(f"latency {latency!r} is not one of: {', '.join(LATENCY_MODES)}")
        available, detail = vde.availability()
        needing = sorted({p.name for p in _profiles(plan) if p.impaired})
        if not needing or latency == "off" or available:
            return available, detail
        if latency == "require":
            raise LinkEmulationUnavailableError(
                f"profile(s) {', '.join(needing)} need delay/jitter/loss emulation, but it is "
                f"unavailable here: {detail}. Use --latency auto or off to shape the RATES ONLY "
                "(delay, jitter and loss will NOT be emulated), or a profile without delay "
                "(e.g. custom:UP:DOWN)."
            )
        log(
            f"WARNING: link emulation is unavailable ({detail}): shaping RATES ONLY. Delay, "
            f"jitter and loss of {', '.join(needing)} are NOT emulated (--latency require "
            "refuses instead)."
        )
        return available, detail

    # ------------------------------------------------------------------ down

    @_serialised
    def down(self, log: Log = _quiet) -> bool:
        """Remove everything the recorded fleet created; False if there was nothing to remove.

        Safe to run twice, and after a crashed run or a killed `fleet up`. Raises FleetError
        naming what could not be removed (the state file then still lists it, so a second
        `down` retries).
        """
        require_root()
        state = self.state()
        if state is None:
            return False
        leftovers = teardown(state, log)
        if leftovers:
            raise FleetError(
                f"fleet down could not remove: {leftovers}; run `globaldl fleet down` again"
            )
        return True

    # ------------------------------------------------------- inspect/disturb

    def status(self) -> dict[str, Any]:
        """The fleet as the system holds it now: devices, limits, live qdiscs, sshd, counters."""
        state = self.require_state()
        devices = []
        for device in state.devices:
            namespace_exists = Path(f"/run/netns/{device.name}").exists()
            entry: dict[str, Any] = {
                "name": device.name,
                "address": device.address,
                "status": device.status,
                "profile": device.profile.get_config(),
                "site": device.site,
                "link": device.link,
                "sshd_alive": sshd_alive(device),
                "namespace_exists": namespace_exists,
            }
            try:
                entry["limits"] = cgroups.read_limits(
                    Path(device.cpu_group), Path(device.memory_group)
                )
            except FileNotFoundError:
                entry["limits"] = None
            if namespace_exists:
                entry["uplink_qdiscs"] = read_qdiscs(DEVICE_INTERFACE, device.name)
                entry["downlink_qdiscs"] = read_qdiscs(device.host_interface)
                entry["counters"] = read_interface_counters(device.name)
            entry["congestion_control"] = (
                running_congestion_control(device.name)
                if namespace_exists
                else device.congestion_control
            )
            devices.append(entry)
        sites = []
        for site in state.sites:
            site_entry: dict[str, Any] = {**site.to_dict(), "bridge_exists": False}
            if Path(f"/sys/class/net/{site.bridge}").exists():
                site_entry["bridge_exists"] = True
                site_entry["uplink_qdiscs"] = read_qdiscs(site.uplink_interface)
                site_entry["downlink_qdiscs"] = read_qdiscs(site.core_interface)
            sites.append(site_entry)
        return {
            "state_dir": state.state_dir,
            "phase": state.phase,
            "bridge": state.bridge,
            "host_address": state.host_address,
            "subnet": state.subnet,
            "emulator": state.emulator,
            "emulator_available": state.emulator_available,
            "latency_emulated": state.latency_emulated,
            "emulation": self.emulation_usage(state),
            "identity_file": state.identity_file,
            "site_map": str(state.site_map_path) if state.site_map_path else None,
            "sites": sites,
            "devices": devices,
        }

    def emulation_usage(self, state: FleetState | None = None) -> dict[str, Any]:
        """The link emulation's processes and the CPU they used so far (out of device quotas)."""
        state = state or self.require_state()
        recorded = [r for r in state.resources if r["kind"] == "process"]
        return {
            "cgroup": f"{state.prefix}-fleet/{cgroups.EMULATION_GROUP}",
            "processes_recorded": len(recorded),
            "processes_alive": len(emulation_pids(state)),
            "cpu_seconds": emulation_cpu_seconds(state),
        }

    def live_devices(self) -> list[DeviceState]:
        """Devices that are up and whose sshd is running."""
        return [d for d in self.require_state().devices if d.status == "up" and sshd_alive(d)]

    def hosts(self) -> list[str]:
        """`ADDR:1` per live device: a Horovod host list, and Elastic host-discovery output."""
        return [f"{device.address}:1" for device in self.live_devices()]

    def kill_workers(self) -> list[int]:
        """Kill every process on every device except its sshd listener; return the pids killed."""
        state = self.require_state()
        pids: set[int] = set()
        for device in state.devices:
            pids |= device_pids(device) - {device.sshd_pid}
        kill_processes(pids)
        return sorted(pids)

    def measure(self, name: str) -> dict[str, Any]:
        """Round trip, loss and rate of a device's path to the core (see linkcheck.py)."""
        from globaldl.fleet.linkcheck import measure_path

        return measure_path(self.require_state(), name, HOST, probes=50)

    @_serialised
    def kill(self, name: str) -> None:
        """Make a device fail: kill everything running on it and take its link down."""
        require_root()
        state = self.require_state()
        device = state.device(name)
        kill_processes(device_pids(device))
        run(["ip", "-n", device.name, "link", "set", DEVICE_INTERFACE, "down"])
        run(["ip", "link", "set", device.host_interface, "down"])
        device.status, device.sshd_pid, device.sshd_start_ticks = "killed", None, None
        state.save()

    @_serialised
    def revive(self, name: str) -> None:
        """Bring a killed device back: link up, default route, sshd, login check."""
        require_root()
        state = self.require_state()
        device = state.device(name)
        if device.status == "up" and sshd_alive(device):
            return
        run(["ip", "link", "set", device.host_interface, "up"])
        run(["ip", "-n", device.name, "link", "set", DEVICE_INTERFACE, "up"])
        # Taking eth0 down dropped the default route through it, and its neighbour entries.
        run(["ip", "-n", device.name, "route", "replace", "default", "via", state.host_address])
        install_neighbours(state, [device])
        if not sshd_alive(device):
            start_sshd(self.state_dir, device)
        state.save()
        sshd.wait_for_login(
            device.address,
            Path(state.identity_file),
            device.name,
            host_round_trip_ms(state, device),
        )
        device.status = "up"
        state.save()


# --------------------------------------------------------------------- helpers


def _same_file(fd: int, path: Path) -> bool:
    """True while `path` still names the file open as `fd` (not removed, not replaced)."""
    try:
        return os.fstat(fd).st_ino == path.stat().st_ino
    except FileNotFoundError:
        return False


def emulation_cpu_seconds(state: FleetState) -> float | None:
    """CPU seconds the fleet's link emulation used so far (cpuacct), None without the group."""
    return cgroups.emulation_cpu_seconds(state.prefix)


def _profiles(plan: FleetPlan) -> list[LinkProfile]:
    """Every link profile of a plan: the devices' and the sites' WAN links."""
    return [d.profile for d in plan.devices] + [site.wan for site in plan.sites]

"""Bring an emulated device fleet up and down on one Linux machine, and inspect or disturb it."""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from globaldl.fleet import cgroups, sshd, vde
from globaldl.fleet.links import DEVICE_INTERFACE, create_link, device_link, site_link
from globaldl.fleet.paths import HOST, fleet_path
from globaldl.fleet.plan import DeviceSpec, FleetPlan, SiteSpec
from globaldl.fleet.profiles import LinkProfile
from globaldl.fleet.shaping import read_qdiscs
from globaldl.fleet.sites import write_site_map
from globaldl.fleet.state import DEFAULT_STATE_DIR, DeviceState, FleetState, SiteState
from globaldl.fleet.system import kill_processes, run
from globaldl.fleet.teardown import device_pids, emulation_pids, sshd_alive, teardown

LOCK_TIMEOUT_SECONDS = 120.0
Log = Callable[[str], None]
_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")


LATENCY_MODES: tuple[str, ...] = ("auto", "require", "off")


class FleetError(RuntimeError):
    """The system refused a fleet operation (after any rollback has run)."""


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
                            raise FleetError(
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
        _require_root()
        if self.state() is not None:
            raise ValueError(
                f"a fleet is already up in {self.state_dir}; run `globaldl fleet down` first"
            )
        _check_state_dir_is_private(self.state_dir)
        for controller in cgroups.CONTROLLERS:
            cgroups.cgroup_v1_mount(controller)
        _check_subnet_is_free(plan.subnet)
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
            self._create(state, plan, emulate, log)
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

    def _create(self, state: FleetState, plan: FleetPlan, emulate: bool, log: Log) -> None:
        ssh_dir = self.state_dir / "ssh"
        devices_dir = self.state_dir / "devices"
        links_dir = self.state_dir / "links"
        for directory in (ssh_dir, devices_dir, links_dir):
            if not directory.exists():
                directory.mkdir(mode=0o700)
                state.record("directory", path=str(directory), remove="tree")
        sshd.generate_key(self.identity_file, f"globaldl-fleet-{plan.prefix}")
        authorized_keys = ssh_dir / "authorized_keys"
        authorized_keys.write_text(Path(f"{self.identity_file}.pub").read_text())
        authorized_keys.chmod(0o600)
        if sshd.ensure_privilege_separation_dir():
            state.record("directory", path="/run/sshd", remove="sshd_privsep")
        netns_etc = Path("/etc/netns")
        if not netns_etc.exists():
            netns_etc.mkdir(mode=0o755)
            state.record("directory", path=str(netns_etc), remove="if_empty")
        known_hosts = sshd.known_hosts_path()
        state.record(
            "known_hosts",
            path=str(known_hosts),
            file_existed=known_hosts.exists(),
            dir_existed=known_hosts.parent.exists(),
        )

        _create_recorded(
            state, "bridge", plan.bridge, ["ip", "link", "add", plan.bridge, "type", "bridge"]
        )
        run(["ip", "addr", "add", f"{plan.host_address}/{plan.prefix_length}", "dev", plan.bridge])
        run(["ip", "link", "set", plan.bridge, "up"])

        group_parent = f"{plan.prefix}-fleet"
        for controller in cgroups.EMULATION_CONTROLLERS:
            path = cgroups.create_group(controller, group_parent)
            state.record("cgroup", path=str(path))
        emulation_groups = []
        for controller in cgroups.EMULATION_CONTROLLERS:
            path = cgroups.create_group(controller, f"{group_parent}/{cgroups.EMULATION_GROUP}")
            state.record("cgroup", path=str(path))
            emulation_groups.append(str(path))
        cgroups.set_cpu_shares(Path(emulation_groups[0]), cgroups.EMULATION_CPU_SHARES)

        def build(link: Any) -> str:
            return create_link(
                link, state, emulate=emulate, work_dir=links_dir, groups=emulation_groups
            )

        for site in plan.sites:
            log(f"creating site {site.name} ({site.bridge}, wan {site.wan.name})")
            state.sites.append(self._create_site(state, plan, site, build))
            state.save()
        for spec in plan.devices:
            log(f"creating {spec.name} ({spec.address}, {spec.profile.name})")
            device = self._create_device(
                state, plan, spec, group_parent, devices_dir / spec.name, authorized_keys, build
            )
            state.devices.append(device)
            state.save()
        if state.sites:
            write_site_map(
                self.state_dir / "sites.yaml",
                {
                    site.name: [state.device(name).address for name in site.devices]
                    for site in state.sites
                },
            )
        # Logins wait in parallel: on slow links each takes minutes. Every process of the fleet
        # is started by now, so no fork happens while these threads run.
        with ThreadPoolExecutor(max_workers=min(16, len(state.devices))) as pool:
            waits = [
                pool.submit(
                    sshd.wait_for_login,
                    device.address,
                    self.identity_file,
                    device.name,
                    _host_round_trip_ms(state, device),
                )
                for device in state.devices
            ]
            for wait in waits:
                wait.result()
        for device in state.devices:
            device.status = "up"
        state.phase = "up"
        state.save()

    def _create_device(
        self,
        state: FleetState,
        plan: FleetPlan,
        spec: DeviceSpec,
        group_parent: str,
        device_dir: Path,
        authorized_keys: Path,
        build_link: Callable[[Any], str],
    ) -> DeviceState:
        netns = spec.name
        _create_recorded(state, "netns", netns, ["ip", "netns", "add", netns])
        run(["ip", "-n", netns, "link", "set", "lo", "up"])
        link_kind = build_link(device_link(plan, spec))
        run(
            [
                "ip",
                "-n",
                netns,
                "addr",
                "add",
                f"{spec.address}/{plan.prefix_length}",
                "dev",
                DEVICE_INTERFACE,
            ]
        )
        # The host is the device's gateway, so horovodrun's driver is reachable on any of the
        # host's addresses. The fleet never enables forwarding or NAT: nothing leaves the machine.
        run(["ip", "-n", netns, "route", "add", "default", "via", plan.host_address])

        etc_dir = Path("/etc/netns") / netns
        etc_dir.mkdir(mode=0o755)
        state.record("directory", path=str(etc_dir), remove="tree")
        # `ip netns exec` bind-mounts this over /etc/hosts: each device resolves its own name
        # (Gloo falls back to the host name) and every other device's.
        hosts_lines = [
            "127.0.0.1 localhost",
            "::1 localhost ip6-localhost ip6-loopback",
            f"{plan.host_address} {plan.prefix}-host",
        ]
        hosts_lines += [f"{other.address} {other.name}" for other in plan.devices]
        (etc_dir / "hosts").write_text("\n".join(hosts_lines) + "\n")

        groups = []
        for controller in cgroups.CONTROLLERS:
            group = cgroups.create_group(controller, f"{group_parent}/{spec.name}")
            state.record("cgroup", path=str(group))
            groups.append(group)
        cpu_group, memory_group = groups
        cgroups.set_cpu_limit(cpu_group, spec.cpu_cores)
        cgroups.set_memory_limit(memory_group, spec.memory_bytes)

        device_dir.mkdir(mode=0o700)
        host_key = device_dir / "ssh_host_ed25519_key"
        host_key_public = sshd.generate_key(host_key, f"{spec.name}-host")
        config = device_dir / "sshd_config"
        config.write_text(
            sshd.sshd_config_text(spec.address, host_key, authorized_keys, device_dir / "sshd.pid")
        )
        device = DeviceState(
            name=spec.name,
            address=spec.address,
            host_interface=spec.host_interface,
            profile=spec.profile,
            cpu_cores=spec.cpu_cores,
            memory_bytes=spec.memory_bytes,
            cpu_group=str(cpu_group),
            memory_group=str(memory_group),
            host_key_public=host_key_public,
            site=spec.site,
            link=link_kind,
        )
        self._start_sshd(device)
        return device

    def _create_site(
        self, state: FleetState, plan: FleetPlan, site: SiteSpec, build_link: Callable[[Any], str]
    ) -> SiteState:
        _create_recorded(
            state, "bridge", site.bridge, ["ip", "link", "add", site.bridge, "type", "bridge"]
        )
        run(["ip", "link", "set", site.bridge, "up"])
        link_kind = build_link(site_link(plan, site))
        return SiteState(
            name=site.name,
            bridge=site.bridge,
            wan=site.wan,
            uplink_interface=site.uplink_interface,
            core_interface=site.core_interface,
            devices=list(site.devices),
            link=link_kind,
        )

    def _start_sshd(self, device: DeviceState) -> None:
        device_dir = self.state_dir / "devices" / device.name
        device.sshd_pid, device.sshd_start_ticks = sshd.start_sshd(
            device.name,
            device.name,
            device_dir / "sshd_config",
            device_dir / "sshd.log",
            [device.cpu_group, device.memory_group],
        )

    # ------------------------------------------------------------------ down

    @_serialised
    def down(self, log: Log = _quiet) -> bool:
        """Remove everything the recorded fleet created; False if there was nothing to remove.

        Safe to run twice, and after a crashed run or a killed `fleet up`. Raises FleetError
        naming what could not be removed (the state file then still lists it, so a second
        `down` retries).
        """
        _require_root()
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
        _require_root()
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
        _require_root()
        state = self.require_state()
        device = state.device(name)
        if device.status == "up" and sshd_alive(device):
            return
        run(["ip", "link", "set", device.host_interface, "up"])
        run(["ip", "-n", device.name, "link", "set", DEVICE_INTERFACE, "up"])
        # Taking eth0 down dropped the default route through it.
        run(["ip", "-n", device.name, "route", "replace", "default", "via", state.host_address])
        if not sshd_alive(device):
            self._start_sshd(device)
        state.save()
        sshd.wait_for_login(
            device.address,
            Path(state.identity_file),
            device.name,
            _host_round_trip_ms(state, device),
        )
        device.status = "up"
        state.save()


# --------------------------------------------------------------------- helpers


def _require_root() -> None:
    if os.geteuid() != 0:
        raise PermissionError(
            "the fleet creates namespaces, links, qdiscs and cgroups: run it as root"
        )


def _check_state_dir_is_private(state_dir: Path) -> None:
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


def _check_subnet_is_free(subnet: str) -> None:
    """Refuse a subnet that overlaps any address or route the host already has."""
    network = ipaddress.ip_network(subnet)
    for used, owner in host_networks():
        if used.overlaps(network):
            raise ValueError(f"subnet {subnet} clashes with {owner}; choose another --subnet")


def emulation_cpu_seconds(state: FleetState) -> float | None:
    """CPU seconds the fleet's link emulation used so far (cpuacct), None without the group."""
    return cgroups.emulation_cpu_seconds(state.prefix)


def _create_recorded(state: FleetState, kind: str, name: str, argv: list[str]) -> None:
    """Journal a namespace or link, then create it: a `fleet up` killed meanwhile orphans nothing.

    A name that already exists belongs to someone else: it is not journaled (so never removed),
    and the command fails on it as it would anyway.
    """
    existing = Path("/run/netns" if kind == "netns" else "/sys/class/net") / name
    if not existing.exists():
        state.record(kind, name=name)
    run(argv)


def _same_file(fd: int, path: Path) -> bool:
    """True while `path` still names the file open as `fd` (not removed, not replaced)."""
    try:
        return os.fstat(fd).st_ino == path.stat().st_ino
    except FileNotFoundError:
        return False


def _host_round_trip_ms(state: FleetState, device: DeviceState) -> float:
    """The device's worst round trip to the host (delays plus jitter), for the login's waits."""
    path = fleet_path(state, device.name, HOST)
    return path.round_trip_ms() + sum(hop.jitter_ms for hop in (*path.forward, *path.backward))


def _profiles(plan: FleetPlan) -> list[LinkProfile]:
    """Every link profile of a plan: the devices' and the sites' WAN links."""
    return [d.profile for d in plan.devices] + [site.wan for site in plan.sites]


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

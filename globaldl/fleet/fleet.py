"""Bring an emulated device fleet up and down on one Linux machine, and inspect or disturb it."""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from globaldl.fleet import cgroups, sshd
from globaldl.fleet.plan import DeviceSpec, FleetPlan
from globaldl.fleet.shaping import LinkDirection, apply_shaping, probe_netem, read_qdiscs
from globaldl.fleet.state import DEFAULT_STATE_DIR, DeviceState, FleetState
from globaldl.fleet.system import CommandError, is_same_process, kill_processes, run

DEVICE_INTERFACE = "eth0"
LOCK_TIMEOUT_SECONDS = 120.0
Log = Callable[[str], None]
_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")


LATENCY_MODES: tuple[str, ...] = ("auto", "require", "off")


class FleetError(RuntimeError):
    """The system refused a fleet operation (after any rollback has run)."""


class FleetLockTimeoutError(FleetError):
    """Another fleet operation under the same parent directory held the lock too long."""


class NetemUnavailableError(ValueError):
    """A profile needs latency or loss emulation, and this kernel has no tc netem."""


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

    Each device is a network namespace named after it, joined to a bridge by a veth pair
    (`eth0` inside); its uplink is shaped on `eth0`, its downlink on the host end of the pair.
    Its processes are held to a CPU quota and memory limit (cgroup v1), and it runs its own
    sshd with its own host name so horovodrun reaches it as it reaches a real host.

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
        """Hold an exclusive flock on the state dir's parent while the state changes.

        Two `up`s into one state dir would otherwise both find no state and overwrite each
        other's journal. The lock is on the parent because the state dir itself comes and goes.
        """
        parent = self.state_dir.parent
        parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            deadline = time.monotonic() + LOCK_TIMEOUT_SECONDS
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise FleetLockTimeoutError(
                            f"another fleet operation has held the lock on {parent} for "
                            f"{LOCK_TIMEOUT_SECONDS:g} s"
                        ) from None
                    time.sleep(0.1)
            yield
        finally:
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
        netem_available = self._check_netem(plan, latency, log)

        state_dir_existed = self.state_dir.exists()
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        state = FleetState(
            prefix=plan.prefix,
            subnet=plan.subnet,
            bridge=plan.bridge,
            host_address=plan.host_address,
            state_dir=str(self.state_dir),
            identity_file=str(self.identity_file),
            netem_available=netem_available,
            latency_emulated=netem_available and any(d.profile.needs_netem for d in plan.devices),
        )
        state.save()
        try:
            if not state_dir_existed:
                state.record("directory", path=str(self.state_dir), remove="tree")
            self._create(state, plan, log)
        except BaseException as error:
            log(f"fleet up failed ({error}); rolling back")
            leftovers = self._teardown(state, log)
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

    def _check_netem(self, plan: FleetPlan, latency: str, log: Log) -> bool:
        """Decide whether the profiles' latency, jitter and loss are emulated.

        `auto` emulates them where the kernel has netem and otherwise shapes rates only, saying
        so loudly (and `status` keeps saying so); `require` refuses to run without netem;
        `off` shapes rates only.
        """
        if latency not in LATENCY_MODES:
            raise ValueError(f"latency {latency!r} is not one of: {', '.join(LATENCY_MODES)}")
        needing = sorted({d.profile.name for d in plan.devices if d.profile.needs_netem})
        if not needing or latency == "off":
            return False
        probe = probe_netem()
        if probe.available:
            return True
        if latency == "require":
            raise NetemUnavailableError(
                f"profile(s) {', '.join(needing)} need latency/jitter/loss emulation, but tc netem "
                f"is unavailable on this kernel ({probe.detail}). Use --latency auto or off to "
                "shape the RATES ONLY (latency, jitter and loss will NOT be emulated), a profile "
                "without latency (e.g. custom:UP:DOWN), or a kernel with sch_netem "
                "(modprobe sch_netem)."
            )
        log(
            f"WARNING: tc netem is unavailable on this kernel ({probe.detail}): shaping RATES "
            f"ONLY. Latency, jitter and loss of {', '.join(needing)} are NOT emulated "
            "(--latency require refuses instead)."
        )
        return False

    def _create(self, state: FleetState, plan: FleetPlan, log: Log) -> None:
        ssh_dir = self.state_dir / "ssh"
        devices_dir = self.state_dir / "devices"
        for directory in (ssh_dir, devices_dir):
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

        run(["ip", "link", "add", plan.bridge, "type", "bridge"])
        state.record("bridge", name=plan.bridge)
        run(["ip", "addr", "add", f"{plan.host_address}/{plan.prefix_length}", "dev", plan.bridge])
        run(["ip", "link", "set", plan.bridge, "up"])

        group_parent = f"{plan.prefix}-fleet"
        for controller in cgroups.fleet_controllers():
            path = cgroups.create_group(controller, group_parent)
            state.record("cgroup", path=str(path))

        for spec in plan.devices:
            log(f"creating {spec.name} ({spec.address}, {spec.profile.name})")
            device = self._create_device(
                state, plan, spec, group_parent, devices_dir / spec.name, authorized_keys
            )
            state.devices.append(device)
            state.save()
        for device in state.devices:
            sshd.wait_for_login(device.address, self.identity_file, device.name)
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
    ) -> DeviceState:
        netns = spec.name
        if Path(f"/run/netns/{netns}").exists():
            raise FleetError(f"network namespace {netns} already exists; choose another --prefix")
        # Journaled before it exists: a `fleet up` killed while `ip netns add` runs would
        # otherwise leave a namespace no state knows (undo skips one that never came).
        state.record("netns", name=netns)
        run(["ip", "netns", "add", netns])
        run(["ip", "-n", netns, "link", "set", "lo", "up"])
        run(
            [
                "ip",
                "link",
                "add",
                spec.host_interface,
                "type",
                "veth",
                "peer",
                "name",
                DEVICE_INTERFACE,
                "netns",
                netns,
            ]
        )
        state.record("link", name=spec.host_interface)
        run(["ip", "link", "set", spec.host_interface, "master", plan.bridge, "up"])
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
        run(["ip", "-n", netns, "link", "set", DEVICE_INTERFACE, "up"])
        # The host is the device's gateway, so horovodrun's driver is reachable on any of the
        # host's addresses. The fleet never enables forwarding or NAT: nothing leaves the machine.
        run(["ip", "-n", netns, "route", "add", "default", "via", plan.host_address])
        _shape(spec, netns, state.netem_available)

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
        # The device's own /etc/hostname, as a real device has: provisioning may set it without
        # touching this machine's.
        (etc_dir / "hostname").write_text(f"{spec.name}\n")

        groups = {}
        for controller in cgroups.fleet_controllers():
            group = cgroups.create_group(controller, f"{group_parent}/{spec.name}")
            state.record("cgroup", path=str(group))
            groups[controller] = group
        cpu_group, memory_group = groups["cpu"], groups["memory"]
        cgroups.set_cpu_limit(cpu_group, spec.cpu_cores)
        cgroups.set_memory_limit(memory_group, spec.memory_bytes)

        device_dir.mkdir(mode=0o700)
        host_key = device_dir / "ssh_host_ed25519_key"
        host_key_public = sshd.generate_key(host_key, f"{spec.name}-host")
        config = device_dir / "sshd_config"
        config.write_text(
            sshd.sshd_config_text(
                spec.address,
                host_key,
                [authorized_keys, device_authorized_keys(device_dir)],
                device_dir / "sshd.pid",
            )
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
        )
        self._start_sshd(device)
        return device

    def _start_sshd(self, device: DeviceState) -> None:
        device_dir = self.state_dir / "devices" / device.name
        device.sshd_pid, device.sshd_start_ticks = sshd.start_sshd(
            device.name,
            device.name,
            device_dir / "sshd_config",
            device_dir / "sshd.log",
            [
                str(group)
                for group in cgroups.groups_to_join(
                    Path(device.cpu_group), Path(device.memory_group)
                )
            ],
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
        leftovers = self._teardown(state, log)
        if leftovers:
            raise FleetError(
                f"fleet down could not remove: {leftovers}; run `globaldl fleet down` again"
            )
        return True

    def _teardown(self, state: FleetState, log: Log) -> list[str]:
        """Kill the fleet's processes, undo the journal newest first; return what stayed."""
        kill_processes(_fleet_pids(state))
        failures: list[str] = []
        for resource in reversed(list(state.resources)):
            try:
                _undo(resource, state)
            except (OSError, CommandError, RuntimeError) as error:
                failures.append(
                    f"{resource['kind']} {resource.get('name') or resource.get('path')}: {error}"
                )
                continue
            state.resources.remove(resource)
            if state.path.parent.exists():
                state.save()
        if failures:
            if state.path.parent.exists():
                state.save()
            for failure in failures:
                log(f"could not remove {failure}")
            return failures
        state.path.unlink(missing_ok=True)
        return []

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
                "sshd_alive": _sshd_alive(device),
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
        return {
            "state_dir": state.state_dir,
            "phase": state.phase,
            "bridge": state.bridge,
            "host_address": state.host_address,
            "subnet": state.subnet,
            "netem_available": state.netem_available,
            "latency_emulated": state.latency_emulated,
            "identity_file": state.identity_file,
            "devices": devices,
        }

    def live_devices(self) -> list[DeviceState]:
        """Devices that are up and whose sshd is running."""
        return [d for d in self.require_state().devices if d.status == "up" and _sshd_alive(d)]

    def hosts(self) -> list[str]:
        """`ADDR:1` per live device: a Horovod host list, and Elastic host-discovery output."""
        return [f"{device.address}:1" for device in self.live_devices()]

    def kill_workers(self) -> list[int]:
        """Kill every process on every device except its sshd listener; return the pids killed."""
        state = self.require_state()
        pids: set[int] = set()
        for device in state.devices:
            pids |= _device_pids(device) - {device.sshd_pid}
        kill_processes(pids)
        return sorted(pids)

    @_serialised
    def kill(self, name: str) -> None:
        """Make a device fail: kill everything running on it and take its link down."""
        _require_root()
        state = self.require_state()
        device = state.device(name)
        kill_processes(_device_pids(device))
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
        if device.status == "up" and _sshd_alive(device):
            return
        run(["ip", "link", "set", device.host_interface, "up"])
        run(["ip", "-n", device.name, "link", "set", DEVICE_INTERFACE, "up"])
        # Taking eth0 down dropped the default route through it.
        run(["ip", "-n", device.name, "route", "replace", "default", "via", state.host_address])
        if not _sshd_alive(device):
            self._start_sshd(device)
        state.save()
        sshd.wait_for_login(device.address, Path(state.identity_file), device.name)
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


def _shape(spec: DeviceSpec, netns: str, netem_available: bool) -> None:
    profile = spec.profile if netem_available else spec.profile.rates_only()
    delay = {
        "one_way_latency_ms": profile.one_way_latency_ms,
        "jitter_ms": profile.jitter_ms,
        "loss_percent": profile.loss_percent,
    }
    apply_shaping(DEVICE_INTERFACE, LinkDirection(profile.up_kbit_per_second, **delay), netns=netns)
    apply_shaping(spec.host_interface, LinkDirection(profile.down_kbit_per_second, **delay))


def device_authorized_keys(device_dir: Path) -> Path:
    """The device's own authorized_keys file (read by its sshd after the fleet's shared one)."""
    return device_dir / "authorized_keys"


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


def _sshd_alive(device: DeviceState) -> bool:
    return (
        device.sshd_pid is not None
        and device.sshd_start_ticks is not None
        and is_same_process(device.sshd_pid, device.sshd_start_ticks)
    )


def _netns_pids(name: str) -> list[int]:
    if not Path(f"/run/netns/{name}").exists():
        return []
    completed = run(["ip", "netns", "pids", name], check=False)
    return [int(pid) for pid in completed.stdout.split()]


def _device_pids(device: DeviceState) -> set[int]:
    pids = set(_netns_pids(device.name))
    for group in (device.cpu_group, device.memory_group):
        pids.update(cgroups.group_pids(Path(group)))
    if _sshd_alive(device) and device.sshd_pid is not None:
        pids.add(device.sshd_pid)
    return pids


def _fleet_pids(state: FleetState) -> set[int]:
    pids: set[int] = set()
    for device in state.devices:
        pids |= _device_pids(device)
    for resource in state.resources:
        if resource["kind"] == "netns":
            pids.update(_netns_pids(resource["name"]))
        elif resource["kind"] == "cgroup":
            pids.update(cgroups.group_pids(Path(resource["path"])))
    return pids


def _undo(resource: dict[str, Any], state: FleetState) -> None:
    kind = resource["kind"]
    if kind == "netns":
        kill_processes(_netns_pids(resource["name"]))
        if Path(f"/run/netns/{resource['name']}").exists():
            run(["ip", "netns", "del", resource["name"]])
    elif kind in ("link", "bridge"):
        if Path(f"/sys/class/net/{resource['name']}").exists():
            run(["ip", "link", "del", resource["name"]])
    elif kind == "cgroup":
        cgroups.remove_group(Path(resource["path"]))
    elif kind == "directory":
        _remove_directory(Path(resource["path"]), resource["remove"])
    elif kind == "known_hosts":
        path = Path(resource["path"])
        sshd.forget_host_keys(path, [device.host_key_public for device in state.devices])
        if not resource["file_existed"] and path.exists() and not path.read_text().strip():
            path.unlink()
        if not resource["dir_existed"] and path.parent.exists() and not any(path.parent.iterdir()):
            path.parent.rmdir()
    else:
        raise RuntimeError(f"unknown resource kind {kind!r} in the state file")


def _remove_directory(path: Path, mode: str) -> None:
    if not path.exists():
        return
    if mode == "tree":
        shutil.rmtree(path)
    elif mode == "if_empty":
        if not any(path.iterdir()):
            path.rmdir()
    elif mode == "sshd_privsep":
        # Another sshd (the system's, another fleet's) still needs its chroot directory.
        if not any(path.iterdir()) and not _any_sshd_running():
            path.rmdir()
    else:
        raise RuntimeError(f"unknown directory removal mode {mode!r}")


def _any_sshd_running() -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "exe") == sshd.SSHD:
                    return True
            except OSError:
                continue
    return False

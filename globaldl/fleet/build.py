"""Create what a fleet plan describes: bridges, sites, devices with their links, sshd logins."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from globaldl.files import write_text_atomically
from globaldl.fleet import cgroups, sshd
from globaldl.fleet.errors import FleetError
from globaldl.fleet.links import DEVICE_INTERFACE, create_link, device_link, site_link
from globaldl.fleet.paths import HOST, fleet_path
from globaldl.fleet.plan import DeviceSpec, FleetPlan, SiteSpec
from globaldl.fleet.sites import write_site_map
from globaldl.fleet.state import DeviceState, FleetState, SiteState
from globaldl.fleet.system import run

Log = Callable[[str], None]


def create_fleet(
    state: FleetState, plan: FleetPlan, *, emulate: bool, identity_file: Path, log: Log
) -> None:
    """Create everything `plan` describes into the journaled `state`, devices up and logged in.

    Every resource is journaled as it comes (or before, where a kill could orphan it), so
    a failure or a killed `fleet up` leaves nothing `fleet down` cannot find.
    """
    state_dir = Path(state.state_dir)
    ssh_dir = state_dir / "ssh"
    devices_dir = state_dir / "devices"
    links_dir = state_dir / "links"
    for directory in (ssh_dir, devices_dir, links_dir):
        if not directory.exists():
            _mkdir_recorded(state, directory, 0o700, remove="tree")
    sshd.generate_key(identity_file, f"globaldl-fleet-{plan.prefix}")
    authorized_keys = ssh_dir / "authorized_keys"
    authorized_keys.write_text(Path(f"{identity_file}.pub").read_text())
    authorized_keys.chmod(0o600)
    if sshd.ensure_privilege_separation_dir():
        state.record("directory", path="/run/sshd", remove="sshd_privsep")
    netns_etc = Path("/etc/netns")
    if not netns_etc.exists():
        _mkdir_recorded(state, netns_etc, 0o755, remove="if_empty")
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
    # A bridge takes the lowest MAC of its ports unless given one: pin it, the devices' static
    # neighbour entries point at it.
    address = Path(f"/sys/class/net/{plan.bridge}/address").read_text().strip()
    run(["ip", "link", "set", plan.bridge, "address", address])
    run(["ip", "link", "set", plan.bridge, "up"])

    group_parent = f"{plan.prefix}-fleet"
    for controller in cgroups.fleet_controllers():
        path = cgroups.create_group(controller, group_parent)
        state.record("cgroup", path=str(path))
    emulation_groups = {}
    for controller in cgroups.fleet_controllers():
        path = cgroups.create_group(controller, f"{group_parent}/{cgroups.EMULATION_GROUP}")
        state.record("cgroup", path=str(path))
        emulation_groups[controller] = str(path)
    cgroups.set_cpu_shares(Path(emulation_groups["cpu"]), cgroups.EMULATION_CPU_SHARES)

    def build(link: Any) -> str:
        return create_link(
            link, state, emulate=emulate, work_dir=links_dir, groups=list(emulation_groups.values())
        )

    if plan.congestion_control is not None:
        _allow_congestion_control(state, plan.congestion_control)
    for site in plan.sites:
        log(f"creating site {site.name} ({site.bridge}, wan {site.wan.name})")
        state.sites.append(_create_site(state, plan, site, build))
        state.save()
    for spec in plan.devices:
        log(f"creating {spec.name} ({spec.address}, {spec.profile.name})")
        device = _create_device(
            state, plan, spec, group_parent, devices_dir / spec.name, authorized_keys, build
        )
        state.devices.append(device)
        state.save()
    install_neighbours(state)
    _write_keepalive_config(state, log)
    if state.sites:
        write_site_map(
            state_dir / "sites.yaml",
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
                identity_file,
                device.name,
                host_round_trip_ms(state, device),
            )
            for device in state.devices
        ]
        for wait in waits:
            wait.result()
    for device in state.devices:
        device.status = "up"
    state.phase = "up"
    state.save()


def install_neighbours(state: FleetState, devices: list[DeviceState] | None = None) -> None:
    """Static neighbour (ARP) entries: every device knows the host's and every device's MAC.

    Cellular links carry no ARP, and ARP over a slow link fails: Linux gives up on an address
    after three 1 s retries, long before an NB-IoT reply (~23 s device to device) comes back.
    `devices` limits it to those devices' own tables (a revived device: taking its link down
    flushed them); the host's entries sit on the bridge, which never goes down.
    """
    macs = {device.address: _mac(device.name, DEVICE_INTERFACE) for device in state.devices}
    host_mac = Path(f"/sys/class/net/{state.bridge}/address").read_text().strip()
    for device in devices if devices is not None else state.devices:
        entries = {state.host_address: host_mac, **macs}
        entries.pop(device.address)
        _set_neighbours(device.name, DEVICE_INTERFACE, entries)
    if devices is None:
        _set_neighbours(None, state.bridge, macs)


def _mac(netns: str, interface: str) -> str:
    link = json.loads(run(["ip", "-n", netns, "-j", "link", "show", "dev", interface]).stdout)
    return str(link[0]["address"])


def _set_neighbours(netns: str | None, interface: str, entries: dict[str, str]) -> None:
    batch = "".join(
        f"neigh replace {address} lladdr {mac} dev {interface} nud permanent\n"
        for address, mac in entries.items()
    )
    run(["ip", *(["-n", netns] if netns else []), "-batch", "-"], input_text=batch)


ALLOWED_CONGESTION_CONTROL = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
CONGESTION_CONTROL_SETTING = "net.ipv4.tcp_congestion_control"


def _allow_congestion_control(state: FleetState, name: str) -> None:
    """Let the devices' namespaces take `name` as their TCP congestion control.

    The kernel lets a namespace other than the host's choose only an allowed one. Journaled:
    `fleet down` restores the list.
    """
    allowed = ALLOWED_CONGESTION_CONTROL.read_text().split()
    if name in allowed:
        return
    previous = " ".join(allowed)
    state.record("sysctl", path=str(ALLOWED_CONGESTION_CONTROL), previous=previous)
    ALLOWED_CONGESTION_CONTROL.write_text(" ".join([*allowed, name]) + "\n")


def running_congestion_control(netns: str) -> str:
    """The TCP congestion control new connections in namespace `netns` get."""
    return run(
        ["ip", "netns", "exec", netns, "sysctl", "-n", CONGESTION_CONTROL_SETTING]
    ).stdout.strip()


def _set_congestion_control(netns: str, name: str | None) -> str:
    """Give the namespace's TCP `name` (None: keep the host's default); return what it runs."""
    if name is not None:
        assignment = f"{CONGESTION_CONTROL_SETTING}={name}"
        run(["ip", "netns", "exec", netns, "sysctl", "-q", "-w", assignment])
    running = running_congestion_control(netns)
    if name is not None and running != name:
        raise FleetError(f"{netns} runs TCP congestion control {running!r}, not {name!r}")
    return running


def _create_device(
    state: FleetState,
    plan: FleetPlan,
    spec: DeviceSpec,
    group_parent: str,
    device_dir: Path,
    authorized_keys: Path,
    build_link: Callable[[Any], str],
) -> DeviceState:
    """A device: its namespace, link, address, /etc/hosts, cgroups and running sshd."""
    netns = spec.name
    if Path(f"/run/netns/{netns}").exists():
        raise FleetError(f"network namespace {netns} already exists; choose another --prefix")
    _create_recorded(state, "netns", netns, ["ip", "netns", "add", netns])
    run(["ip", "-n", netns, "link", "set", "lo", "up"])
    congestion_control = _set_congestion_control(netns, plan.congestion_control)
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
    _mkdir_recorded(state, etc_dir, 0o755, remove="tree")
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
        site=spec.site,
        link=link_kind,
        congestion_control=congestion_control,
    )
    start_sshd(Path(state.state_dir), device)
    return device


def _create_site(
    state: FleetState, plan: FleetPlan, site: SiteSpec, build_link: Callable[[Any], str]
) -> SiteState:
    """A site: its LAN bridge and its WAN link to the core."""
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


def start_sshd(state_dir: Path, device: DeviceState) -> None:
    """Start the device's sshd in its namespace and cgroups; record its pid in `device`."""
    device_dir = Path(state_dir) / "devices" / device.name
    device.sshd_pid, device.sshd_start_ticks = sshd.start_sshd(
        device.name,
        device.name,
        device_dir / "sshd_config",
        device_dir / "sshd.log",
        [
            str(group)
            for group in cgroups.groups_to_join(Path(device.cpu_group), Path(device.memory_group))
        ],
    )


def device_authorized_keys(device_dir: Path) -> Path:
    """The device's own authorized_keys file (read by its sshd after the fleet's shared one)."""
    return device_dir / "authorized_keys"


def _journal_if_new(state: FleetState, existing: Path, kind: str, **fields: str) -> None:
    """Journal a resource before creating it: a `fleet up` killed meanwhile orphans nothing.

    A kill between the two (the journal's save takes milliseconds) leaves a record of a
    resource that was never made, which the teardown skips, never one that no record names.
    One whose `existing` path is already there belongs to someone else: it is not journaled
    (so never removed), and its creation fails on it as it would anyway.
    """
    if not existing.exists():
        state.record(kind, **fields)


def _create_recorded(state: FleetState, kind: str, name: str, argv: list[str]) -> None:
    """Journal a namespace or link (`_journal_if_new`), then create it with `argv`."""
    existing = Path("/run/netns" if kind == "netns" else "/sys/class/net") / name
    _journal_if_new(state, existing, kind, name=name)
    run(argv)


def _mkdir_recorded(state: FleetState, path: Path, mode: int, remove: str) -> None:
    """Journal a directory (`_journal_if_new`), then make it."""
    _journal_if_new(state, path, "directory", path=str(path), remove=remove)
    path.mkdir(mode=mode)


def _write_keepalive_config(state: FleetState, log: Log) -> None:
    """Write the keepalives of horovodrun's ssh sessions to the devices (sshd.py), journaled."""
    if not sshd.CLIENT_CONFIG_DIR.is_dir():
        log(
            f"no {sshd.CLIENT_CONFIG_DIR}: ssh keeps no keepalive for the devices, so Horovod "
            "Elastic may wait for good on a device that vanished without closing its session"
        )
        return
    path = sshd.keepalive_config_path(state.prefix)
    state.record("file", path=str(path))
    state.save()
    devices = [(device.address, host_round_trip_ms(state, device)) for device in state.devices]
    write_text_atomically(path, sshd.keepalive_config(state.prefix, devices), mode=0o644)


def host_round_trip_ms(state: FleetState, device: DeviceState) -> float:
    """The device's worst round trip to the host (delays plus jitter), for the login's waits."""
    path = fleet_path(state, device.name, HOST)
    return path.round_trip_ms() + sum(hop.jitter_ms for hop in (*path.forward, *path.backward))

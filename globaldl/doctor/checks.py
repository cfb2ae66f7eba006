"""Turn what the probes found into one verdict per check and per device."""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum

from globaldl import horovod_edits
from globaldl.doctor.remote import DeviceProbe

# A run is not stopped by a slow clock, but metrics and logs from different devices no longer
# line up; half a second is where the dashboards' 5 s scrape interval starts to smear.
CLOCK_SKEW_WARN_SECONDS = 0.5
# Below this much headroom over the need, the kernel may start killing at the first big batch.
MEMORY_HEADROOM = 1.25
REQUIRED_PATCH = horovod_edits.INTERFACE_FIX
# Without them Horovod still trains, but an elastic run waits long for a vanished device (after
# the long join timeout, or ~400 s when the device held rank 0), horovodrun started on the
# device cannot reach peers more than 10 s of round trip away, and allgathers run slow.
LATER_PATCHES = {
    horovod_edits.JOIN_TIMEOUT: "an elastic run notices a vanished device only after the join "
    "timeout",
    horovod_edits.NOTIFY_OUTSIDE_LOCK: "an elastic run stalls ~400 s when rank 0's device vanishes",
    horovod_edits.SSH_CONNECT_TIMEOUT: "horovodrun gives up on hosts over 10 s of round trip "
    "away (NB-IoT)",
    horovod_edits.ALLGATHER_RECEIVE_FIRST: "gathered payloads over the link's burst take up to "
    "1.8x their link time",
}
VERSION_KEYS = ("python", "tensorflow", "horovod", "globaldl")


class Verdict(IntEnum):
    """Worst wins: a device's verdict is its worst check's."""

    OK = 0
    WARN = 1
    FAIL = 2
    SKIPPED = -1


@dataclass(frozen=True)
class Check:
    """One column of the table for one device: a short cell and, if not ok, the why."""

    name: str
    verdict: Verdict
    cell: str
    detail: str = ""


@dataclass
class DeviceReport:
    """Every check of one device."""

    host: str
    checks: list[Check] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        """The worst of the checks (SKIPPED counts as OK: its cause is already a FAIL)."""
        return max((check.verdict for check in self.checks), default=Verdict.OK)


COLUMNS = ("ssh", "versions", "horovod", "hostname", "clock", "ports", "memory", "link")


def evaluate(probes: list[DeviceProbe], memory_need_bytes: int) -> list[DeviceReport]:
    """One report per device, in host-file order."""
    reachable = [probe for probe in probes if probe.ssh_error is None]
    reference = _reference_versions(reachable)
    reports = []
    for probe in probes:
        report = DeviceReport(probe.entry.host)
        if probe.ssh_error is not None:
            report.checks.append(
                Check(
                    "ssh", Verdict.FAIL, "FAIL", f"cannot run the probe over ssh: {probe.ssh_error}"
                )
            )
            report.checks += [Check(name, Verdict.SKIPPED, "-") for name in COLUMNS[1:]]
        else:
            report.checks += [
                Check("ssh", Verdict.OK, "ok"),
                _versions(probe, reference),
                _horovod(probe),
                _hostname(probe),
                _clock(probe),
                _ports(probe),
                _memory(probe, memory_need_bytes),
                _link(probe),
            ]
        reports.append(report)
    return reports


def _reference_versions(probes: list[DeviceProbe]) -> tuple[str | None, ...] | None:
    """The versions most devices run (the ones that differ are the odd ones out)."""
    counts = Counter(tuple(probe.facts.get(key) for key in VERSION_KEYS) for probe in probes)
    return counts.most_common(1)[0][0] if counts else None


def _versions(probe: DeviceProbe, reference: tuple[str | None, ...] | None) -> Check:
    found = tuple(probe.facts.get(key) for key in VERSION_KEYS)
    missing = [key for key, value in zip(VERSION_KEYS, found, strict=True) if value is None]
    cell = f"py {found[0]} tf {found[1] or '-'} hvd {found[2] or '-'}"
    if missing:
        return Check("versions", Verdict.FAIL, cell, f"not installed: {', '.join(missing)}")
    if reference is not None and found != reference:
        differ = [
            f"{key} {mine} (most devices: {theirs})"
            for key, mine, theirs in zip(VERSION_KEYS, found, reference, strict=True)
            if mine != theirs
        ]
        return Check("versions", Verdict.FAIL, cell, "versions differ: " + ", ".join(differ))
    return Check("versions", Verdict.OK, cell)


def _horovod(probe: DeviceProbe) -> Check:
    facts = probe.facts
    if not facts.get("horovod"):
        return Check("horovod", Verdict.SKIPPED, "-")
    if not facts.get("tensorflow_built"):
        return Check(
            "horovod",
            Verdict.FAIL,
            "FAIL",
            "Horovod cannot load its TensorFlow ops: "
            + str(facts.get("horovod_error", "unknown error")),
        )
    if not facts.get("gloo_built"):
        return Check("horovod", Verdict.FAIL, "no gloo", "Horovod was built without Gloo")
    if REQUIRED_PATCH not in facts.get("patches", []):
        return Check(
            "horovod",
            Verdict.FAIL,
            "no fix",
            "Horovod lacks the Gloo interface fix (process sets fall back to the host name); "
            "install the wheel of scripts/build-horovod.sh",
        )
    missing = [name for name in LATER_PATCHES if name not in facts.get("patches", [])]
    if missing:
        return Check(
            "horovod",
            Verdict.WARN,
            "old build",
            "Horovod lacks "
            + "; ".join(f"{name} ({LATER_PATCHES[name]})" for name in missing)
            + "; install the wheel of scripts/build-horovod.sh",
        )
    return Check("horovod", Verdict.OK, "gloo+fix")


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _hostname(probe: DeviceProbe) -> Check:
    name = probe.facts.get("hostname", "?")
    addresses = probe.facts.get("hostname_addresses", [])
    if not addresses:
        return Check(
            "hostname", Verdict.FAIL, "FAIL", f"host name {name} does not resolve on the device"
        )
    first = addresses[0]
    if _is_loopback(first):
        return Check(
            "hostname",
            Verdict.FAIL,
            first,
            f"host name {name} resolves to {first} (loopback): Gloo falls back to the host name "
            "and ranks then connect to themselves; map it to the device's address in /etc/hosts "
            "(deploy/ansible does)",
        )
    if first != probe.entry.host and not _is_address_of(first, probe.entry.host):
        return Check(
            "hostname",
            Verdict.WARN,
            first,
            f"host name {name} resolves to {first}, not to the host file's {probe.entry.host}",
        )
    return Check("hostname", Verdict.OK, first)


def _is_address_of(address: str, host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True  # the host file names hosts; the name resolved to a non-loopback address
    return address == host


def _clock(probe: DeviceProbe) -> Check:
    offset = probe.clock_offset_seconds
    if offset is None:
        return Check("clock", Verdict.SKIPPED, "-")
    cell = f"{offset * 1000:+.0f} ms"
    if abs(offset) > CLOCK_SKEW_WARN_SECONDS:
        return Check(
            "clock",
            Verdict.WARN,
            cell,
            f"clock is {offset:+.2f} s off the controller's: metrics and logs will not line up "
            "(enable NTP: systemd-timesyncd or chrony)",
        )
    return Check("clock", Verdict.OK, cell)


def _ports(probe: DeviceProbe) -> Check:
    problems = []
    for port, state in sorted(probe.facts.get("ports", {}).items()):
        if state != "free":
            problems.append(
                f"metrics port {port} cannot be bound on {probe.entry.host}: {state} (another "
                "process holds it; the worker's exporter would fail to start)"
            )
    for port, state in sorted(probe.metrics_reachable.items()):
        if state != "ok":
            problems.append(f"metrics port {port} not reachable from here: {state}")
    if "peer_port_error" in probe.facts:
        problems.append(f"cannot listen on any port: {probe.facts['peer_port_error']}")
    if problems:
        return Check("ports", Verdict.FAIL, "FAIL", "; ".join(problems))
    detail = ""
    verdict = Verdict.OK
    if probe.node_exporter not in (None, "ok"):
        verdict = Verdict.WARN
        detail = f"node-exporter not reachable: {probe.node_exporter}"
    return Check("ports", verdict, "ok" if verdict is Verdict.OK else "warn", detail)


def _memory(probe: DeviceProbe, need_bytes: int) -> Check:
    available = probe.facts.get("memory_available_bytes")
    if available is None:
        return Check("memory", Verdict.WARN, "?", "could not read the available memory")
    cell = f"{available / 2**20:.0f}/{need_bytes / 2**20:.0f} MB"
    if available < need_bytes:
        return Check(
            "memory",
            Verdict.FAIL,
            cell,
            f"{available / 2**20:.0f} MB available, the run needs about "
            f"{need_bytes / 2**20:.0f} MB",
        )
    if available < need_bytes * MEMORY_HEADROOM:
        return Check(
            "memory", Verdict.WARN, cell, f"less than {MEMORY_HEADROOM:g}x the run's need available"
        )
    return Check("memory", Verdict.OK, cell)


def _link(probe: DeviceProbe) -> Check:
    link = probe.link
    if not link:
        return Check("link", Verdict.SKIPPED, "-")
    if "error" in link:
        return Check(
            "link",
            Verdict.FAIL,
            "FAIL",
            f"cannot reach peer {link.get('peer')} on port {link.get('port')}: {link['error']} "
            "(Gloo connects devices directly on ports the kernel picks; open them, or use the "
            "WireGuard overlay)",
        )
    seconds = link.get("receive_seconds") or 0.0
    mbit_per_second = link.get("received_bytes", 0) * 8 / seconds / 1e6 if seconds > 0 else 0.0
    rtt_ms = link.get("rtt_seconds", 0.0) * 1000
    return Check("link", Verdict.OK, f"{mbit_per_second:.1f} Mbit/s {rtt_ms:.1f} ms")

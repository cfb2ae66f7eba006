"""The doctor's run: probe every device, measure between them, and judge."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from globaldl.doctor.checks import DeviceReport, evaluate
from globaldl.doctor.hostfile import HostEntry, read_hostfile
from globaldl.doctor.remote import (
    FACTS_TIMEOUT_SECONDS,
    DeviceProbe,
    ProbeServers,
    SshOptions,
    clock_offset,
    port_answers,
    run_clients,
)

# The resources experiment measured 662-673 MB peak per device for LeNet and MLPs (TensorFlow
# itself dominates); a model of a few million weights adds tens of MB.
DEFAULT_MEMORY_NEED_MB = 700


@dataclass(frozen=True)
class DoctorRequest:
    """What to check, and how to reach the devices."""

    hostfile: Path
    python: str
    ssh: SshOptions
    metrics_port: int | None = None
    node_exporter_port: int | None = None
    memory_need_mb: int = DEFAULT_MEMORY_NEED_MB
    measure_seconds: float = 1.0
    timeout_seconds: float = FACTS_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        for name in ("metrics_port", "node_exporter_port"):
            port = getattr(self, name)
            if port is not None and not 1 <= port <= 65535:
                raise ValueError(f"{name} {port!r} is not allowed; use a port in 1..65535")
        if self.memory_need_mb < 1:
            raise ValueError(f"memory need {self.memory_need_mb!r} MB is not allowed; use >= 1")
        if self.timeout_seconds <= 0:
            raise ValueError(f"timeout {self.timeout_seconds!r} s is not allowed; use > 0")
        if not 0.1 <= self.measure_seconds <= 60:
            raise ValueError(
                f"measure seconds {self.measure_seconds!r} is not allowed; use 0.1 to 60"
            )


def diagnose(request: DoctorRequest) -> list[DeviceReport]:
    """Probe every device of the host file and judge each (ValueError for a bad host file)."""
    entries = read_hostfile(request.hostfile)
    return evaluate(probe_devices(entries, request), request.memory_need_mb * 2**20)


def probe_devices(entries: list[HostEntry], request: DoctorRequest) -> list[DeviceProbe]:
    """Facts from every device, then clock, ports and the ring links between them."""
    ports = [request.metrics_port] if request.metrics_port is not None else []
    servers = ProbeServers(entries, request.ssh, request.python, ports)
    probes = [DeviceProbe(entry) for entry in entries]
    deadline = servers.started + request.timeout_seconds
    try:
        for probe in probes:
            facts, error = servers.read_facts(probe.entry.host, deadline)
            if facts is None:
                probe.ssh_error = error
            else:
                probe.facts = facts
        live = [probe for probe in probes if probe.ssh_error is None]
        for probe in live:
            _from_controller(probe, request)
        _measure_ring(live, request)
    finally:
        servers.close()
    return probes


def _from_controller(probe: DeviceProbe, request: DoctorRequest) -> None:
    """Clock offset and the ports Prometheus scrapes, seen from the machine running the doctor."""
    host, peer_port = probe.entry.host, probe.facts.get("peer_port")
    if peer_port is not None:
        try:
            probe.clock_offset_seconds = clock_offset(host, peer_port)
        except (OSError, ValueError):
            probe.clock_offset_seconds = None
    for port, state in probe.facts.get("ports", {}).items():
        if state == "free":  # held by the probe now: reachable means the exporter will be
            probe.metrics_reachable[int(port)] = port_answers(host, int(port))
    if request.node_exporter_port is not None:
        probe.node_exporter = port_answers(host, request.node_exporter_port)


def _measure_ring(live: list[DeviceProbe], request: DoctorRequest) -> None:
    """Every device to its successor in host-file order: the ring allreduce's links."""
    if len(live) < 2:
        return
    pairs = []
    for index, probe in enumerate(live):
        peer = live[(index + 1) % len(live)]
        if "peer_port" in peer.facts:
            pairs.append((probe.entry, peer.entry, int(peer.facts["peer_port"])))
    results = run_clients(pairs, request.ssh, request.python, request.measure_seconds)
    for probe in live:
        if probe.entry.host in results:
            probe.link = results[probe.entry.host]

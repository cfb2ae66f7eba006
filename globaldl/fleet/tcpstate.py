"""What TCP does on the fleet's links while a run goes: each connection's state, sampled.

`ss -tin` inside every device's namespace, every few milliseconds for a while: the congestion
control, its window, BBR's bandwidth estimate, the pacing rate, bytes sent, time since the last
send. It answers what the simulator's TCP model assumes: does a connection restart its window
after the pauses between collectives, and at what rate does a message leave?

Run as `python -m globaldl.fleet.tcpstate SECONDS INTERVAL_MS` inside a namespace (it prints a
JSON line per sample); `sample_fleet` drives one per device from the host.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Any

from globaldl.fleet.state import FleetState
from globaldl.fleet.system import in_netns

SSH_PORT = 22
# The kernel's initial window (RFC 6928): a window this small after a pause is a restart.
INITIAL_WINDOW_SEGMENTS = 10
MIN_INTERVAL_MS = 5.0
MAX_SECONDS = 3600.0
# Sends further apart than this belong to two flights (a message's packets leave every few ms
# even at the slowest pacing measured; collectives' hops are a round trip or more apart).
FLIGHT_PAUSE_SECONDS = 0.1
# A connection that sent less than this in the window carried only coordination words.
DEFAULT_MIN_BYTES = 64 * 1024

_ADDRESSES = re.compile(r"^\S+\s+\S+\s+(\S+):(\d+)\s+(\S+):(\d+)")
_FIELD = re.compile(r"\b([a-z_]+):([0-9.]+)")
_RATE = re.compile(r"\b(pacing_rate|delivery_rate|send) ([0-9.]+)([KMG]?)bps")
_BBR_BW = re.compile(r"bbr:\(bw:([0-9.]+)([KMG]?)bps")
_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9}


@dataclass(frozen=True)
class Connection:
    """One established connection as `ss -tin` shows it at one moment."""

    local: str
    local_port: int
    peer: str
    peer_port: int
    congestion_control: str
    cwnd: int
    rtt_ms: float
    rto_ms: float
    bytes_sent: int
    last_send_ms: float | None  # None: sent within the last millisecond (ss leaves it out)
    pacing_bits_per_second: float | None
    delivery_bits_per_second: float | None
    bbr_bandwidth_bits_per_second: float | None
    app_limited: bool


def parse_ss(text: str) -> list[Connection]:
    """The connections in `ss -tin` output: an address line, then its detail line."""
    connections, address = [], None
    for line in text.splitlines():
        if match := _ADDRESSES.match(line):
            address = match
            continue
        if address is None or "cwnd:" not in line:
            continue
        fields = {name: float(value) for name, value in _FIELD.findall(line)}
        rates = {name: float(value) * _SCALE[unit] for name, value, unit in _RATE.findall(line)}
        bbr = _BBR_BW.search(line)
        local, local_port, peer, peer_port = address.groups()
        local, peer = _plain_address(local), _plain_address(peer)
        connections.append(
            Connection(
                local=local,
                local_port=int(local_port),
                peer=peer,
                peer_port=int(peer_port),
                congestion_control=line.split()[0],
                cwnd=int(fields["cwnd"]),
                rtt_ms=fields.get("rtt", 0.0),
                rto_ms=fields.get("rto", 0.0),
                bytes_sent=int(fields.get("bytes_sent", 0)),
                last_send_ms=fields.get("lastsnd"),
                pacing_bits_per_second=rates.get("pacing_rate"),
                delivery_bits_per_second=rates.get("delivery_rate"),
                bbr_bandwidth_bits_per_second=(
                    float(bbr.group(1)) * _SCALE[bbr.group(2)] if bbr else None
                ),
                app_limited="app_limited" in line,
            )
        )
        address = None
    return connections


def _plain_address(address: str) -> str:
    """`10.77.0.2` for `10.77.0.2`, `[::ffff:10.77.0.2]` (an IPv6 socket's IPv4 peer)."""
    address = address.strip("[]")
    return address.removeprefix("::ffff:")


def check_sampling(seconds: float, interval_ms: float) -> None:
    """Reject a sampling window or interval the sampler cannot keep."""
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must be in (0, {MAX_SECONDS:g}], got {seconds!r}")
    if not interval_ms >= MIN_INTERVAL_MS:
        raise ValueError(
            f"interval_ms must be >= {MIN_INTERVAL_MS:g} (each sample runs ss), got {interval_ms!r}"
        )


def sample_here(seconds: float, interval_ms: float, emit: Callable[[dict[str, Any]], None]) -> int:
    """Sample this namespace's established connections for `seconds`; returns the count."""
    check_sampling(seconds, interval_ms)
    end, count = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        started = time.monotonic()
        output = subprocess.run(
            ["ss", "-tin", "state", "established"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
        emit({"time": time.time(), "connections": [asdict(c) for c in parse_ss(output)]})
        count += 1
        time.sleep(max(0.0, interval_ms / 1000 - (time.monotonic() - started)))
    return count


@dataclass(frozen=True)
class Sample:
    """One device's connections at one moment."""

    device: str
    time: float
    connections: tuple[Connection, ...]


# One connection at one moment: (time, its state).
_Point = tuple[float, Connection]


def sample_fleet(state: FleetState, seconds: float, interval_ms: float) -> list[Sample]:
    """Sample every live device's connections at once, each in its own namespace."""
    check_sampling(seconds, interval_ms)
    devices = [device.name for device in state.devices if device.status == "up"]
    if not devices:
        raise ValueError("the fleet has no live devices to sample")
    python = [sys.executable, "-m", "globaldl.fleet.tcpstate", f"{seconds:g}", f"{interval_ms:g}"]
    samples: list[Sample] = []
    # Each sampler writes to a file of its own: read one pipe at a time and the others' fill up
    # and stop their samplers within a second.
    with tempfile.TemporaryDirectory(prefix="globaldl-tcp-") as folder:
        outputs = {name: Path(folder) / f"{name}.jsonl" for name in devices}
        processes = {}
        try:
            for name in devices:
                with outputs[name].open("w") as handle:
                    processes[name] = subprocess.Popen(
                        in_netns(name, python), stdout=handle, stderr=subprocess.PIPE, text=True
                    )
            for name, process in processes.items():
                _, errors = process.communicate(timeout=seconds + 60)
                if process.returncode != 0:
                    raise RuntimeError(f"sampling {name} failed: {errors.strip() or 'no message'}")
        finally:
            for process in processes.values():
                if process.poll() is None:
                    process.kill()
                    process.communicate()
        for name in devices:
            for line in outputs[name].read_text().splitlines():
                record = json.loads(line)
                connections = tuple(Connection(**item) for item in record["connections"])
                samples.append(Sample(name, float(record["time"]), connections))
    return samples


def summarize(
    samples: Iterable[Sample],
    device_addresses: dict[str, str],
    min_bytes: int = DEFAULT_MIN_BYTES,
) -> list[dict[str, Any]]:
    """Per connection between two devices that sent at least `min_bytes` in the window.

    A flight is a run of samples in which bytes left, no two sends further apart than
    `FLIGHT_PAUSE_SECONDS`; its rate is its bytes over the time from the sample before its
    first send to its last (accurate to a sampling interval at each end). Bytes count when TCP
    hands them to the interface's queue, so a flow that keeps a shaped link's queue full can
    send faster than the link within a flight (it pauses while the queue drains). The pacing
    rate and BBR's estimate are taken in the samples in which bytes left.
    """
    if not min_bytes >= 0:
        raise ValueError(f"min_bytes must be >= 0, got {min_bytes!r}")
    names = {address: name for name, address in device_addresses.items()}
    series: dict[tuple[str, str, int, int], list[_Point]] = {}
    for sample in samples:
        for connection in sample.connections:
            if SSH_PORT in (connection.local_port, connection.peer_port):
                continue
            if connection.peer not in names:
                continue
            key = (sample.device, connection.peer, connection.local_port, connection.peer_port)
            series.setdefault(key, []).append((sample.time, connection))
    rows = []
    for (device, peer, _, _), points in sorted(series.items()):
        points.sort(key=lambda point: point[0])
        sent = points[-1][1].bytes_sent - points[0][1].bytes_sent
        if len(points) < 2 or sent < min_bytes:
            continue
        sends = _sends(points)
        flights = _flights(sends)
        flight_bytes = sum(bytes_sent for bytes_sent, _ in flights)
        flight_seconds = sum(seconds for _, seconds in flights)
        connections = [connection for _, connection in points]
        sending = [new for _, (_, new) in sends]
        windows = [connection.cwnd for connection in connections]
        bbr = [c.bbr_bandwidth_bits_per_second for c in sending]
        pacing = [c.pacing_bits_per_second for c in sending]
        idle = [c.last_send_ms for c in connections if c.last_send_ms is not None]
        rows.append(
            {
                "device": device,
                "peer": names[peer],
                "congestion_control": connections[-1].congestion_control,
                "samples": len(points),
                "seconds": points[-1][0] - points[0][0],
                "bytes_sent": sent,
                "flights": len(flights),
                "flight_mbit_per_second": flight_bytes * 8 / flight_seconds / 1e6
                if flight_seconds
                else None,
                "cwnd_min": min(windows),
                "cwnd_median": median(windows),
                "cwnd_max": max(windows),
                "samples_at_initial_window_or_below": sum(
                    window <= INITIAL_WINDOW_SEGMENTS for window in windows
                ),
                "bbr_bandwidth_mbit_sending": _median_mbit(bbr),
                "pacing_mbit_sending": _median_mbit(pacing),
                "rtt_ms_median": median(c.rtt_ms for c in connections),
                "rto_ms_median": median(c.rto_ms for c in connections),
                "longest_pause_ms": max(idle, default=None),
            }
        )
    return rows


def _sends(points: Sequence[_Point]) -> list[tuple[_Point, _Point]]:
    """The pairs of consecutive samples between which the connection sent bytes."""
    return [
        (before, after)
        for before, after in zip(points[:-1], points[1:], strict=True)
        if after[1].bytes_sent > before[1].bytes_sent
    ]


def _flights(sends: Sequence[tuple[_Point, _Point]]) -> list[tuple[int, float]]:
    """(bytes, seconds) of each flight in a connection's sends (see `summarize`)."""
    flights: list[tuple[int, float]] = []
    begun = last = None
    flight_bytes = 0
    for (before, old), (after, new) in sends:
        if last is not None and after - last > FLIGHT_PAUSE_SECONDS:
            flights.append((flight_bytes, last - begun))
            begun, flight_bytes = None, 0
        if begun is None:
            begun = before
        flight_bytes += new.bytes_sent - old.bytes_sent
        last = after
    if last is not None:
        flights.append((flight_bytes, last - begun))
    return flights


def _median_mbit(values: Sequence[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return median(known) / 1e6 if known else None


def main(argv: list[str] | None = None) -> None:
    """Sample this namespace: one JSON line per sample on stdout."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: python -m globaldl.fleet.tcpstate SECONDS INTERVAL_MS")
    sample_here(
        float(args[0]), float(args[1]), lambda record: print(json.dumps(record), flush=True)
    )


if __name__ == "__main__":
    main()

"""Measure round-trip time and loss on a fleet path: numbered UDP probes and their echoes.

Run as `python -m globaldl.fleet.probe echo|send ...` inside an endpoint's namespace (or in the
host's, for the core); `measure_round_trip` drives both ends from the host. The echo side
counts which probes arrived (forward loss); the sender counts which echoes came back (the
return loss is what was echoed but never seen again) and times each round trip.
"""

from __future__ import annotations

import argparse
import json
import math
import selectors
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from globaldl.fleet.paths import PROBE_FRAME_BYTES, PROBE_PAYLOAD_BYTES, FleetPath
from globaldl.fleet.system import in_netns

# Probes are spaced at least this far apart, and beyond twice the path's jitter: a FIFO link
# holds a probe behind a slower predecessor, which would skew the delays it measures.
MIN_INTERVAL_MS = 20.0
# At least this many frame times per interval, so the probes never queue behind each other.
INTERVAL_FRAMES = 4
DEFAULT_PROBE_SECONDS = 60.0
DEFAULT_MAX_PROBES = 200
MIN_PROBES = 20
_HEADER = struct.Struct("!Id")  # sequence number, send time (monotonic seconds)


@dataclass(frozen=True)
class RoundTripMeasurement:
    """Round trips and loss measured on a path, next to what its profiles promise."""

    source: str
    target: str
    probes_sent: int
    probes_arrived: int
    echoes_received: int
    interval_ms: float
    round_trip_ms_median: float | None
    round_trip_ms_mean: float | None
    round_trip_ms_min: float | None
    round_trip_ms_max: float | None
    expected_round_trip_ms: float
    forward_loss_fraction: float
    return_loss_fraction: float | None
    expected_forward_loss_fraction: float
    expected_return_loss_fraction: float

    @property
    def round_trip_relative_error(self) -> float | None:
        """(median - expected) / expected; None when nothing came back or under 1 ms is expected.

        Below a millisecond the round trip is the machine's own forwarding, not a profile's.
        """
        if self.round_trip_ms_median is None or self.expected_round_trip_ms < 1:
            return None
        return self.round_trip_ms_median / self.expected_round_trip_ms - 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, derived error included."""
        return {**asdict(self), "round_trip_relative_error": self.round_trip_relative_error}


def probe_plan(path: FleetPath, probes: int | None, interval_ms: float | None) -> tuple[int, float]:
    """(probes, interval ms): spaced so probes never wait for each other, ~1 minute by default."""
    if interval_ms is None:
        frame_ms = max(hop.serialisation_ms(PROBE_FRAME_BYTES) for hop in path.forward)
        interval_ms = max(MIN_INTERVAL_MS, 2 * path.max_jitter_ms + 1, INTERVAL_FRAMES * frame_ms)
    if not interval_ms > 0:
        raise ValueError(f"probe interval must be > 0 ms, got {interval_ms!r}")
    if probes is None:
        by_time = int(DEFAULT_PROBE_SECONDS * 1000 / interval_ms)
        probes = max(MIN_PROBES, min(DEFAULT_MAX_PROBES, by_time))
    if probes < 1:
        raise ValueError(f"probes must be at least 1, got {probes}")
    return probes, interval_ms


def measure_round_trip(
    path: FleetPath,
    *,
    source_netns: str | None,
    target_netns: str | None,
    port: int,
    probes: int | None = None,
    interval_ms: float | None = None,
) -> RoundTripMeasurement:
    """Send numbered probes along `path` and time their echoes; bounded in time.

    The sender waits for late echoes up to 3x the expected round trip plus 2 s after its last
    probe; anything later counts as lost.
    """
    count, interval = probe_plan(path, probes, interval_ms)
    expected_ms = path.round_trip_ms()
    linger_seconds = 3 * expected_ms / 1000 + 2
    python = [sys.executable, "-m", "globaldl.fleet.probe"]
    echo = subprocess.Popen(
        in_netns(target_netns, [*python, "echo", path.target_address, str(port)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert echo.stdout is not None
        if echo.stdout.readline().strip() != "ready":
            raise RuntimeError(f"probe echo at {path.target} did not start: {_stderr(echo)}")
        send_argv = [*python, "send", path.target_address, str(port), str(count)]
        send_argv += [f"{interval:g}", f"{linger_seconds:g}"]
        sent = subprocess.run(
            in_netns(source_netns, send_argv),
            capture_output=True,
            text=True,
            timeout=count * interval / 1000 + linger_seconds + 30,
            check=False,
        )
        if sent.returncode != 0:
            raise RuntimeError(f"probe sender at {path.source} failed: {sent.stderr.strip()}")
        echo.send_signal(signal.SIGTERM)
        echoed, _ = echo.communicate(timeout=30)
    finally:
        if echo.poll() is None:
            echo.kill()
            echo.communicate()
    sender = json.loads(sent.stdout)
    arrived = json.loads(echoed)["arrived"]
    round_trips = list(sender["round_trips_ms"].values())
    return RoundTripMeasurement(
        source=path.source,
        target=path.target,
        probes_sent=count,
        probes_arrived=arrived,
        echoes_received=len(round_trips),
        interval_ms=interval,
        round_trip_ms_median=statistics.median(round_trips) if round_trips else None,
        round_trip_ms_mean=statistics.fmean(round_trips) if round_trips else None,
        round_trip_ms_min=min(round_trips, default=None),
        round_trip_ms_max=max(round_trips, default=None),
        expected_round_trip_ms=expected_ms,
        forward_loss_fraction=1 - arrived / count,
        return_loss_fraction=1 - len(round_trips) / arrived if arrived else None,
        expected_forward_loss_fraction=path.loss_fraction(forward=True),
        expected_return_loss_fraction=path.loss_fraction(forward=False),
    )


def _stderr(process: subprocess.Popen[str]) -> str:
    process.kill()
    _, errors = process.communicate()
    return errors.strip()


def _echo(address: str, port: int) -> dict[str, int]:
    """Echo every datagram back until SIGTERM; report how many distinct probes arrived."""
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    arrived: set[int] = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind((address, port))
        server.settimeout(0.1)
        print("ready", flush=True)
        while not stopping:
            try:
                data, sender = server.recvfrom(2048)
            except (TimeoutError, InterruptedError):
                continue
            if len(data) >= _HEADER.size:
                arrived.add(_HEADER.unpack_from(data)[0])
                server.sendto(data, sender)
    return {"arrived": len(arrived)}


def _send(
    address: str, port: int, count: int, interval_ms: float, linger_seconds: float
) -> dict[str, Any]:
    """Send `count` probes every `interval_ms`; time every echo until `linger_seconds` after."""
    padding = b"\0" * (PROBE_PAYLOAD_BYTES - _HEADER.size)
    round_trips: dict[int, float] = {}
    selector = selectors.DefaultSelector()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.connect((address, port))
        client.setblocking(False)
        selector.register(client, selectors.EVENT_READ)
        start = time.monotonic()
        next_index = 0
        deadline = math.inf
        while True:
            now = time.monotonic()
            if next_index < count and now >= start + next_index * interval_ms / 1000:
                client.send(_HEADER.pack(next_index, now) + padding)
                next_index += 1
                if next_index == count:
                    deadline = now + linger_seconds
                continue
            if now >= deadline or len(round_trips) == count:
                break
            wake = deadline if next_index == count else start + next_index * interval_ms / 1000
            for _ in selector.select(timeout=max(0.0, min(wake - now, 0.5))):
                while True:
                    try:
                        data = client.recv(2048)
                    except (BlockingIOError, ConnectionRefusedError):
                        break
                    sequence, sent_at = _HEADER.unpack_from(data)
                    round_trips.setdefault(sequence, (time.monotonic() - sent_at) * 1000)
    return {"sent": count, "round_trips_ms": round_trips}


def main(argv: list[str] | None = None) -> None:
    """Entry point of one end of the probe."""
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    echo = commands.add_parser("echo")
    echo.add_argument("address")
    echo.add_argument("port", type=int)
    send = commands.add_parser("send")
    send.add_argument("address")
    send.add_argument("port", type=int)
    send.add_argument("count", type=int)
    send.add_argument("interval_ms", type=float)
    send.add_argument("linger_seconds", type=float)
    args = parser.parse_args(argv)
    if args.command == "echo":
        result: dict[str, Any] = _echo(args.address, args.port)
    else:
        result = _send(args.address, args.port, args.count, args.interval_ms, args.linger_seconds)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

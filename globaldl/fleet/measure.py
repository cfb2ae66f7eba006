"""Measure a shaped link: a bounded bulk TCP transfer between two devices of the fleet.

Run as `python -m globaldl.fleet.measure receive|send ...` inside a device's namespace
(`ip netns exec DEVICE ...`, or the host's for the core); `measure_throughput` drives both ends
from the host.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from globaldl.fleet.system import in_netns

CHUNK_BYTES = 64 * 1024
# tbf's bucket lets a short burst through at line rate and TCP needs a few round trips to fill
# the queue; the rate is taken over the transfer after this warm-up.
WARMUP_SECONDS = 0.5
SAMPLE_SECONDS = 0.05
# With 1500-byte MTU and TCP timestamps, 1448 payload bytes travel in a 1514-byte frame.
TCP_PAYLOAD_PER_FRAME = 1448 / 1514


@dataclass(frozen=True)
class ThroughputMeasurement:
    """A bulk transfer from one device to another, and the rate its shaped path allows."""

    sender: str
    receiver: str
    payload_bytes: int
    seconds: float
    payload_bits_per_second: float
    shaped_bits_per_second: float

    @property
    def frame_bits_per_second(self) -> float:
        """The measured rate in Ethernet frame bits (what tbf counts)."""
        return self.payload_bits_per_second / TCP_PAYLOAD_PER_FRAME

    @property
    def relative_error(self) -> float:
        """(measured frame rate - shaped rate) / shaped rate."""
        return self.frame_bits_per_second / self.shaped_bits_per_second - 1

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form, derived rates included."""
        return {
            **asdict(self),
            "frame_bits_per_second": self.frame_bits_per_second,
            "relative_error": self.relative_error,
        }


def _receive(address: str, port: int, timeout_seconds: float) -> dict[str, object]:
    with socket.create_server((address, port)) as server:
        server.settimeout(timeout_seconds)
        print("ready", flush=True)
        connection, _ = server.accept()
        with connection:
            connection.settimeout(timeout_seconds)
            samples: list[tuple[float, int]] = []
            received = 0
            next_sample = 0.0
            while True:
                data = connection.recv(CHUNK_BYTES)
                now = time.monotonic()
                if not data:
                    break
                received += len(data)
                if now >= next_sample:
                    samples.append((now, received))
                    next_sample = now + SAMPLE_SECONDS
            samples.append((now, received))
    return {"bytes": received, "samples": samples}


def _send(address: str, port: int, seconds: float, max_bytes: int) -> dict[str, object]:
    payload = b"\0" * CHUNK_BYTES
    sent = 0
    with socket.create_connection((address, port), timeout=10) as connection:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and sent < max_bytes:
            connection.sendall(payload)
            sent += len(payload)
    return {"bytes": sent}


def rate_after_warmup(
    samples: list[tuple[float, int]], warmup_seconds: float = WARMUP_SECONDS
) -> tuple[float, int, float]:
    """(payload bit/s, bytes, seconds) of the transfer after `warmup_seconds`.

    The rate is the least-squares slope of received bytes over time, so one late wake-up of
    the receiver on a busy machine moves it far less than a first-to-last difference would.
    """
    start_time = samples[0][0] + warmup_seconds
    after = [sample for sample in samples if sample[0] >= start_time]
    if len(after) < 3:
        raise RuntimeError(
            f"transfer too short to measure: {len(samples)} samples, warm-up {warmup_seconds} s"
        )
    times = [time_ for time_, _ in after]
    counts = [count for _, count in after]
    mean_time = sum(times) / len(times)
    mean_count = sum(counts) / len(counts)
    covariance = sum((t - mean_time) * (c - mean_count) for t, c in zip(times, counts, strict=True))
    variance = sum((t - mean_time) ** 2 for t in times)
    return covariance / variance * 8, counts[-1] - counts[0], times[-1] - times[0]


def measure_throughput(
    sender: str,
    receiver: str,
    receiver_address: str,
    shaped_bits_per_second: float,
    seconds: float = 4.0,
    port: int = 5201,
    *,
    sender_netns: str | None,
    receiver_netns: str | None,
) -> ThroughputMeasurement:
    """Send bulk data from `sender` to `receiver` for `seconds`; measure the rate.

    Each end runs in its network namespace (None: the host's own). Bounded in time and bytes:
    the sender stops after `seconds` or 2x the bytes the shaped rate allows in that time,
    whichever is first; every wait has a timeout.
    """
    python = [sys.executable, "-m", "globaldl.fleet.measure"]
    timeout_seconds = seconds + 20
    receive = subprocess.Popen(
        in_netns(
            receiver_netns, [*python, "receive", receiver_address, str(port), str(timeout_seconds)]
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert receive.stdout is not None
        if receive.stdout.readline().strip() != "ready":
            raise RuntimeError(
                f"receiver in {receiver} did not start: "
                f"{receive.stderr.read() if receive.stderr else ''}"
            )
        max_bytes = int(2 * shaped_bits_per_second / 8 * seconds) + CHUNK_BYTES
        send = subprocess.run(
            in_netns(
                sender_netns,
                [*python, "send", receiver_address, str(port), str(seconds), str(max_bytes)],
            ),
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            check=False,
        )
        if send.returncode != 0:
            raise RuntimeError(f"sender in {sender} failed: {send.stderr.strip()}")
        output, errors = receive.communicate(timeout=timeout_seconds)
        if receive.returncode != 0:
            raise RuntimeError(f"receiver in {receiver} failed: {errors.strip()}")
    finally:
        if receive.poll() is None:
            receive.kill()
            receive.communicate()
    result = json.loads(output)
    rate, measured_bytes, measured_seconds = rate_after_warmup(
        [tuple(s) for s in result["samples"]]
    )
    return ThroughputMeasurement(
        sender, receiver, measured_bytes, measured_seconds, rate, shaped_bits_per_second
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point of one end of the transfer."""
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    receive = commands.add_parser("receive")
    receive.add_argument("address")
    receive.add_argument("port", type=int)
    receive.add_argument("timeout_seconds", type=float)
    send = commands.add_parser("send")
    send.add_argument("address")
    send.add_argument("port", type=int)
    send.add_argument("seconds", type=float)
    send.add_argument("max_bytes", type=int)
    args = parser.parse_args(argv)
    if args.command == "receive":
        print(json.dumps(_receive(args.address, args.port, args.timeout_seconds)), flush=True)
    else:
        print(json.dumps(_send(args.address, args.port, args.seconds, args.max_bytes)), flush=True)


if __name__ == "__main__":
    main()

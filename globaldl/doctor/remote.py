"""Run the probe on every device over ssh, as horovodrun reaches them, and gather what it says."""

from __future__ import annotations

import base64
import json
import selectors
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globaldl.doctor.hostfile import HostEntry

PROBE_SOURCE = (Path(__file__).with_name("probe.py")).read_text()
# TensorFlow and Horovod load in the facts step: seconds on a Pi, a minute on a busy one.
FACTS_TIMEOUT_SECONDS = 180.0


@dataclass(frozen=True)
class SshOptions:
    """How to log in: horovodrun's own options (`--ssh-port`, `--ssh-identity-file`)."""

    port: int | None = None
    identity_file: Path | None = None
    user: str | None = None
    connect_timeout_seconds: int = 5

    def argv(self, host: str, command: list[str]) -> list[str]:
        """`ssh ... HOST COMMAND` in batch mode (a password prompt would hang the doctor)."""
        argv = [
            "ssh",
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={self.connect_timeout_seconds}",
            "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR",
        ]  # fmt: skip
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.identity_file is not None:
            argv += ["-i", str(self.identity_file)]
        return [*argv, f"{self.user}@{host}" if self.user else host, *command]


def probe_command(python: str, *args: str) -> list[str]:
    """The remote command: `PYTHON -c LOADER B64 ARGS`; base64 survives the remote shell."""
    encoded = base64.b64encode(PROBE_SOURCE.encode()).decode()
    # Run as a module named `probe` (not `__main__`, so its own entry point stays quiet).
    loader = (
        "import base64,sys;g={'__name__':'probe'};"
        "exec(compile(base64.b64decode(sys.argv[1]),'probe','exec'),g);g['main'](sys.argv[2:])"
    )
    return [python, "-c", f'"{loader}"', encoded, *args]


@dataclass
class DeviceProbe:
    """What the doctor learned about one device."""

    entry: HostEntry
    ssh_error: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    clock_offset_seconds: float | None = None
    metrics_reachable: dict[int, str] = field(default_factory=dict)
    node_exporter: str | None = None
    link: dict[str, Any] = field(default_factory=dict)


class ProbeServers:
    """One `probe serve` per device, alive while the doctor measures between devices."""

    def __init__(self, entries: list[HostEntry], ssh: SshOptions, python: str, ports: list[int]):
        self.processes: dict[str, subprocess.Popen[str]] = {}
        self.started = time.monotonic()
        for entry in entries:
            device_ports = [port + local for port in ports for local in range(entry.slots)]
            self.processes[entry.host] = subprocess.Popen(
                ssh.argv(
                    entry.host,
                    probe_command(python, "serve", entry.host, ",".join(map(str, device_ports))),
                ),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

    def read_facts(self, host: str, deadline: float) -> tuple[dict[str, Any] | None, str]:
        """The device's facts line by `deadline` (monotonic), or None and why not."""
        process = self.processes[host]
        assert process.stdout is not None
        timeout_seconds = deadline - self.started
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if selector.select(timeout=0.5):
                    line = process.stdout.readline()
                    if line:
                        try:
                            return json.loads(line), ""
                        except json.JSONDecodeError:
                            continue
                    break
                if process.poll() is not None:
                    break
        if process.poll() is None:
            return None, f"no answer within {timeout_seconds:g} s"
        assert process.stderr is not None
        error = process.stderr.read().strip().splitlines()
        return None, (error[-1] if error else f"ssh exited {process.returncode}")

    def close(self) -> None:
        """Close every server's stdin (it exits), then make sure."""
        for process in self.processes.values():
            try:
                if process.stdin is not None:
                    process.stdin.close()
            except OSError:
                pass
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def clock_offset(host: str, port: int, timeout_seconds: float = 5.0) -> float:
    """Device clock minus ours, from one time request halfway through its round trip."""
    with socket.create_connection((host, port), timeout=timeout_seconds) as connection:
        sent = time.time()
        connection.sendall(b"time\n")
        answer = connection.recv(64)
        received = time.time()
    return float(answer.decode()) - (sent + received) / 2


def port_answers(host: str, port: int, timeout_seconds: float = 3.0) -> str:
    """`ok`, or why a TCP connection from here to HOST:PORT failed."""
    try:
        with socket.create_connection((host, port), timeout=timeout_seconds):
            return "ok"
    except TimeoutError:
        return "no answer (filtered?)"
    except OSError as error:
        return error.strerror or str(error)


def run_clients(
    pairs: list[tuple[HostEntry, HostEntry, int]], ssh: SshOptions, python: str, seconds: float
) -> dict[str, dict[str, Any]]:
    """Each (device, peer, peer port): the device measures its link to the peer, all at once.

    All at once is how a ring allreduce loads the links: every device sends to its successor.
    """
    processes = {
        device.host: subprocess.Popen(
            ssh.argv(
                device.host, probe_command(python, "client", peer.host, str(port), str(seconds))
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for device, peer, port in pairs
    }
    results: dict[str, dict[str, Any]] = {}
    for host, process in processes.items():
        try:
            stdout, stderr = process.communicate(timeout=60 + seconds * 10)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        try:
            results[host] = json.loads(stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            results[host] = {"error": (stderr.strip().splitlines() or ["no output"])[-1]}
    return results

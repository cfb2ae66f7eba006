"""Helpers for the monitoring tests: free ports, HTTP scrapes, bounded waits, synthetic workers."""

from __future__ import annotations

import contextlib
import importlib.util
import random
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
SYNTHETIC_WORKER = Path(__file__).with_name("synthetic_worker.py")
T = TypeVar("T")


def horovod_launch() -> ModuleType:
    """tests/integration/horovod_launch.py, the tests' one horovodrun launcher.

    Loaded by path: pytest puts tests/integration on sys.path only when it collects tests
    there, and this suite must also run alone.
    """
    path = REPO / "tests" / "integration" / "horovod_launch.py"
    spec = importlib.util.spec_from_file_location("horovod_launch", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (outgoing connections' source ports)."""
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def _free_ports(count: int) -> int:
    """A base port P with P .. P+count-1 free on loopback, all below the ephemeral range.

    A port probed with bind(0) comes from the ephemeral range, where any outgoing connection
    (Gloo's rendezvous, a scrape, Prometheus itself) may take it as its source port before the
    worker binds it: CI once lost a run to that. Below the range only a listener can hold it.
    """
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(max(1024, low - 12000), low - count)
        with contextlib.ExitStack() as stack:
            try:
                for offset in range(count):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", base + offset))
            except OSError:
                continue
            return base
    raise AssertionError(f"no {count} adjacent free ports below the ephemeral range from {low}")


def free_port() -> int:
    """A loopback port that was free a moment ago, outside the ephemeral range."""
    return _free_ports(1)


def free_port_pair() -> int:
    """A base port P with P and P+1 free on loopback (ranks 0 and 1 serve there)."""
    return _free_ports(2)


def scrape(
    url: str, *, context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None
) -> str:
    """GET a metrics endpoint and return its text (raises urllib's HTTPError on 4xx/5xx)."""
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return response.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(sample name, labels): value} of a Prometheus text exposition."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def wait_for(condition: Callable[[], T | None], timeout_seconds: float, what: str) -> T:
    """Poll `condition` every 0.25 s until it returns something truthy; fail after the timeout."""
    deadline = time.monotonic() + timeout_seconds
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = condition()
            if result:
                return result
        except Exception as error:  # noqa: BLE001 (report the last one if we time out)
            last_error = error
        time.sleep(0.25)
    raise AssertionError(
        f"timed out after {timeout_seconds} s waiting for {what}; last error: {last_error}"
    )


def start_synthetic_worker(
    *,
    port: int,
    rank: int,
    device: str,
    run: str,
    dominant_phase: str,
    duration_seconds: float = 150.0,
) -> subprocess.Popen[bytes]:
    """Start tests/monitoring/synthetic_worker.py (a stand-in for the trainer) in a subprocess."""
    return subprocess.Popen(
        [
            sys.executable,
            str(SYNTHETIC_WORKER),
            "--port",
            str(port),
            "--rank",
            str(rank),
            "--device",
            device,
            "--run",
            run,
            "--dominant-phase",
            dominant_phase,
            "--duration-seconds",
            str(duration_seconds),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Terminate a process we started, kill it if it lingers, and reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

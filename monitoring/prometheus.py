"""Start, stop and inspect the local Prometheus that scrapes the workers (`globaldl monitor`)."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from globaldl.files import write_text_atomically
from globaldl.monitoring.promql import PrometheusApi

DEFAULT_PORT = 19090
"""Loopback port of `globaldl monitor up` (away from 9090, which a system Prometheus may hold)."""
DEFAULT_STATE_DIR = Path("runs/prometheus")
"""Config, pid file, log, TSDB and discovery targets of `globaldl monitor up` (relative to cwd)."""
DEFAULT_SCRAPE_INTERVAL_SECONDS = 5.0
READY_TIMEOUT_SECONDS = 30.0
"""How long `up` waits for /-/ready before it stops the server and reports its log."""
STOP_TIMEOUT_SECONDS = 15.0
"""How long `down` waits after SIGTERM (Prometheus flushes its head block) before SIGKILL."""
SCRAPE_JOB = "globaldl"

CONFIG_DIR = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
"""deploy/prometheus/ of this checkout: prometheus.yml, rules/ and tests/."""


@dataclass(frozen=True)
class PrometheusStatus:
    """What `globaldl monitor status` reports about the Prometheus of one state dir."""

    state_dir: Path
    pid: int | None
    url: str | None
    ready: bool

    @property
    def running(self) -> bool:
        """True when the pid file names a live Prometheus of this state dir."""
        return self.pid is not None


def targets_dir(state_dir: Path) -> Path:
    """Where the launcher writes file-SD targets for the Prometheus of `state_dir`."""
    return Path(state_dir) / "targets" / SCRAPE_JOB


def _duration(seconds: float) -> str:
    """A Prometheus duration for `seconds`, e.g. 5s or 500ms."""
    milliseconds = round(seconds * 1000)
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"


def _check_interval(scrape_interval_seconds: float) -> None:
    if not 0.1 <= scrape_interval_seconds <= 300:
        raise ValueError(
            f"scrape interval {scrape_interval_seconds!r} s is not allowed; use 0.1 to 300 seconds"
        )


def render_config(
    state_dir: Path,
    *,
    scrape_interval_seconds: float = DEFAULT_SCRAPE_INTERVAL_SECONDS,
    config_dir: Path = CONFIG_DIR,
) -> Path:
    """Write STATE_DIR/prometheus.yml from deploy/prometheus/prometheus.yml; return its path.

    The copy scrapes and evaluates rules every `scrape_interval_seconds`, reads the rules of
    `config_dir` by absolute path, discovers targets in targets_dir(state_dir), and keeps only
    the globaldl job (no node-exporter runs beside a local Prometheus).
    """
    _check_interval(scrape_interval_seconds)
    config = yaml.safe_load((Path(config_dir) / "prometheus.yml").read_text())
    interval = _duration(scrape_interval_seconds)
    config["global"]["scrape_interval"] = interval
    config["global"]["evaluation_interval"] = interval
    config["global"]["scrape_timeout"] = _duration(min(scrape_interval_seconds, 4.0))
    config["rule_files"] = [
        str(Path(config_dir).resolve() / pattern) for pattern in config["rule_files"]
    ]
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == SCRAPE_JOB]
    if len(jobs) != 1:
        raise ValueError(
            f"{config_dir}/prometheus.yml must have exactly one job named {SCRAPE_JOB!r}"
        )
    discovery = targets_dir(state_dir).resolve()
    discovery.mkdir(parents=True, exist_ok=True)
    jobs[0]["file_sd_configs"] = [
        {"files": [str(discovery / "*.json")], "refresh_interval": interval}
    ]
    config["scrape_configs"] = jobs
    path = Path(state_dir) / "prometheus.yml"
    header = (
        "# Rendered by `globaldl monitor up` from deploy/prometheus/prometheus.yml; do not edit.\n"
    )
    write_text_atomically(path, header + yaml.safe_dump(config, sort_keys=False))
    return path


def _pid_file(state_dir: Path) -> Path:
    return Path(state_dir) / "prometheus.pid"


def _log_file(state_dir: Path) -> Path:
    return Path(state_dir) / "prometheus.log"


def _alive(pid: int) -> bool:
    """True if `pid` runs (a zombie child of this process is reaped and counts as gone)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: its parent reaps it
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _our_prometheus(state_dir: Path) -> tuple[int, str] | None:
    """(pid, url) of the live Prometheus recorded in the pid file, or None.

    The command line must name this state dir's TSDB, so a pid reused by another process
    is never taken for ours.
    """
    try:
        pid = int(_pid_file(state_dir).read_text().strip())
    except (OSError, ValueError):
        return None
    command = _command_line(pid)
    data_flag = f"--storage.tsdb.path={(Path(state_dir) / 'data').resolve()}"
    if not _alive(pid) or data_flag not in command:
        return None
    listen = next(
        arg.split("=", 1)[1] for arg in command if arg.startswith("--web.listen-address=")
    )
    return pid, f"http://{listen}"


def _ready(url: str, timeout_seconds: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=timeout_seconds) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def prometheus_status(state_dir: Path = DEFAULT_STATE_DIR) -> PrometheusStatus:
    """Whether the Prometheus of `state_dir` runs, where, and whether it is ready."""
    found = _our_prometheus(state_dir)
    if found is None:
        return PrometheusStatus(Path(state_dir), None, None, False)
    pid, url = found
    return PrometheusStatus(Path(state_dir), pid, url, _ready(url))


def _log_tail(state_dir: Path, lines: int = 15) -> str:
    try:
        return "\n".join(_log_file(state_dir).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As Prometheus does: connections in TIME_WAIT from a previous server do not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise OSError(
                    errno.EADDRINUSE,
                    f"port {port} on 127.0.0.1 is already in use; choose another with --port",
                ) from error
            raise


def start_prometheus(
    state_dir: Path = DEFAULT_STATE_DIR,
    *,
    port: int = DEFAULT_PORT,
    scrape_interval_seconds: float = DEFAULT_SCRAPE_INTERVAL_SECONDS,
    ready_timeout_seconds: float = READY_TIMEOUT_SECONDS,
    retention: str = "15d",
    config_dir: Path = CONFIG_DIR,
) -> PrometheusStatus:
    """Start Prometheus on 127.0.0.1:PORT for `state_dir` and wait until it is ready.

    Idempotent: if this state dir's Prometheus already runs, return its status unchanged.
    Raises FileNotFoundError without a prometheus binary, OSError if the port is taken, and
    RuntimeError (with the end of its log) if it exits or is not ready in time; then nothing
    is left running.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"Prometheus port {port!r} is out of range; expected 1-65535")
    current = prometheus_status(state_dir)
    if current.running:
        return current
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError(
            "prometheus is not on PATH; scripts/setup.sh installs it (Debian package prometheus)"
        )
    _check_port_free(port)
    state_dir = Path(state_dir).resolve()
    data_dir = state_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    config = render_config(
        state_dir, scrape_interval_seconds=scrape_interval_seconds, config_dir=config_dir
    )
    command = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={data_dir}",
        f"--storage.tsdb.retention.time={retention}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
    ]
    with open(_log_file(state_dir), "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=state_dir,
            start_new_session=True,
        )
    write_text_atomically(_pid_file(state_dir), f"{process.pid}\n")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            _pid_file(state_dir).unlink(missing_ok=True)
            raise RuntimeError(
                f"Prometheus exited with code {process.returncode} before it was ready; "
                f"end of {_log_file(state_dir)}:\n{_log_tail(state_dir)}"
            )
        if _ready(url, timeout_seconds=1.0):
            return PrometheusStatus(state_dir, process.pid, url, True)
        time.sleep(0.2)
    _terminate(process.pid, STOP_TIMEOUT_SECONDS)
    _pid_file(state_dir).unlink(missing_ok=True)
    raise RuntimeError(
        f"Prometheus was not ready at {url} within {ready_timeout_seconds} s and was stopped; "
        f"end of {_log_file(state_dir)}:\n{_log_tail(state_dir)}"
    )


def _terminate(pid: int, timeout_seconds: float) -> None:
    """SIGTERM, wait up to `timeout_seconds`, then SIGKILL and wait a little more."""
    for sig, wait_seconds in ((signal.SIGTERM, timeout_seconds), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.1)


def stop_prometheus(
    state_dir: Path = DEFAULT_STATE_DIR, *, timeout_seconds: float = STOP_TIMEOUT_SECONDS
) -> bool:
    """Stop the Prometheus of `state_dir`; True if one was running. Safe to call twice."""
    found = _our_prometheus(state_dir)
    if found is not None:
        _terminate(found[0], timeout_seconds)
    _pid_file(state_dir).unlink(missing_ok=True)
    return found is not None


def scrape_targets_summary(url: str) -> dict[str, int]:
    """Counts of active scrape targets by health, e.g. {"up": 2, "down": 0, "unknown": 0}."""
    counts = {"up": 0, "down": 0, "unknown": 0}
    for target in PrometheusApi(url, timeout_seconds=5.0).targets():
        health = str(target.get("health", "unknown"))
        counts[health] = counts.get(health, 0) + 1
    return counts

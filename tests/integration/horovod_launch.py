"""Launch real `horovodrun` runs of `globaldl train` from tests, with bounded waits."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
LAUNCH_TIMEOUT_SECONDS = 600


def horovod_train(
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    ranks: int = 2,
    timeout_seconds: float = LAUNCH_TIMEOUT_SECONDS,
    hosts: str | None = None,
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """Run `horovodrun -np RANKS globaldl train ARGS --summary ...`; return the summary.

    ``hosts`` is horovodrun's -H (default: all ranks on localhost); `localhost:2,127.0.0.1:2`
    gives two host names on this machine, which Horovod starts without ssh.
    """
    tmp_path.mkdir(parents=True, exist_ok=True)
    summary_path = tmp_path / "summary.json"
    command = [
        str(BIN / "horovodrun"),
        "-np",
        str(ranks),
        "-H",
        hosts or f"localhost:{ranks}",
        "--gloo",
        str(BIN / "globaldl"),
        "train",
        *args,
        "--summary",
        str(summary_path),
    ]
    completed = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout_seconds, check=False
    )
    if completed.returncode != 0:
        raise AssertionError(
            f"horovodrun exited {completed.returncode}\nstdout:\n{completed.stdout[-4000:]}"
            f"\nstderr:\n{completed.stderr[-4000:]}"
        )
    return json.loads(summary_path.read_text()), completed


def horovod_python(
    script: Path,
    args: list[str],
    env: dict[str, str],
    *,
    ranks: int,
    hosts: str,
    timeout_seconds: float = LAUNCH_TIMEOUT_SECONDS,
) -> subprocess.CompletedProcess[str]:
    """Run `horovodrun -np RANKS -H HOSTS python SCRIPT ARGS` (a probe script); never raises."""
    return subprocess.run(
        [str(BIN / "horovodrun"), "-np", str(ranks), "-H", hosts, "--gloo"]
        + [str(BIN / "python"), str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_seconds,
        check=False,
    )


class ElasticLaunch:
    """A running `horovodrun` elastic job whose host-discovery script reads a file we control.

    Workers run locally under two host names, `localhost` and `127.0.0.1`: Horovod treats them
    as different hosts (a failing worker blacklists only its own host) but starts both
    without ssh. Output (stdout and stderr merged) is collected line by line as it arrives.
    """

    def __init__(
        self,
        tmp_path: Path,
        args: list[str],
        env: dict[str, str],
        hosts: list[str],
        *,
        np: int,
        min_np: int,
        max_np: int,
        elastic_timeout_seconds: int = 30,
    ) -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.summary_path = tmp_path / "summary.json"
        self.hosts_path = tmp_path / "hosts.txt"
        self.set_hosts(hosts)
        discover = tmp_path / "discover-hosts.sh"
        discover.write_text(f"#!/bin/sh\ncat {self.hosts_path}\n")
        discover.chmod(0o755)
        command = [
            str(BIN / "horovodrun"),
            "-np",
            str(np),
            "--min-np",
            str(min_np),
            "--max-np",
            str(max_np),
            "--host-discovery-script",
            str(discover),
            "--elastic-timeout",
            str(elastic_timeout_seconds),
            "--network-interface",
            "lo",
            str(BIN / "globaldl"),
            "train",
            "--elastic",
            *args,
            "--summary",
            str(self.summary_path),
        ]
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def set_hosts(self, hosts: list[str]) -> None:
        """What the discovery script prints from now on (written atomically)."""
        partial = self.hosts_path.with_suffix(".tmp")
        partial.write_text("".join(f"{host}\n" for host in hosts))
        partial.replace(self.hosts_path)

    def wait_for_line(self, pattern: str, timeout_seconds: float) -> str:
        """Block until an output line matches `pattern` (a regex); fail after the timeout."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_seconds
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if regex.search(line):
                        return line
                seen = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.process.poll() is not None and seen == len(self.lines):
                    self.kill()
                    raise AssertionError(
                        f"no output line matched {pattern!r} within {timeout_seconds} s\n"
                        + "".join(self.lines[-60:])
                    )
                self._changed.wait(min(remaining, 1.0))

    def finish(self, timeout_seconds: float = LAUNCH_TIMEOUT_SECONDS) -> int:
        """Wait for horovodrun to exit (killing it after the timeout); return its exit code."""
        try:
            code = self.process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"horovodrun still running after {timeout_seconds} s\n" + self.output[-6000:]
            ) from None
        self._reader.join(timeout=10)
        return code

    def summary(self) -> dict[str, Any]:
        """The run summary of a run that exited 0."""
        code = self.finish()
        if code != 0:
            raise AssertionError(f"horovodrun exited {code}\n{self.output[-6000:]}")
        return json.loads(self.summary_path.read_text())

    @property
    def output(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def kill_worker_on(self, host: str) -> int:
        """SIGKILL the training process Horovod started for `host` (a device dying); its pid."""
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                environ = (proc / "environ").read_bytes().split(b"\0")
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            is_worker = (
                any(part.endswith(b"python") or part.endswith(b"python3") for part in cmdline[:1])
                and b"train" in cmdline
            )
            if is_worker and f"HOROVOD_HOSTNAME={host}".encode() in environ:
                os.kill(int(proc.name), signal.SIGKILL)
                return int(proc.name)
        raise AssertionError(f"no globaldl worker of host {host} is running\n{self.output[-3000:]}")

    def kill(self) -> None:
        """Stop horovodrun; asked politely first, it stops its workers too."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)

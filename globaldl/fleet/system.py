"""Run the system tools the fleet is built with (ip, tc, ssh-keygen), with bounded waits."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

# The fleet writes its files with the one atomic writer; its old name here stays importable.
from globaldl.files import write_text_atomically as write_atomically  # noqa: F401

DEFAULT_TIMEOUT_SECONDS = 30.0


class CommandError(RuntimeError):
    """A system command failed; carries the command line, exit code and stderr."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(
            f"`{' '.join(self.argv)}` failed (exit {returncode}): {self.stderr or 'no message'}"
        )


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command without a shell; raise CommandError if it fails and `check` is set.

    `input_text` goes to its stdin (otherwise it gets none).
    """
    try:
        completed = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            check=False,
            **({"input": input_text} if input_text is not None else {"stdin": subprocess.DEVNULL}),
        )
    except subprocess.TimeoutExpired:
        raise CommandError(argv, -1, f"timed out after {timeout_seconds:g} s") from None
    if check and completed.returncode != 0:
        raise CommandError(argv, completed.returncode, completed.stderr)
    return completed


def in_netns(netns: str | None, argv: list[str]) -> list[str]:
    """`argv` run inside network namespace `netns` (`ip netns exec`), or as is for the host's."""
    return ["ip", "netns", "exec", netns, *argv] if netns else list(argv)


def machine_cores() -> int:
    """CPU cores this process may run on (the machine's share, not the physical count)."""
    return len(os.sched_getaffinity(0))


def machine_memory_bytes() -> int:
    """Physical memory of the machine, from /proc/meminfo."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("MemTotal missing from /proc/meminfo")


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (tells a pid apart from a reused one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces; fields after it start behind the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def is_same_process(pid: int, start_ticks: int) -> bool:
    """True if `pid` is still the process that started at `start_ticks` (and is not a zombie)."""
    if process_start_ticks(pid) != start_ticks:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _alive(pid: int) -> bool:
    ticks = process_start_ticks(pid)
    return ticks is not None and is_same_process(pid, ticks)


def kill_processes(pids: Iterable[int], grace_seconds: float = 2.0) -> list[int]:
    """SIGTERM, then SIGKILL what is left after `grace_seconds`; return pids that survived both."""
    targets = sorted(set(pids) - {os.getpid()})
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(_alive(pid) for pid in targets):
        time.sleep(0.05)
    survivors = [pid for pid in targets if _alive(pid)]
    for pid in survivors:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_alive(pid) for pid in survivors):
        time.sleep(0.05)
    return [pid for pid in survivors if _alive(pid)]


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass

"""Delay, jitter and loss in user space with Debian's vde2: switches joined by wirefilters.

This kernel has no netem. A link that needs delay, jitter or loss is instead a chain of vde2
processes between two tap interfaces:

    tap (inner end) - vde_switch - wirefilter [- vde_switch - wirefilter] - vde_switch - tap (outer)

Each vde_switch is a 2- or 3-port hub whose control socket is a file, so it is reachable from
any network namespace; the inner tap is created in the host namespace and then moved into the
device's namespace. wirefilter delays, jitters and drops frames per direction: LR is inner ->
outer (the uplink), RL outer -> inner (the downlink). The rate is still shaped by tc tbf on the
taps (globaldl/fleet/shaping.py).

wirefilter keeps frames in order with ONE queue for both directions: a frame is never released
before any frame queued earlier, whichever way it goes. When both directions queue with the
same constant delay that changes nothing; with jitter, or with different delays per direction,
a fast direction would wait behind the slow one. Such links get two wirefilters in a row, each
queueing one direction only (frames of the other direction pass straight through, unqueued).

Every process runs in the fleet's `emulation` cgroup (never a device's), so its CPU is counted
apart from the devices' quotas (globaldl/fleet/cgroups.py).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from globaldl.fleet.cgroups import join_groups
from globaldl.fleet.shaping import LinkDirection
from globaldl.fleet.system import process_start_ticks

VDE_SWITCH = "vde_switch"
WIREFILTER = "wirefilter"
TUN_DEVICE = Path("/dev/net/tun")
START_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class WireSegment:
    """One wirefilter: what it does to frames going up (LR) and down (RL)."""

    up: LinkDirection
    down: LinkDirection

    def wirefilter_options(self) -> list[str]:
        """The `-d`/`-l` options of wirefilter; a direction with nothing to do gets none."""
        options: list[str] = []
        for side, direction in (("LR", self.up), ("RL", self.down)):
            if direction.delay_ms > 0 or direction.jitter_ms > 0:
                jitter = f"+{direction.jitter_ms:g}U" if direction.jitter_ms > 0 else ""
                options += ["-d", f"{side}{direction.delay_ms:g}{jitter}"]
            if direction.loss_percent > 0:
                options += ["-l", f"{side}{direction.loss_percent:g}"]
        return options


@dataclass(frozen=True)
class VdeProcess:
    """A started vde2 daemon: its role in the link, pid and start time (to tell pid reuse)."""

    role: str
    pid: int
    start_ticks: int


def _queues(direction: LinkDirection) -> bool:
    # wirefilter queues a frame only when it has a delay to serve (loss is decided up front).
    return direction.delay_ms > 0 or direction.jitter_ms > 0


def wire_segments(up: LinkDirection, down: LinkDirection) -> list[WireSegment]:
    """The wirefilters a link needs: one, or one per direction when their queues would interact.

    >>> same = LinkDirection(5000, delay_ms=50)
    >>> len(wire_segments(same, LinkDirection(20000, delay_ms=50)))
    1
    >>> len(wire_segments(same, LinkDirection(20000, delay_ms=20)))
    2
    """
    shares_queue_safely = not (_queues(up) and _queues(down)) or (
        up.delay_ms == down.delay_ms and up.jitter_ms == 0 and down.jitter_ms == 0
    )
    if shares_queue_safely:
        return [WireSegment(up, down)]
    passthrough_up = LinkDirection(up.rate_kbit_per_second)
    passthrough_down = LinkDirection(down.rate_kbit_per_second)
    return [WireSegment(up, passthrough_down), WireSegment(passthrough_up, down)]


def availability() -> tuple[bool, str]:
    """Whether this machine can emulate delay (vde2 installed, TUN/TAP usable), and why not."""
    missing = [tool for tool in (VDE_SWITCH, WIREFILTER) if shutil.which(tool) is None]
    if missing:
        return False, (
            f"{' and '.join(missing)} not found (Debian package vde2; scripts/setup.sh installs it)"
        )
    if not TUN_DEVICE.exists():
        return False, f"{TUN_DEVICE} is missing (TUN/TAP is needed for the links' tap interfaces)"
    return True, "vde2 wirefilter"


def start_switch(
    socket_dir: Path, pid_file: Path, groups: list[str], tap: str | None = None
) -> VdeProcess:
    """Start a vde_switch hub (with `tap` attached, created by the switch) as a daemon."""
    argv = [VDE_SWITCH, "--hub", "--sock", str(socket_dir), "--daemon", "--pidfile", str(pid_file)]
    if tap is not None:
        argv += ["--tap", tap]
    process = _start_daemon(argv, pid_file, groups, role=f"switch {socket_dir.name}")
    _wait_for(lambda: (socket_dir / "ctl").exists(), f"{VDE_SWITCH} socket {socket_dir}/ctl")
    if tap is not None:
        _wait_for(lambda: Path(f"/sys/class/net/{tap}").exists(), f"tap interface {tap}")
    return process


def start_wirefilter(
    segment: WireSegment, left: Path, right: Path, pid_file: Path, groups: list[str]
) -> VdeProcess:
    """Start a wirefilter between two switches (left = inner side) as a daemon."""
    argv = [
        WIREFILTER,
        "-v",
        f"{left}:{right}",
        *segment.wirefilter_options(),
        "--daemon",
        "--pidfile",
        str(pid_file),
    ]
    return _start_daemon(argv, pid_file, groups, role=f"wirefilter {pid_file.stem}")


def _start_daemon(argv: list[str], pid_file: Path, groups: list[str], role: str) -> VdeProcess:
    """Run a self-daemonising vde2 tool inside `groups`; return the daemon once its pid is known.

    The launching process joins the cgroups before exec, so the daemon it forks is born there.
    """
    pid_file.unlink(missing_ok=True)
    completed = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_SECONDS,
        check=False,
        preexec_fn=lambda: join_groups(groups),  # noqa: PLW1509 (no threads run in the CLI)
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(argv)}` failed (exit {completed.returncode}): "
            f"{completed.stderr.strip() or 'no message'}"
        )
    _wait_for(lambda: bool(_read_pid(pid_file)), f"pid file {pid_file} of {role}")
    pid = _read_pid(pid_file)
    ticks = process_start_ticks(pid)
    if ticks is None:
        raise RuntimeError(f"{role} (pid {pid}) exited right after starting: `{' '.join(argv)}`")
    return VdeProcess(role, pid, ticks)


def _read_pid(pid_file: Path) -> int:
    try:
        text = pid_file.read_text().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text.isdigit() else 0


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not appear within {START_TIMEOUT_SECONDS:g} s")
        time.sleep(0.01)

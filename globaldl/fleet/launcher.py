"""Run training (or any Horovod program) across the live devices with horovodrun over ssh."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from globaldl.files import write_json_atomically, write_text_atomically
from globaldl.fleet.accounting import ByteAccounting
from globaldl.fleet.fleet import DEVICE_INTERFACE, Fleet
from globaldl.fleet.readings import (
    WorkerOutput,
    account_fleet_run,
    device_counters,
    relay_output,
)
from globaldl.fleet.request import BIN, ProgramRequest, TrainRequest
from globaldl.fleet.sshd import SSH_PORT
from globaldl.fleet.state import DeviceState, FleetState

DEFAULT_START_TIMEOUT_SECONDS = 60
# How long `fleet run` waits for each device's sshd to answer before it refuses to launch.
REACH_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class FleetRunResult:
    """What one `fleet run` did: the command, its exit code, and the byte accounting if any."""

    argv: list[str]
    returncode: int
    hosts: list[str]
    run_id: str
    seconds: float
    counters_before: dict[str, dict[str, int]]
    counters_after: dict[str, dict[str, int]]
    summary_path: Path | None
    accounting: ByteAccounting | None
    accounting_path: Path | None
    targets_path: Path | None
    worker_output: WorkerOutput = field(default_factory=WorkerOutput)


@dataclass(frozen=True)
class ElasticOptions:
    """How a Horovod Elastic run on the fleet may shrink and grow, and how long it waits.

    `elastic_timeout_seconds` bounds every wait for enough devices (Horovod's default, 600 s,
    looks like a hang); `cooldown_seconds` is how long a failed device stays blacklisted
    before a revived device may rejoin (Horovod's default is never).
    """

    min_np: int
    max_np: int
    elastic_timeout_seconds: int = 60
    cooldown_seconds: tuple[int, int] = (5, 10)

    def __post_init__(self) -> None:
        if not 1 <= self.min_np <= self.max_np:
            raise ValueError(
                f"elastic run needs 1 <= min_np <= max_np, got min_np {self.min_np} and "
                f"max_np {self.max_np}"
            )
        if self.elastic_timeout_seconds < 1:
            raise ValueError(f"elastic timeout must be >= 1 s, got {self.elastic_timeout_seconds}")
        low, high = self.cooldown_seconds
        if not 0 < low <= high:
            raise ValueError(f"blacklist cooldown must be 0 < min <= max s, got {low}..{high}")


def discovery_script(state_dir: Path) -> Path:
    """Write the fleet's Horovod Elastic host-discovery script (live devices, ADDR:1 each)."""
    path = Path(state_dir) / "discover-hosts.sh"
    write_text_atomically(
        path,
        "#!/bin/sh\n"
        "# Live devices of this fleet, one ADDR:1 line each (Horovod Elastic host discovery).\n"
        f"exec {sys.executable} -m globaldl.cli.fleet hosts --state-dir {Path(state_dir)}\n",
    )
    path.chmod(0o755)
    return path


def horovodrun_argv(
    devices: list[DeviceState],
    identity_file: Path,
    worker_argv: list[str],
    *,
    horovodrun: Path = BIN / "horovodrun",
    start_timeout_seconds: int = DEFAULT_START_TIMEOUT_SECONDS,
    network_interface: str | None = None,
    elastic: ElasticOptions | None = None,
    discovery: Path | None = None,
) -> list[str]:
    """`horovodrun -np N -H a:1,b:1 --gloo --ssh-identity-file KEY WORKER...`: a rank per device.

    With `elastic`, the host list comes from the `discovery` script instead, and the run may
    shrink to `min_np` devices and grow to `max_np`.
    """
    if not devices:
        raise ValueError(
            "no live devices to run on; check `globaldl fleet status` or `fleet revive`"
        )
    argv = [str(horovodrun), "-np", str(len(devices))]
    if elastic is None:
        argv += ["-H", ",".join(f"{d.address}:1" for d in devices)]
    else:
        if discovery is None:
            raise ValueError("an elastic run needs a host-discovery script")
        low, high = elastic.cooldown_seconds
        argv += [
            "--min-np", str(elastic.min_np), "--max-np", str(elastic.max_np),
            "--host-discovery-script", str(discovery),
            "--elastic-timeout", str(elastic.elastic_timeout_seconds),
            "--blacklist-cooldown-range", str(low), str(high),
        ]  # fmt: skip
    argv += [
        "--gloo",
        "--ssh-identity-file",
        str(identity_file),
        "--start-timeout",
        str(start_timeout_seconds),
        # Horovod caches its ssh check for an hour: a device revived since would be trusted
        # unchecked, and each run would open one ssh session or two depending on the cache.
        "--disable-cache",
    ]
    if network_interface:
        argv += ["--network-interface", network_interface]
    return argv + worker_argv


def horovod_network_interface(requested: str | None = None) -> str:
    """The interface horovodrun is told to use: `requested`, or the devices' own (eth0).

    Left to probe by itself, horovodrun has every device check the next one's interfaces in a
    ring; a single device checks itself, so its loopback passes as routed and Horovod picks
    `lo` or `eth0` in set order, which changes from process to process. With `lo` the worker
    looks for the rendezvous server at 127.0.0.1 inside its own namespace and gives up with
    "HTTP GET request failed too many times". Named explicitly, the workers use their eth0 and
    horovodrun serves the rendezvous on this host's interface of that name, which the devices
    reach through their default route over the bridge.
    """
    import psutil

    interface = requested or DEVICE_INTERFACE
    addresses = psutil.net_if_addrs().get(interface, [])
    if not any(address.family == socket.AF_INET for address in addresses):
        raise ValueError(
            f"this host has no IPv4 address on {interface!r}, where horovodrun would serve the "
            "rendezvous (it uses the host's interface of the name the workers use); interfaces "
            f"with one: {', '.join(sorted(_ipv4_interfaces())) or 'none'}"
        )
    return interface


def _ipv4_interfaces() -> list[str]:
    import psutil

    return [
        name
        for name, addresses in psutil.net_if_addrs().items()
        if any(address.family == socket.AF_INET for address in addresses)
    ]


class UnreachableDeviceError(ConnectionError):
    """A live device's sshd did not answer within the bounded wait."""


def check_reachable(
    devices: list[DeviceState], timeout_seconds: float = REACH_TIMEOUT_SECONDS
) -> None:
    """Open a TCP connection to every device's sshd, waiting at most `timeout_seconds` each.

    horovodrun's own ssh check tries every device five times, each for its connect timeout
    (GLOBALDL_SSH_CONNECT_TIMEOUT_SECONDS, which `fleet run` sets from the link): minutes on
    slow links for a device whose link is down; this fails first, naming the device and what to
    do. Raises UnreachableDeviceError.
    """
    for device in devices:
        try:
            with socket.create_connection((device.address, SSH_PORT), timeout=timeout_seconds):
                pass
        except OSError as error:
            reason = "no answer" if isinstance(error, TimeoutError) else str(error)
            raise UnreachableDeviceError(
                f"device {device.name} ({device.address}) is unreachable: {reason} from its "
                f"sshd within {timeout_seconds:.3g} s; check its link (`globaldl fleet status`), "
                "take it out with `globaldl fleet kill` or bring it back with `fleet revive`"
            ) from None


def run_on_fleet(
    fleet: Fleet,
    request: TrainRequest | ProgramRequest,
    *,
    targets_dir: Path | None = None,
    timeout_seconds: float = 3600,
    start_timeout_seconds: int = DEFAULT_START_TIMEOUT_SECONDS,
    network_interface: str | None = None,
    env: dict[str, str] | None = None,
    elastic: ElasticOptions | None = None,
    reach_timeout_seconds: float = REACH_TIMEOUT_SECONDS,
) -> FleetRunResult:
    """Launch the request on every live device, then compare interface counters with the summary.

    Registers one Prometheus file-SD target per device (its address : the request's metrics
    port) while the run lasts, when `targets_dir` is given and the request has a port.
    """
    run_id, summary_path, metrics_port = request.run_id, request.summary_path, request.metrics_port
    state = fleet.require_state()
    devices = fleet.live_devices()
    check_reachable(devices, reach_timeout_seconds)
    argv = horovodrun_argv(
        devices,
        Path(state.identity_file),
        request.argv(),
        start_timeout_seconds=start_timeout_seconds,
        network_interface=horovod_network_interface(network_interface),
        elastic=elastic,
        discovery=discovery_script(fleet.state_dir) if elastic is not None else None,
    )
    targets_path = None
    if targets_dir is not None and metrics_port is not None:
        from globaldl.monitoring.discovery import write_targets

        targets_path = write_targets(
            targets_dir,
            run_id=run_id,
            hosts=[(d.address, 1) for d in devices],
            base_port=metrics_port,
        )
    counters_before = {d.name: device_counters(d.name) for d in devices}
    started_wall = time.time()
    started = time.monotonic()
    output = WorkerOutput()
    try:
        returncode = _run_bounded(argv, timeout_seconds, env, output)
    finally:
        seconds = time.monotonic() - started
        if targets_path is not None:
            from globaldl.monitoring.discovery import remove_targets

            remove_targets(targets_dir, run_id)  # type: ignore[arg-type]
        # Workers orphaned by a failed or timed-out launch would hold the device (and its port).
        fleet.kill_workers()
    counters_after = {d.name: device_counters(d.name) for d in devices}
    accounting = accounting_path = None
    # A summary left by an earlier run must not be accounted against this run's counters.
    if (
        summary_path is not None
        and summary_path.exists()
        and summary_path.stat().st_mtime >= started_wall
    ):
        accounting = account_fleet_run(
            counters_before,
            counters_after,
            summary_path,
            seconds,
            output=output,
            env=env,
            started_unix_seconds=started_wall,
            cpu_cores_per_device=devices[0].cpu_cores if devices else None,
            round_trip_seconds=_worst_round_trip_seconds(state, devices),
        )
        accounting_path = summary_path.with_name(f"{summary_path.stem}.fleet-bytes.json")
        write_json_atomically(accounting_path, accounting.to_dict())
    return FleetRunResult(
        argv=argv,
        returncode=returncode,
        hosts=[f"{d.address}:1" for d in devices],
        run_id=run_id,
        seconds=seconds,
        counters_before=counters_before,
        counters_after=counters_after,
        summary_path=summary_path,
        accounting=accounting,
        accounting_path=accounting_path,
        targets_path=targets_path,
        worker_output=output,
    )


def _worst_round_trip_seconds(state: FleetState, devices: list[DeviceState]) -> float:
    """The devices' worst round trip to each other: it bounds Horovod's coordination cycles."""
    # Imported here: horovod_link imports this module.
    from globaldl.fleet.horovod_link import link_budget

    if not devices:
        return 0.0
    return link_budget(state, [device.name for device in devices]).worst_round_trip_ms / 1000


def _run_bounded(
    argv: list[str],
    timeout_seconds: float,
    env: dict[str, str] | None,
    output: WorkerOutput | None = None,
) -> int:
    """Run horovodrun in its own process group; on timeout or Ctrl-C stop the whole group.

    Its stdout and stderr pass through unchanged; with `output`, each rank's lines are counted.
    """
    process = subprocess.Popen(
        argv,
        env=env if env is not None else os.environ.copy(),
        start_new_session=True,
        stdout=subprocess.PIPE if output is not None else None,
        stderr=subprocess.PIPE if output is not None else None,
    )
    relays = []
    if output is not None:
        assert process.stdout is not None and process.stderr is not None
        for source, sink in ((process.stdout, sys.stdout), (process.stderr, sys.stderr)):
            relay = threading.Thread(target=relay_output, args=(source, sink, output), daemon=True)
            relay.start()
            relays.append(relay)
    try:
        return process.wait(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        _stop_group(process)
        raise TimeoutError(
            f"horovodrun did not finish within {timeout_seconds:g} s; stopped it"
        ) from None
    except BaseException:
        _stop_group(process)
        raise
    finally:
        for relay in relays:
            relay.join(timeout=10)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    for signum, wait_seconds in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_seconds)
            return
        except subprocess.TimeoutExpired:
            continue

"""`globaldl fleet`: an emulated IoT fleet on this machine (namespaces, shaped links, sshd)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from globaldl.cli.errors import user_errors
from globaldl.fleet import launcher
from globaldl.fleet.fleet import Fleet
from globaldl.fleet.measure import measure_throughput
from globaldl.fleet.plan import DEFAULT_MEMORY_MB, DEFAULT_PREFIX, DEFAULT_SUBNET, plan_fleet
from globaldl.fleet.profiles import DEFAULT_PROFILES_PATH, device_profiles, load_profiles
from globaldl.fleet.request import ProgramRequest, TrainRequest, new_run_id
from globaldl.fleet.state import DEFAULT_STATE_DIR

app = typer.Typer(
    help="Emulate a fleet of IoT devices on this machine and train across it with horovodrun.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

StateDir = Annotated[
    Path,
    typer.Option(
        envvar="GLOBALDL_FLEET_STATE_DIR",
        help="Where the fleet's state file, keys and sshd configs live.",
    ),
]


def _echo_err(message: str) -> None:
    typer.echo(message, err=True)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@app.command()
def up(
    devices: Annotated[
        int | None, typer.Option("--devices", "-n", help="Number of devices (with --profile).")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Link profile of every device: a name from the profiles file, 'custom' (with "
            "--up-mbit/--down-mbit) or custom:UP:DOWN."
        ),
    ] = None,
    mix: Annotated[
        str | None, typer.Option(help="Mixed fleet, e.g. lte:2,slow-4g:2 (PROFILE:COUNT,...).")
    ] = None,
    up_mbit: Annotated[
        float | None, typer.Option(help="Uplink of --profile custom, Mbit/s.")
    ] = None,
    down_mbit: Annotated[
        float | None, typer.Option(help="Downlink of --profile custom, Mbit/s.")
    ] = None,
    cpu: Annotated[
        float | None, typer.Option(help="CPU cores per device [default: machine cores / devices].")
    ] = None,
    cpu_each: Annotated[
        str | None,
        typer.Option(
            help="CPU cores of each device, comma-separated (e.g. 0.8,0.8,0.2,0.2: two fast, "
            "two slow devices); instead of --cpu."
        ),
    ] = None,
    memory: Annotated[
        int | None,
        typer.Option(
            help=f"Memory limit per device, MB [default: {DEFAULT_MEMORY_MB}, or an even share if "
            "smaller]."
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option(help="Allow promising more CPU or memory than the machine has.")
    ] = False,
    latency: Annotated[
        str,
        typer.Option(
            help="Latency/jitter/loss of the profiles: auto (netem where the kernel has it, "
            "else rates only with a warning), require (fail without netem), off (rates only)."
        ),
    ] = "auto",
    prefix: Annotated[
        str, typer.Option(help="Name prefix of devices (PREFIX-1, ...), bridge and cgroups.")
    ] = DEFAULT_PREFIX,
    subnet: Annotated[
        str, typer.Option(help="IPv4 subnet; the host takes the first address, devices the next.")
    ] = DEFAULT_SUBNET,
    profiles_file: Annotated[
        Path, typer.Option(envvar="GLOBALDL_FLEET_PROFILES", help="Link profiles YAML.")
    ] = DEFAULT_PROFILES_PATH,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Create the devices: namespaces on a bridge, shaped links, CPU/memory limits, an sshd each."""
    with user_errors():
        profiles = load_profiles(profiles_file)
        plan = plan_fleet(
            device_profiles(
                profiles,
                devices=devices,
                profile=profile,
                mix=mix,
                up_mbit=up_mbit,
                down_mbit=down_mbit,
            ),
            prefix=prefix,
            subnet=subnet,
            cpu_cores=cpu,
            memory_mb=memory,
            force=force,
            cpu_cores_each=_cores_list(cpu_each) if cpu_each is not None else None,
        )
        # A `kill` during up must still roll back.
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        state = Fleet(state_dir).up(plan, latency=latency, log=_echo_err)
    latency = "emulated" if state.latency_emulated else "NOT emulated (rates only)"
    if not any(d.profile.needs_netem for d in state.devices):
        latency = "none asked for"
    typer.echo(
        f"fleet up: {len(state.devices)} devices on {state.bridge} ({state.subnet}), latency "
        f"{latency}"
    )
    for device in state.devices:
        typer.echo(
            f"  {device.name:<10} {device.address:<15} {device.profile.name:<14} up "
            f"{device.profile.up_kbit_per_second:g} kbit/s, down "
            f"{device.profile.down_kbit_per_second:g} kbit/s, {device.cpu_cores:g} cores, "
            f"{device.memory_bytes // 2**20} MB"
        )
    typer.echo(f"ssh key: {state.identity_file}")


@app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Remove everything the fleet created; safe to run twice."""
    with user_errors():
        removed = Fleet(state_dir).down(log=_echo_err)
    typer.echo(
        "fleet down: removed"
        if removed
        else f"fleet down: nothing to remove (no state in {state_dir})"
    )


@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the full status as JSON.")] = False,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Devices, addresses, limits and the live qdiscs read back from tc."""
    with user_errors():
        report = Fleet(state_dir).status()
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    latency = "emulated" if report["latency_emulated"] else "not emulated"
    typer.echo(
        f"fleet {report['phase']}: bridge {report['bridge']} {report['host_address']} "
        f"({report['subnet']}), netem "
        f"{'available' if report['netem_available'] else 'unavailable'}, latency {latency}"
    )
    for device in report["devices"]:
        typer.echo(_device_line(device))
        for direction in ("uplink", "downlink"):
            for qdisc in device.get(f"{direction}_qdiscs", []):
                typer.echo(f"    {direction:<8} {_qdisc_text(qdisc)}")


def _device_line(device: dict[str, Any]) -> str:
    limits = device["limits"] or {}
    cores = limits.get("cpu_cores")
    memory_mb = {
        key: limits.get(key, 0) // 2**20 for key in ("memory_usage_bytes", "memory_limit_bytes")
    }
    return (
        f"{device['name']:<10} {device['address']:<15} {device['status']:<8} sshd "
        f"{'up' if device['sshd_alive'] else 'DOWN'}  profile {device['profile']['name']}  cpu "
        f"{cores if cores is not None else 'unlimited'} cores (throttled "
        f"{limits.get('cpu_throttled_seconds', 0):.1f} s)  memory "
        f"{memory_mb['memory_usage_bytes']}/{memory_mb['memory_limit_bytes']} MB"
    )


def _qdisc_text(qdisc: dict[str, Any]) -> str:
    parts = [f"{qdisc['kind']:<5} {qdisc['handle']:<4}"]
    if qdisc["rate_bits_per_second"]:
        parts.append(f"rate {qdisc['rate_bits_per_second'] / 1e6:g} Mbit/s")
    if qdisc["delay_ms"]:
        parts.append(f"delay {qdisc['delay_ms']:g} ms")
    if qdisc["loss_percent"]:
        parts.append(f"loss {qdisc['loss_percent']:g}%")
    parts.append(
        f"sent {qdisc['sent_bytes']:,} B  dropped {qdisc['dropped_packets']}  overlimits "
        f"{qdisc['overlimits']}"
    )
    return "  ".join(parts)


@app.command()
def hosts(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Print ADDR:1 per live device (horovodrun -H list; Horovod Elastic host-discovery output)."""
    with user_errors():
        for host in Fleet(state_dir).hosts():
            typer.echo(host)


@app.command()
def kill(
    device: Annotated[str, typer.Argument(help="Device name, e.g. gdl-2.")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Make a device fail: kill its processes (sshd included) and take its link down."""
    with user_errors():
        Fleet(state_dir).kill(device)
    typer.echo(f"{device}: killed, link down")


@app.command()
def revive(
    device: Annotated[str, typer.Argument(help="Device name, e.g. gdl-2.")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Bring a killed device back: link up, sshd started, login checked."""
    # A device whose sshd will not start or answer is refused by the system (exit 1).
    with user_errors(refused=(RuntimeError,)):
        Fleet(state_dir).revive(device)
    typer.echo(f"{device}: up")


@app.command()
def measure(
    sender: Annotated[str, typer.Option("--from", help="Sending device.")],
    receiver: Annotated[str, typer.Option("--to", help="Receiving device.")],
    seconds: Annotated[float, typer.Option(help="Transfer time.")] = 4.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the measurement as JSON.")] = False,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Measure the shaped path SENDER -> RECEIVER with a bounded bulk TCP transfer."""
    with user_errors():
        state = Fleet(state_dir).require_state()
        source, target = state.device(sender), state.device(receiver)
        shaped_kbit = min(source.profile.up_kbit_per_second, target.profile.down_kbit_per_second)
        result = measure_throughput(
            source.name, target.name, target.address, shaped_kbit * 1000, seconds=seconds
        )
    if as_json:
        typer.echo(json.dumps(result.to_dict()))
        return
    typer.echo(
        f"{sender} -> {receiver}: shaped {shaped_kbit / 1000:g} Mbit/s (min of {sender} up, "
        f"{receiver} down); measured {result.frame_bits_per_second / 1e6:.3f} Mbit/s in frames "
        f"({result.payload_bits_per_second / 1e6:.3f} Mbit/s TCP payload, {result.payload_bytes:,} "
        f"B in {result.seconds:.2f} s); error {result.relative_error:+.1%}"
    )


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            help="After --: arguments of `globaldl train` (or, with --exec, a whole command)."
        ),
    ] = None,
    exec_command: Annotated[
        bool,
        typer.Option(
            "--exec", help="Run ARGS as the worker command instead of `globaldl train ARGS`."
        ),
    ] = False,
    metrics_port: Annotated[
        int | None, typer.Option(help="Base metrics port; each device serves on its own address.")
    ] = None,
    prometheus_dir: Annotated[
        Path | None,
        typer.Option(
            help="State dir of `globaldl monitor` whose file-SD targets get the devices "
            "[default: runs/prometheus when --metrics-port is set]."
        ),
    ] = None,
    run_id: Annotated[str | None, typer.Option(help="Run id [default: fleet-<UTC time>].")] = None,
    summary: Annotated[
        Path | None,
        typer.Option(help="Run summary path [default: runs/fleet/RUN_ID/summary.json]."),
    ] = None,
    timeout_seconds: Annotated[float, typer.Option(help="Stop the run after this long.")] = 3600,
    start_timeout_seconds: Annotated[
        int, typer.Option(help="horovodrun --start-timeout.")
    ] = launcher.DEFAULT_START_TIMEOUT_SECONDS,
    network_interface: Annotated[
        str | None,
        typer.Option(
            help="horovodrun --network-interface [default: the devices' eth0; Horovod's own "
            "probe picks loopback at random when there is one device]."
        ),
    ] = None,
    elastic: Annotated[
        bool,
        typer.Option(
            "--elastic",
            help="Horovod Elastic: devices killed mid-run drop out, revived ones rejoin "
            "(adds `--elastic` to the train arguments).",
        ),
    ] = False,
    min_np: Annotated[
        int | None, typer.Option(help="Elastic: fewest devices to go on with [default: 1].")
    ] = None,
    max_np: Annotated[
        int | None,
        typer.Option(help="Elastic: most devices to use [default: all devices of the fleet]."),
    ] = None,
    elastic_timeout_seconds: Annotated[
        int,
        typer.Option(help="Elastic: give up after waiting this long for min-np devices."),
    ] = 60,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Train on every live device with horovodrun; compare interface bytes with the summary."""
    worker_args = list(args or [])
    with user_errors():
        fleet = Fleet(state_dir)
        elastic_options = None
        if elastic:
            elastic_options = launcher.ElasticOptions(
                min_np=min_np or 1,
                max_np=max_np or len(fleet.require_state().devices),
                elastic_timeout_seconds=elastic_timeout_seconds,
            )
            if not exec_command and "--elastic" not in worker_args:
                worker_args.append("--elastic")
        elif min_np is not None or max_np is not None:
            raise ValueError("--min-np and --max-np need --elastic")
        request = _request(worker_args, exec_command, run_id, summary, metrics_port)
        targets_dir = None
        if request.metrics_port is not None:
            from globaldl.monitoring.prometheus import DEFAULT_STATE_DIR as PROMETHEUS_STATE_DIR
            from globaldl.monitoring.prometheus import targets_dir as prometheus_targets_dir

            targets_dir = prometheus_targets_dir(prometheus_dir or PROMETHEUS_STATE_DIR)
        result = launcher.run_on_fleet(
            fleet,
            request,
            targets_dir=targets_dir,
            timeout_seconds=timeout_seconds,
            start_timeout_seconds=start_timeout_seconds,
            network_interface=network_interface,
            elastic=elastic_options,
        )
    typer.echo(
        f"fleet run {result.run_id}: {len(result.hosts)} devices, exit {result.returncode}, "
        f"{result.seconds:.1f} s"
    )
    if result.targets_path is not None:
        typer.echo(f"prometheus targets were registered in {result.targets_path} during the run")
    for name in sorted(result.counters_before):
        before, after = result.counters_before[name], result.counters_after[name]
        typer.echo(
            f"  {name:<10} tx {after['tx_bytes'] - before['tx_bytes']:>14,} B  rx "
            f"{after['rx_bytes'] - before['rx_bytes']:>14,} B"
        )
    if result.accounting is not None:
        typer.echo(result.accounting.report())
        typer.echo(f"byte accounting written to {result.accounting_path}")
    elif result.summary_path is not None:
        typer.echo(f"no run summary at {result.summary_path}; no byte accounting")
    if result.returncode != 0:
        raise typer.Exit(code=result.returncode)


def _cores_list(text: str) -> list[float]:
    """`0.8,0.8,0.2` -> [0.8, 0.8, 0.2]; ValueError naming the bad entry."""
    values = []
    for item in text.split(","):
        try:
            values.append(float(item))
        except ValueError:
            raise ValueError(
                f"--cpu-each takes numbers of cores separated by commas, e.g. 0.8,0.2; "
                f"{item.strip()!r} is not a number"
            ) from None
    return values


def _request(
    worker_args: list[str],
    exec_command: bool,
    run_id: str | None,
    summary: Path | None,
    metrics_port: int | None,
) -> TrainRequest | ProgramRequest:
    """What every device runs, read once from the command line (the launcher gets it typed)."""
    if exec_command:
        return ProgramRequest(
            command=tuple(worker_args),
            run_id=run_id or new_run_id(),
            summary_path=summary.resolve() if summary else None,
            metrics_port=metrics_port,
        )
    request = TrainRequest.from_command_line(
        worker_args, run_id=run_id, summary=summary, metrics_port=metrics_port
    )
    request.summary_path.parent.mkdir(parents=True, exist_ok=True)
    return request


if __name__ == "__main__":
    sys.exit(app())

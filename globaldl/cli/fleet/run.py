"""`globaldl fleet run`: horovodrun across the live devices, with Horovod fitted to the links."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from globaldl import horovod_edits
from globaldl.cli.errors import user_errors
from globaldl.cli.fleet._common import StateDir, app, echo_err
from globaldl.fleet import launcher
from globaldl.fleet.fleet import Fleet, emulation_cpu_seconds
from globaldl.fleet.horovod_link import HorovodLinkSettings, horovod_link_settings, link_budget
from globaldl.fleet.model_size import dense_gradient_bytes, parse_train_settings
from globaldl.fleet.request import ProgramRequest, TrainRequest, new_run_id
from globaldl.fleet.state import DEFAULT_STATE_DIR, FleetState

if TYPE_CHECKING:
    from globaldl.settings import TrainSettings

SITES_FILE_OPTION = "--sites-file"
SITES_FILE_ENV = "GLOBALDL_SITES_FILE"


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
        int | None,
        typer.Option(
            help=f"horovodrun --start-timeout [default: {launcher.DEFAULT_START_TIMEOUT_SECONDS}, "
            "more on slow links]; raised where the links need longer."
        ),
    ] = None,
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
    """Train on every live device with horovodrun; compare interface bytes with the summary.

    Before launching, Horovod's cycle time and Gloo timeout are set from the fleet's links
    (unless HOROVOD_CYCLE_TIME / HOROVOD_GLOO_TIMEOUT_SECONDS are set), or the run is refused
    with the reason when they cannot hold. A fleet with sites passes its site map.
    """
    worker_args = list(args or [])
    with user_errors():
        fleet = Fleet(state_dir)
        state = fleet.require_state()
        elastic_options = None
        if elastic:
            elastic_options = launcher.ElasticOptions(
                min_np=min_np or 1,
                max_np=max_np or len(state.devices),
                elastic_timeout_seconds=elastic_timeout_seconds,
            )
            if not exec_command and "--elastic" not in worker_args:
                worker_args.append("--elastic")
        elif min_np is not None or max_np is not None:
            raise ValueError("--min-np and --max-np need --elastic")
        request = _request(worker_args, exec_command, run_id, summary, metrics_port)
        env = os.environ.copy()
        if state.site_map_path is not None:
            # Before the arguments are checked: `--hierarchy sites` needs a map to be valid.
            env.setdefault(SITES_FILE_ENV, str(state.site_map_path))
        settings = None
        if isinstance(request, TrainRequest):
            settings = parse_train_settings(request.train_args, env)
            if state.site_map_path is not None:
                request = _with_sites_file(request, settings)
        link = _link_settings(
            state, fleet, settings, env, start_timeout_seconds, timeout_seconds, elastic_options
        )
        for note in link.notes:
            echo_err(f"fleet run: {note}")
        env.update(link.environment())
        targets_dir = None
        if request.metrics_port is not None:
            from globaldl.monitoring.prometheus import DEFAULT_STATE_DIR as PROMETHEUS_STATE_DIR
            from globaldl.monitoring.prometheus import targets_dir as prometheus_targets_dir

            targets_dir = prometheus_targets_dir(prometheus_dir or PROMETHEUS_STATE_DIR)
        emulation_before = emulation_cpu_seconds(state)
        result = launcher.run_on_fleet(
            fleet,
            request,
            targets_dir=targets_dir,
            timeout_seconds=timeout_seconds,
            start_timeout_seconds=link.start_timeout_seconds,
            network_interface=network_interface,
            env=env,
            elastic=elastic_options,
            reach_timeout_seconds=link.reach_timeout_seconds,
        )
        emulation_after = emulation_cpu_seconds(state)
        links_path = _write_links_record(
            request.summary_path,
            link,
            result.seconds,
            emulation_before,
            emulation_after,
            {device.name: device.congestion_control for device in state.devices},
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
    if emulation_before is not None and emulation_after is not None:
        typer.echo(
            f"link emulation: {emulation_after - emulation_before:.1f} CPU s "
            f"({(emulation_after - emulation_before) / max(result.seconds, 1e-9):.3f} cores), "
            "outside the devices' quotas"
        )
    if result.accounting is not None:
        typer.echo(result.accounting.report())
        typer.echo(f"byte accounting written to {result.accounting_path}")
    elif result.summary_path is not None:
        typer.echo(f"no run summary at {result.summary_path}; no byte accounting")
    if links_path is not None:
        typer.echo(f"link settings and emulation CPU written to {links_path}")
    if result.returncode != 0:
        raise typer.Exit(code=result.returncode)


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


def _link_settings(
    state: FleetState,
    fleet: Fleet,
    settings: TrainSettings | None,
    env: dict[str, str],
    start_timeout_seconds: int | None,
    run_timeout_seconds: float,
    elastic: launcher.ElasticOptions | None,
) -> HorovodLinkSettings:
    """Horovod's settings for the live devices' links (the model sized from `settings`)."""
    devices = [device.name for device in fleet.live_devices()] or [
        device.name for device in state.devices
    ]
    if elastic is not None:
        # An elastic ring may grow to every device of the fleet.
        devices = [device.name for device in state.devices][: elastic.max_np]
    return horovod_link_settings(
        link_budget(state, devices),
        dense_gradient_bytes=dense_gradient_bytes(settings) if settings is not None else None,
        compressed=settings is not None
        and (settings.compression.prune, settings.compression.quantize) != ("none", "none"),
        environ=env,
        start_timeout_seconds=start_timeout_seconds,
        default_start_timeout_seconds=launcher.DEFAULT_START_TIMEOUT_SECONDS,
        run_timeout_seconds=run_timeout_seconds,
        horovod_edits_installed=horovod_edits.installed(),
    )


def _with_sites_file(request: TrainRequest, settings: TrainSettings) -> TrainRequest:
    """Add `--sites-file MAP` to the train arguments (the contract), keeping a map the user chose.

    `settings.sites_file` is the user's map (flag, config file or $GLOBALDL_SITES_FILE) or
    else the fleet's; restating it as a flag changes nothing but makes it explicit.
    """
    if SITES_FILE_OPTION in request.train_args or settings.sites_file is None:
        return request
    return replace(
        request,
        train_args=(*request.train_args, SITES_FILE_OPTION, str(settings.sites_file)),
    )


def _write_links_record(
    summary_path: Path | None,
    link: HorovodLinkSettings,
    seconds: float,
    emulation_before: float | None,
    emulation_after: float | None,
    congestion_controls: dict[str, str],
) -> Path | None:
    """`<summary>.links.json`: Horovod's link settings, emulation CPU, each device's TCP.

    The emulation's CPU is over the run; each device's TCP congestion control is "" where the
    fleet predates its record.
    """
    if summary_path is None:
        return None
    from dataclasses import asdict

    from globaldl.files import write_json_atomically

    cpu = (
        emulation_after - emulation_before
        if emulation_before is not None and emulation_after is not None
        else None
    )
    path = summary_path.with_name(f"{summary_path.stem}.links.json")
    record = {
        **asdict(link),
        "run_seconds": seconds,
        "emulation_cpu_seconds": cpu,
        "emulation_cpu_cores_mean": cpu / seconds if cpu is not None and seconds > 0 else None,
        "tcp_congestion_control": congestion_controls,
        "written_at_unix": time.time(),
    }
    write_json_atomically(path, record)
    return path

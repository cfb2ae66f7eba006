"""`globaldl fleet run`: horovodrun across the live devices, with Horovod fitted to the links."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.fleet._common import StateDir, app, echo_err, user_errors
from globaldl.fleet import launcher
from globaldl.fleet.fleet import Fleet, emulation_cpu_seconds
from globaldl.fleet.horovod_link import HorovodLinkSettings, horovod_link_settings, link_budget
from globaldl.fleet.state import DEFAULT_STATE_DIR, FleetState

# `globaldl train` flags that make the exchange compressed (smaller than dense fp32).
_COMPRESSION_FLAGS = ("--prune", "--quantize")
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
        typer.Option(help="horovodrun --network-interface (default: let Horovod probe)."),
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
        run_id = run_id or launcher.option_value(worker_args, "--run-id") or launcher.new_run_id()
        env = os.environ.copy()
        if state.site_map_path is not None:
            env[SITES_FILE_ENV] = str(state.site_map_path)
            if not exec_command:
                worker_args = _with_sites_file(worker_args, state)
        link = _link_settings(
            state,
            fleet,
            None if exec_command else worker_args,
            env,
            start_timeout_seconds,
            timeout_seconds,
            elastic_options,
        )
        for note in link.notes:
            echo_err(f"fleet run: {note}")
        env.update(link.environment())
        if exec_command:
            if not worker_args:
                raise ValueError("--exec needs a command after --")
            worker_argv = worker_args
            summary_path = summary.resolve() if summary else None
        else:
            given = launcher.option_value(worker_args, "--summary")
            summary_path = Path(
                given or summary or launcher.DEFAULT_RUNS_DIR / run_id / "summary.json"
            ).resolve()
            summary_path.parent.mkdir(parents=True, exist_ok=True)
            # A relative --summary means the same file on every device: workers start in this cwd.
            worker_argv = launcher.train_argv(
                worker_args, run_id=run_id, summary=summary_path, metrics_port=metrics_port
            )
        base_port = (
            metrics_port
            if metrics_port is not None
            else _int_or_none(launcher.option_value(worker_args, "--metrics-port"))
        )
        targets_dir = None
        if base_port is not None:
            from globaldl.monitoring.prometheus import DEFAULT_STATE_DIR as PROMETHEUS_STATE_DIR
            from globaldl.monitoring.prometheus import targets_dir as prometheus_targets_dir

            targets_dir = prometheus_targets_dir(prometheus_dir or PROMETHEUS_STATE_DIR)
        emulation_before = emulation_cpu_seconds(state)
        result = launcher.run_on_fleet(
            fleet,
            worker_argv,
            run_id=run_id,
            summary_path=summary_path,
            targets_dir=targets_dir,
            metrics_port=base_port,
            timeout_seconds=timeout_seconds,
            start_timeout_seconds=link.start_timeout_seconds,
            network_interface=network_interface,
            env=env,
            elastic=elastic_options,
            reach_timeout_seconds=link.reach_timeout_seconds,
        )
        emulation_after = emulation_cpu_seconds(state)
        links_path = _write_links_record(
            summary_path, link, result.seconds, emulation_before, emulation_after
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


def _link_settings(
    state: FleetState,
    fleet: Fleet,
    train_args: list[str] | None,
    env: dict[str, str],
    start_timeout_seconds: int | None,
    run_timeout_seconds: float,
    elastic: launcher.ElasticOptions | None,
) -> HorovodLinkSettings:
    """Horovod's settings for the live devices' links (the model sized from `train_args`)."""
    from globaldl.fleet.model_size import dense_gradient_bytes

    devices = [device.name for device in fleet.live_devices()] or [
        device.name for device in state.devices
    ]
    if elastic is not None:
        # An elastic ring may grow to every device of the fleet.
        devices = [device.name for device in state.devices][: elastic.max_np]
    return horovod_link_settings(
        link_budget(state, devices),
        dense_gradient_bytes=dense_gradient_bytes(train_args) if train_args is not None else None,
        compressed=train_args is not None
        and any(
            launcher.option_value(train_args, flag) not in (None, "none")
            for flag in _COMPRESSION_FLAGS
        ),
        environ=env,
        start_timeout_seconds=start_timeout_seconds,
        default_start_timeout_seconds=launcher.DEFAULT_START_TIMEOUT_SECONDS,
        run_timeout_seconds=run_timeout_seconds,
    )


def _with_sites_file(train_args: list[str], state: FleetState) -> list[str]:
    """Add `--sites-file MAP` when this globaldl's train reads site maps (the contract)."""
    from globaldl.settings import FIELDS

    if launcher.option_value(train_args, SITES_FILE_OPTION) is not None:
        return train_args
    if "sites_file" not in FIELDS:
        echo_err(
            f"fleet run: this globaldl's `train` has no {SITES_FILE_OPTION} yet; the site map "
            f"{state.site_map_path} is passed as ${SITES_FILE_ENV} only"
        )
        return train_args
    return [*train_args, SITES_FILE_OPTION, str(state.site_map_path)]


def _write_links_record(
    summary_path: Path | None,
    link: HorovodLinkSettings,
    seconds: float,
    emulation_before: float | None,
    emulation_after: float | None,
) -> Path | None:
    """`<summary>.links.json`: the Horovod link settings and the emulation's CPU over the run."""
    if summary_path is None:
        return None
    import json
    from dataclasses import asdict

    from globaldl.fleet.system import write_atomically

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
        "written_at_unix": time.time(),
    }
    write_atomically(path, json.dumps(record, indent=2) + "\n")
    return path


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None else None

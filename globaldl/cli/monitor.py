"""`globaldl monitor up | down | status | targets`: a local Prometheus that scrapes the workers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.errors import user_errors
from globaldl.monitoring.discovery import parse_hosts, write_targets
from globaldl.monitoring.prometheus import (
    DEFAULT_PORT,
    DEFAULT_SCRAPE_INTERVAL_SECONDS,
    DEFAULT_STATE_DIR,
    READY_TIMEOUT_SECONDS,
    STOP_TIMEOUT_SECONDS,
    prometheus_status,
    scrape_targets_summary,
    start_prometheus,
    stop_prometheus,
    targets_dir,
)
from globaldl.monitoring.promql import PrometheusQueryError

app = typer.Typer(
    help="Run a Prometheus on loopback that scrapes globaldl workers (config: deploy/prometheus/).",
    no_args_is_help=True,
)

StateDir = Annotated[
    Path, typer.Option(help="Config, pid file, log, data and targets of this Prometheus.")
]


@app.command()
def up(
    state_dir: StateDir = DEFAULT_STATE_DIR,
    port: Annotated[int, typer.Option(help="Loopback port Prometheus listens on.")] = DEFAULT_PORT,
    scrape_interval: Annotated[
        float, typer.Option(help="Seconds between scrapes and rule evaluations.")
    ] = DEFAULT_SCRAPE_INTERVAL_SECONDS,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for Prometheus to be ready.")
    ] = READY_TIMEOUT_SECONDS,
    retention: Annotated[str, typer.Option(help="How long Prometheus keeps samples.")] = "15d",
) -> None:
    """Start Prometheus (or report the one already running) and wait until it is ready."""
    with user_errors():
        before = prometheus_status(state_dir)
        try:
            status = start_prometheus(
                state_dir,
                port=port,
                scrape_interval_seconds=scrape_interval,
                ready_timeout_seconds=timeout,
                retention=retention,
            )
        except RuntimeError as error:
            typer.echo(f"globaldl: error: {error}", err=True)
            raise typer.Exit(code=1) from None
    verb = "already running" if before.running else "started"
    typer.echo(f"Prometheus {verb} at {status.url} (pid {status.pid})")
    typer.echo(
        f"targets: write them to {targets_dir(state_dir)}/RUN.json (globaldl monitor targets)"
    )


@app.command()
def down(
    state_dir: StateDir = DEFAULT_STATE_DIR,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait after SIGTERM before SIGKILL.")
    ] = STOP_TIMEOUT_SECONDS,
) -> None:
    """Stop Prometheus; does nothing (and succeeds) when none is running."""
    with user_errors():
        stopped = stop_prometheus(state_dir, timeout_seconds=timeout)
    typer.echo("Prometheus stopped" if stopped else "Prometheus was not running")


@app.command()
def status(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Say whether Prometheus runs, where, and how many targets are up; exit 1 if it does not."""
    with user_errors():
        current = prometheus_status(state_dir)
    if not current.running:
        typer.echo(f"Prometheus is not running (state dir {state_dir})")
        raise typer.Exit(code=1)
    readiness = "ready" if current.ready else "not ready"
    line = f"Prometheus running at {current.url} (pid {current.pid}), {readiness}"
    if current.ready and current.url is not None:
        try:
            counts = scrape_targets_summary(current.url)
            line += (
                f"; targets up {counts['up']}, down {counts['down']}, unknown {counts['unknown']}"
            )
        except PrometheusQueryError as error:
            line += f"; targets unknown ({error})"
    typer.echo(line)


@app.command()
def targets(
    run: Annotated[str, typer.Option(help="Run id (the `run` label of its metrics).")],
    hosts: Annotated[
        str, typer.Option("--hosts", "-H", help="Hosts as horovodrun -H takes them: HOST:SLOTS,...")
    ],
    metrics_port: Annotated[int, typer.Option(help="The --metrics-port base the workers use.")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Write the scrape targets of a run (one per rank) for Prometheus to discover."""
    with user_errors():
        path = write_targets(
            targets_dir(state_dir), run_id=run, hosts=parse_hosts(hosts), base_port=metrics_port
        )
    typer.echo(f"wrote {path}")

"""`globaldl report`: a markdown report with PNG plots of a run, from Prometheus or a summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.errors import user_errors

app = typer.Typer(help="Write a run report (markdown + PNG plots) for people without Grafana.")


@app.callback(invoke_without_command=True)
def report(
    out: Annotated[Path, typer.Option(help="Directory for report.md and its PNG plots.")],
    prometheus: Annotated[
        str | None, typer.Option(help="Prometheus URL that scraped the run.")
    ] = None,
    run: Annotated[str | None, typer.Option(help="Run id (with --prometheus).")] = None,
    summary: Annotated[
        Path | None, typer.Option(help="Run summary JSON, when no Prometheus ran.")
    ] = None,
    lookback_hours: Annotated[
        float, typer.Option(help="How far back Prometheus is searched for the run.")
    ] = 24.0,
) -> None:
    """Report where the step time went, per device, with the bottleneck in one sentence each."""
    from globaldl.monitoring.promql import PrometheusApi, PrometheusQueryError
    from globaldl.monitoring.report import (
        device_bottlenecks,
        load_from_prometheus,
        load_from_summary,
        write_report,
    )

    with user_errors():
        try:
            if summary is not None and prometheus is None:
                data = load_from_summary(summary)
            elif prometheus is not None and summary is None:
                if run is None:
                    raise ValueError("--prometheus needs --run RUN (the run id of its metrics)")
                data = load_from_prometheus(
                    PrometheusApi(prometheus), run, lookback_seconds=lookback_hours * 3600
                )
            else:
                raise ValueError("give either --prometheus URL --run RUN, or --summary FILE")
        except PrometheusQueryError as error:
            typer.echo(f"globaldl: error: {error}", err=True)
            raise typer.Exit(code=1) from None
        path = write_report(data, out)
    for bottleneck in device_bottlenecks(data):
        typer.echo(bottleneck.sentence())
    typer.echo(f"wrote {path}")

"""`globaldl dashboards build | push`: the Grafana dashboards as code, written out or uploaded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.errors import user_errors

app = typer.Typer(
    help="Grafana dashboards as code: build the JSON, or push it to a Grafana.",
    no_args_is_help=True,
)


@app.command()
def build(
    out: Annotated[
        Path | None,
        typer.Option(help="Directory for STEM.json files [default: deploy/grafana/dashboards]."),
    ] = None,
) -> None:
    """Write every dashboard's JSON (commit the result: Grafana provisioning reads it)."""
    from globaldl.monitoring.dashboards import DASHBOARDS_DIR, write_dashboards

    with user_errors():
        paths = write_dashboards(out if out is not None else DASHBOARDS_DIR)
    for path in paths:
        typer.echo(f"wrote {path}")


@app.command()
def push(
    url: Annotated[str, typer.Option(help="Grafana base URL, e.g. http://127.0.0.1:3000.")],
    token_env: Annotated[
        str, typer.Option(help="Environment variable holding a Grafana service-account token.")
    ] = "GRAFANA_TOKEN",
    user: Annotated[str | None, typer.Option(help="Basic-auth user instead of a token.")] = None,
    password_env: Annotated[
        str, typer.Option(help="Environment variable holding the basic-auth password.")
    ] = "GRAFANA_PASSWORD",
    folder_uid: Annotated[
        str | None, typer.Option(help="Grafana folder to put the dashboards in.")
    ] = None,
) -> None:
    """Create or overwrite the dashboards in a running Grafana (through grafana-client)."""
    from globaldl.monitoring.dashboards import push_dashboards

    with user_errors():
        if user is not None:
            password = os.environ.get(password_env)
            if not password:
                raise ValueError(f"--user {user!r} needs the password in ${password_env}")
            pushed = push_dashboards(url, basic_auth=(user, password), folder_uid=folder_uid)
        else:
            token = os.environ.get(token_env)
            if not token:
                raise ValueError(
                    f"set ${token_env} to a Grafana service-account token, or give --user"
                )
            pushed = push_dashboards(url, token=token, folder_uid=folder_uid)
    for address in pushed:
        typer.echo(f"pushed {address}")

"""`globaldl doctor`: check every device of a host file before a run, from the launching machine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from globaldl.doctor.diagnose import DEFAULT_MEMORY_NEED_MB
from globaldl.doctor.remote import FACTS_TIMEOUT_SECONDS


def doctor(
    hostfile: Annotated[Path, typer.Option(help="Horovod host file (`HOST slots=N` lines).")],
    python: Annotated[
        str,
        typer.Option(
            help="Python on the devices that horovodrun starts [default: this one's path, as "
            "horovodrun runs the same path everywhere]."
        ),
    ] = sys.executable,
    ssh_identity_file: Annotated[
        Path | None, typer.Option(help="ssh key, as horovodrun's --ssh-identity-file.")
    ] = None,
    ssh_port: Annotated[int | None, typer.Option(help="ssh port, as horovodrun's.")] = None,
    ssh_user: Annotated[str | None, typer.Option(help="ssh login [default: ssh's].")] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="The run's --metrics-port: free on every device and reachable."),
    ] = None,
    node_exporter_port: Annotated[
        int | None, typer.Option(help="Check node-exporter answers on this port (e.g. 9100).")
    ] = None,
    memory_need_mb: Annotated[
        int, typer.Option(help="Memory one worker needs, MB.")
    ] = DEFAULT_MEMORY_NEED_MB,
    measure_seconds: Annotated[
        float, typer.Option(help="Seconds each device sends to its ring successor.")
    ] = 1.0,
    timeout_seconds: Annotated[
        float, typer.Option(help="How long every device may take to load TensorFlow and answer.")
    ] = FACTS_TIMEOUT_SECONDS,
) -> None:
    """Can these devices run? ssh, versions, Horovod build, host name, clock, ports, memory, links.

    Exit code 1 when a run would fail, 2 for bad input.
    """
    from globaldl.doctor.diagnose import DoctorRequest, diagnose
    from globaldl.doctor.remote import SshOptions
    from globaldl.doctor.table import render

    try:
        request = DoctorRequest(
            hostfile=hostfile,
            python=python,
            ssh=SshOptions(port=ssh_port, identity_file=ssh_identity_file, user=ssh_user),
            metrics_port=metrics_port,
            node_exporter_port=node_exporter_port,
            memory_need_mb=memory_need_mb,
            measure_seconds=measure_seconds,
            timeout_seconds=timeout_seconds,
        )
        reports = diagnose(request)
    except ValueError as error:
        typer.echo(f"globaldl: error: {error}", err=True)
        raise typer.Exit(code=2) from None
    typer.echo(render(reports))
    if any(report.verdict.name == "FAIL" for report in reports):
        raise typer.Exit(code=1)

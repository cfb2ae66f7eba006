"""`globaldl fleet down|hosts|kill|revive`: remove the fleet, list it, fail and revive devices."""

from __future__ import annotations

from typing import Annotated

import typer

from globaldl.cli.errors import user_errors
from globaldl.cli.fleet._common import StateDir, app, echo_err
from globaldl.fleet.fleet import Fleet
from globaldl.fleet.state import DEFAULT_STATE_DIR


@app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Remove everything the fleet created; safe to run twice."""
    with user_errors():
        removed = Fleet(state_dir).down(log=echo_err)
    typer.echo(
        "fleet down: removed"
        if removed
        else f"fleet down: nothing to remove (no state in {state_dir})"
    )


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

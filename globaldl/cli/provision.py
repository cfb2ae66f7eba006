"""`globaldl provision`: what deploy/ansible runs on the controller, and an emulated inventory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from globaldl.fleet.state import DEFAULT_STATE_DIR

app = typer.Typer(
    help="Provision devices with deploy/ansible: the offline wheelhouse, emulated inventories.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _fail(error: Exception) -> None:
    typer.echo(f"globaldl: error: {error}", err=True)
    raise typer.Exit(code=2)


@app.command()
def wheelhouse(
    arch: Annotated[str, typer.Option(help="Device architecture: aarch64 or x86_64.")],
    python_version: Annotated[str, typer.Option(help="Device Python, e.g. 3.11.")],
    directory: Annotated[
        Path, typer.Option("--dir", help="Wheelhouse root; the platform's files go below it.")
    ],
    source: Annotated[
        Path | None, typer.Option(help="globaldl source tree [default: the one running].")
    ] = None,
) -> None:
    """Gather every wheel a device of this platform installs, offline; print one JSON line."""
    from globaldl.provision.wheelhouse import build_wheelhouse, default_horovod_cache

    try:
        result = build_wheelhouse(
            directory,
            arch,
            python_version,
            source_dir=source,
            horovod_cache=default_horovod_cache(),
        )
    except (ValueError, RuntimeError, OSError) as error:
        _fail(error)
    typer.echo(result.to_json())


@app.command()
def inventory(
    out: Annotated[Path, typer.Option(help="Inventory file to write (YAML).")],
    prefix_root: Annotated[
        Path, typer.Option(help="Each emulated device installs below PREFIX_ROOT/DEVICE.")
    ],
    site: Annotated[str, typer.Option(help="Site of every device.")] = "emulated",
    slots: Annotated[int, typer.Option(help="Horovod slots per device.")] = 1,
    state_dir: Annotated[
        Path, typer.Option(envvar="GLOBALDL_FLEET_STATE_DIR", help="The emulated fleet's state.")
    ] = DEFAULT_STATE_DIR,
) -> None:
    """Write an Ansible inventory of the emulated fleet (the form of inventory.example)."""
    from globaldl.fleet.fleet import Fleet
    from globaldl.provision.inventory import fleet_inventory, write_inventory

    try:
        state = Fleet(state_dir).require_state()
        write_inventory(out, fleet_inventory(state, prefix_root, site=site, slots=slots))
    except (ValueError, OSError) as error:
        _fail(error)
    typer.echo(f"inventory of {len(state.devices)} devices: {out}")

"""`globaldl fleet up`: create the devices (and sites) of an emulated fleet."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.errors import user_errors
from globaldl.cli.fleet._common import (
    StateDir,
    app,
    echo_err,
    link_text,
    raise_keyboard_interrupt,
)
from globaldl.fleet.fleet import Fleet
from globaldl.fleet.plan import DEFAULT_MEMORY_MB, DEFAULT_PREFIX, DEFAULT_SUBNET, plan_from_options
from globaldl.fleet.profiles import DEFAULT_PROFILES_PATH, load_profiles
from globaldl.fleet.sites import DEFAULT_LAN_PROFILE
from globaldl.fleet.state import DEFAULT_STATE_DIR


@app.command()
def up(
    devices: Annotated[
        int | None,
        typer.Option("--devices", "-n", help="Number of devices (with --profile)."),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Link profile of every device: a name from the profiles file, 'custom' (with "
            "--up-mbit/--down-mbit), custom:UP:DOWN or custom:UP:DOWN:ONE_WAY_DELAY_MS."
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
    sites: Annotated[
        str | None,
        typer.Option(
            help="Group the devices in sites: SITESxDEVICES (e.g. 4x4) or a site file (YAML, "
            "`sites: {NAME: DEVICES or {devices, lan, wan}}`). Each site's devices share a LAN "
            "bridge and one WAN link to the core."
        ),
    ] = None,
    lan: Annotated[
        str | None,
        typer.Option(
            help=f"With --sites: each device's link to its site [default: {DEFAULT_LAN_PROFILE}]."
        ),
    ] = None,
    wan: Annotated[
        str | None, typer.Option(help="With --sites: the link each site shares to the core.")
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
            help="Delay/jitter/loss of the profiles: auto (emulated with vde2 where installed, "
            "else rates only with a warning), require (fail without), off (rates only)."
        ),
    ] = "auto",
    congestion_control: Annotated[
        str | None,
        typer.Option(
            help="TCP congestion control in every device (bbr, cubic, reno: what the kernel "
            "offers) [default: the host's]. Real devices mostly run cubic."
        ),
    ] = None,
    prefix: Annotated[
        str, typer.Option(help="Name prefix of devices (PREFIX-1, ...), bridges and cgroups.")
    ] = DEFAULT_PREFIX,
    subnet: Annotated[
        str, typer.Option(help="IPv4 subnet; the host takes the first address, devices the next.")
    ] = DEFAULT_SUBNET,
    profiles_file: Annotated[
        Path, typer.Option(envvar="GLOBALDL_FLEET_PROFILES", help="Link profiles YAML.")
    ] = DEFAULT_PROFILES_PATH,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Create the devices: namespaces on bridges, shaped and delayed links, limits, an sshd each."""
    with user_errors():
        plan = plan_from_options(
            load_profiles(profiles_file),
            devices=devices,
            profile=profile,
            mix=mix,
            up_mbit=up_mbit,
            down_mbit=down_mbit,
            sites=sites,
            lan=lan,
            wan=wan,
            prefix=prefix,
            subnet=subnet,
            cpu_cores=cpu,
            memory_mb=memory,
            force=force,
            cpu_cores_each=_cores_list(cpu_each) if cpu_each is not None else None,
            congestion_control=congestion_control,
        )
        # A `kill` during up must still roll back.
        signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
        state = Fleet(state_dir).up(plan, latency=latency, log=echo_err)
    if state.latency_emulated:
        latency_text = f"emulated ({state.emulator})"
    elif any(d.profile.impaired for d in state.devices) or any(s.wan.impaired for s in state.sites):
        latency_text = "NOT emulated (rates only)"
    else:
        latency_text = "none asked for"
    typer.echo(
        f"fleet up: {len(state.devices)} devices on {state.bridge} ({state.subnet}), delay/jitter/"
        f"loss {latency_text}"
    )
    for site in state.sites:
        typer.echo(
            f"  site {site.name:<10} {site.bridge:<10} wan {site.wan.name} "
            f"({link_text(site.wan.get_config())}, {site.link}), devices {', '.join(site.devices)}"
        )
    for device in state.devices:
        typer.echo(
            f"  {device.name:<10} {device.address:<15} {device.profile.name:<14} "
            f"{link_text(device.profile.get_config())} ({device.link}), "
            f"{device.cpu_cores:g} cores, {device.memory_bytes // 2**20} MB, TCP "
            f"{device.congestion_control}"
        )
    if state.site_map_path is not None:
        typer.echo(f"site map: {state.site_map_path}")
    typer.echo(f"ssh key: {state.identity_file}")


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

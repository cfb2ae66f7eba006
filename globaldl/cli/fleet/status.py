"""`globaldl fleet status`: devices, sites, limits, links and the live qdiscs read back."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from globaldl.cli.errors import user_errors
from globaldl.cli.fleet._common import StateDir, app, link_text
from globaldl.fleet.fleet import Fleet
from globaldl.fleet.state import DEFAULT_STATE_DIR


@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the full status as JSON.")] = False,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Devices, sites, addresses, limits, link emulation and the live qdiscs read back from tc."""
    with user_errors():
        report = Fleet(state_dir).status()
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    emulation = report["emulation"]
    latency = "emulated" if report["latency_emulated"] else "not emulated"
    typer.echo(
        f"fleet {report['phase']}: bridge {report['bridge']} {report['host_address']} "
        f"({report['subnet']}), delay/jitter/loss {latency} (emulator: {report['emulator']})"
    )
    cpu = emulation["cpu_seconds"]
    typer.echo(
        f"link emulation: cgroup {emulation['cgroup']}, {emulation['processes_alive']}/"
        f"{emulation['processes_recorded']} processes alive, CPU "
        f"{f'{cpu:.1f} s' if cpu is not None else 'unknown'} so far (outside device quotas)"
    )
    for site in report["sites"]:
        typer.echo(
            f"site {site['name']:<10} bridge {site['bridge']} wan {site['wan']['name']} "
            f"({link_text(site['wan'])}, {site['link']}): {', '.join(site['devices'])}"
        )
        for direction in ("uplink", "downlink"):
            for qdisc in site.get(f"{direction}_qdiscs", []):
                typer.echo(f"    wan {direction:<8} {_qdisc_text(qdisc)}")
    if report["site_map"]:
        typer.echo(f"site map: {report['site_map']}")
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
    site = f"  site {device['site']}" if device["site"] else ""
    return (
        f"{device['name']:<10} {device['address']:<15} {device['status']:<8} sshd "
        f"{'up' if device['sshd_alive'] else 'DOWN'}{site}  profile {device['profile']['name']} "
        f"({link_text(device['profile'])}, {device['link']})  cpu "
        f"{cores if cores is not None else 'unlimited'} cores (throttled "
        f"{limits.get('cpu_throttled_seconds', 0):.1f} s)  memory "
        f"{memory_mb['memory_usage_bytes']}/{memory_mb['memory_limit_bytes']} MB  TCP "
        f"{device.get('congestion_control') or 'not recorded'}"
    )


def _qdisc_text(qdisc: dict[str, Any]) -> str:
    parts = [f"{qdisc['kind']:<5} {qdisc['handle']:<4}"]
    if qdisc["rate_bits_per_second"]:
        parts.append(f"rate {qdisc['rate_bits_per_second'] / 1e6:g} Mbit/s")
    parts.append(
        f"sent {qdisc['sent_bytes']:,} B  dropped {qdisc['dropped_packets']}  overlimits "
        f"{qdisc['overlimits']}"
    )
    return "  ".join(parts)

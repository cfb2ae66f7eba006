"""`globaldl fleet tcp`: each device's TCP connections sampled while a run goes."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.errors import user_errors
from globaldl.cli.fleet._common import StateDir, app, echo_err
from globaldl.experiments.outputs import write_csv
from globaldl.files import write_json_atomically
from globaldl.fleet.fleet import Fleet
from globaldl.fleet.state import DEFAULT_STATE_DIR
from globaldl.fleet.tcpstate import (
    DEFAULT_MIN_BYTES,
    Connection,
    Sample,
    sample_fleet,
    summarize,
)
from globaldl.markdown import markdown_table

COLUMNS = (
    "device",
    "peer",
    "congestion_control",
    "uplink_mbit",
    "bytes_sent",
    "flights",
    "flight_mbit_per_second",
    "pacing_mbit_sending",
    "bbr_bandwidth_mbit_sending",
    "cwnd_min",
    "cwnd_median",
    "cwnd_max",
    "samples_at_initial_window_or_below",
    "samples",
    "longest_pause_ms",
    "rto_ms_median",
    "rtt_ms_median",
)


@app.command()
def tcp(
    seconds: Annotated[float, typer.Option(help="How long to sample.")] = 60.0,
    interval_ms: Annotated[float, typer.Option(help="Time between samples of a device.")] = 25.0,
    min_bytes: Annotated[
        int, typer.Option(help="Leave out connections that sent less in the window.")
    ] = DEFAULT_MIN_BYTES,
    samples_csv: Annotated[
        Path | None, typer.Option("--samples-csv", help="Also write every sample here.")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write the summary as JSON here.")] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Sample every device's TCP connections (ss -tin) while a run goes; summarize each.

    Per connection between two devices: its congestion control, its flights (bursts of
    sending) and the rate at which their bytes left, the pacing rate and BBR's bandwidth
    estimate while it sent, the window and how often it sat at the initial window (10
    segments) or below, and the longest pause. A restart after a pause shows there, and so
    does BBR's ProbeRTT (4 segments for 0.2 s every 10 s).
    """
    with user_errors():
        state = Fleet(state_dir).require_state()
        echo_err(f"sampling {len(state.devices)} devices for {seconds:g} s")
        samples = sample_fleet(state, seconds, interval_ms)
        rows = summarize(
            samples, {device.name: device.address for device in state.devices}, min_bytes
        )
    uplinks = {device.name: device.profile.up_kbit_per_second / 1000 for device in state.devices}
    for row in rows:
        row["uplink_mbit"] = uplinks[row["device"]]
    if samples_csv is not None:
        _write_samples(samples_csv, samples)
    if out is not None:
        write_json_atomically(out, {"seconds": seconds, "interval_ms": interval_ms, "rows": rows})
    if not rows:
        typer.echo(f"no connection between devices sent {min_bytes} bytes or more in the window")
        return
    typer.echo(markdown_table(rows, COLUMNS), nl=False)


def _write_samples(path: Path, samples: list[Sample]) -> None:
    """Every sample's connections, one row each."""
    columns = ["device", "time", *(field.name for field in fields(Connection))]
    rows = [
        {"device": sample.device, "time": sample.time, **asdict(connection)}
        for sample in samples
        for connection in sample.connections
    ]
    write_csv(path, rows, columns)

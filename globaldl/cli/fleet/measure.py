"""`globaldl fleet measure`: round trip, loss and rate of a path, next to what the profiles say."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from globaldl.cli.errors import user_errors
from globaldl.cli.fleet._common import StateDir, app
from globaldl.fleet.fleet import Fleet
from globaldl.fleet.linkcheck import measure_path
from globaldl.fleet.paths import HOST
from globaldl.fleet.state import DEFAULT_STATE_DIR


@app.command()
def measure(
    sender: Annotated[str, typer.Option("--from", help="Sending device.")],
    receiver: Annotated[
        str, typer.Option("--to", help=f"Receiving device, or `{HOST}` (the core, the host).")
    ],
    seconds: Annotated[float, typer.Option(help="Bulk transfer time for the rate.")] = 4.0,
    probes: Annotated[
        int | None,
        typer.Option(help="Round-trip probes [default: about a minute's worth, 20 to 200]."),
    ] = None,
    interval_ms: Annotated[
        float | None,
        typer.Option(
            help="Time between probes [default: 20 ms, more where jitter or a slow link needs]."
        ),
    ] = None,
    round_trip: Annotated[
        bool, typer.Option("--round-trip/--no-round-trip", help="Probe round trip and loss.")
    ] = True,
    rate: Annotated[bool, typer.Option("--rate/--no-rate", help="Measure the rate.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the measurement as JSON.")] = False,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Measure the path SENDER -> RECEIVER: UDP round trips and loss, then a bulk TCP rate.

    Each figure is printed next to what the links' profiles promise for the path, and the rate
    next to the CPU the user-space link emulation spent forwarding it.
    """
    with user_errors():
        result = measure_path(
            Fleet(state_dir).require_state(),
            sender,
            receiver,
            seconds=seconds,
            probes=probes,
            interval_ms=interval_ms,
            round_trip=round_trip,
            rate=rate,
        )
    if as_json:
        typer.echo(json.dumps(result))
        return
    if "round_trip" in result:
        typer.echo(_round_trip_text(result["round_trip"]))
    if "rate" in result:
        typer.echo(_rate_text(result["rate"], result["emulation_cpu_cores"]))


def _round_trip_text(measured: dict[str, Any]) -> str:
    head = f"{measured['source']} -> {measured['target']} -> {measured['source']}:"
    expected = measured["expected_round_trip_ms"]
    if measured["round_trip_ms_median"] is None:
        return f"{head} no echo came back from {measured['probes_sent']} probes"
    error = measured["round_trip_relative_error"]
    return (
        f"{head} round trip median {measured['round_trip_ms_median']:.1f} ms (min "
        f"{measured['round_trip_ms_min']:.1f}, max {measured['round_trip_ms_max']:.1f}; "
        f"{measured['echoes_received']}/{measured['probes_sent']} probes every "
        f"{measured['interval_ms']:g} ms); profiles: {expected:.1f} ms"
        + (f", error {error:+.1%}" if error is not None else "")
        + f"; loss there {measured['forward_loss_fraction']:.1%} (profiles "
        f"{measured['expected_forward_loss_fraction']:.1%}), back "
        + (
            f"{measured['return_loss_fraction']:.1%}"
            if measured["return_loss_fraction"] is not None
            else "n/a"
        )
        + f" (profiles {measured['expected_return_loss_fraction']:.1%})"
    )


def _rate_text(measured: dict[str, Any], emulation_cores: float | None) -> str:
    cpu = (
        f"; link emulation used {emulation_cores:.3f} cores meanwhile"
        if emulation_cores is not None
        else ""
    )
    return (
        f"{measured['sender']} -> {measured['receiver']}: shaped "
        f"{measured['shaped_bits_per_second'] / 1e6:g} Mbit/s (narrowest link on the path); "
        f"measured {measured['frame_bits_per_second'] / 1e6:.3f} Mbit/s in frames "
        f"({measured['payload_bits_per_second'] / 1e6:.3f} Mbit/s TCP payload, "
        f"{measured['payload_bytes']:,} B in {measured['seconds']:.2f} s); error "
        f"{measured['relative_error']:+.1%}{cpu}"
    )

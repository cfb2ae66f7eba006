"""What every `globaldl fleet` command shares: the Typer app, the state-dir option, output."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    help="Emulate a fleet of IoT devices on this machine and train across it with horovodrun.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

StateDir = Annotated[
    Path,
    typer.Option(
        envvar="GLOBALDL_FLEET_STATE_DIR",
        help="Where the fleet's state file, keys and sshd configs live.",
    ),
]


def echo_err(message: str) -> None:
    """One line on stderr (progress and warnings of fleet operations)."""
    typer.echo(message, err=True)


def raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    """Signal handler that turns a `kill` into the same clean-up path as Ctrl-C."""
    raise KeyboardInterrupt(f"signal {signum}")


def link_text(profile: dict[str, Any]) -> str:
    """`up 5 Mbit/s 35 ms, down 17.5 Mbit/s 35 ms` for a profile's `get_config()`."""
    config = profile
    parts = []
    for direction in ("up", "down"):
        text = f"{direction} {config[f'{direction}_kbit_per_second'] / 1000:g} Mbit/s"
        delay, jitter = config[f"{direction}_delay_ms"], config[f"{direction}_jitter_ms"]
        if delay or jitter:
            text += f" {delay:g}" + (f"+-{jitter:g}" if jitter else "") + " ms"
        if config[f"{direction}_loss_percent"]:
            text += f" loss {config[f'{direction}_loss_percent']:g}%"
        parts.append(text)
    return ", ".join(parts)

"""`globaldl experiment latency`: step time and time to accuracy against one-way delay."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


def parse_delays(text: str | None) -> list[float] | None:
    """`0,25,50` -> [0.0, 25.0, 50.0]; ValueError naming the bad entry."""
    if not text:
        return None
    delays = []
    for part in text.split(","):
        try:
            delays.append(float(part))
        except ValueError:
            raise ValueError(
                f"--delays-ms takes milliseconds separated by commas, e.g. 0,25,50; "
                f"{part.strip()!r} is not a number"
            ) from None
    return delays


@experiment_command()
def latency(
    shared: SharedOptions,
    delays_ms: Annotated[
        str | None,
        typer.Option(
            help="One-way delays per access link, ms, comma-separated, including 0 "
            "[default: 0,10,25,50,100,300; quick: 0,100]."
        ),
    ] = None,
) -> None:
    """Step time and time to accuracy against one-way delay (dense, fp16, top-k + int8)."""

    def build() -> Experiment:
        from globaldl.experiments import LatencyExperiment

        return LatencyExperiment(
            quick=shared.quick, cycle_time_ms=shared.cycle_time, delays_ms=parse_delays(delays_ms)
        )

    run_and_exit(build, shared)

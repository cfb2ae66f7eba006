"""`globaldl experiment bottleneck`: the dominant phase of the step per link and model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command, parse_names

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def bottleneck(
    shared: SharedOptions,
    profiles: Annotated[
        str | None,
        typer.Option(
            help="Link profiles, comma-separated [default: fibre,lte,slow-4g,lte-m,nb-iot; "
            "quick: fibre,slow-4g]."
        ),
    ] = None,
    devices: Annotated[int | None, typer.Option(help="Devices [default: 4; quick: 2].")] = None,
    cpu: Annotated[float, typer.Option("--cpu", help="CPU cores per device.")] = 0.5,
) -> None:
    """The dominant phase of the step per link profile and model (a table and a heatmap)."""

    def build() -> Experiment:
        from globaldl.experiments import BottleneckExperiment

        return BottleneckExperiment(
            quick=shared.quick,
            cycle_time_ms=shared.cycle_time,
            profiles=parse_names(profiles),
            devices=devices,
            cpu_cores_per_device=cpu,
        )

    run_and_exit(build, shared)

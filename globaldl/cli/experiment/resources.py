"""`globaldl experiment resources`: CPU, memory and network per device, from its exporter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def resources(
    shared: SharedOptions,
    devices: Annotated[int | None, typer.Option(help="Devices [default: 4; quick: 2].")] = None,
    profile: Annotated[str, typer.Option(help="Link profile of every device.")] = "lte",
    cpu: Annotated[float, typer.Option("--cpu", help="CPU cores per device.")] = 0.5,
) -> None:
    """CPU, memory and network per device for MLP layers x batch size (scraped exporters)."""

    def build() -> Experiment:
        from globaldl.experiments import ResourcesExperiment

        return ResourcesExperiment(
            quick=shared.quick,
            cycle_time_ms=shared.cycle_time,
            devices=devices,
            profile=profile,
            cpu_cores_per_device=cpu,
        )

    run_and_exit(build, shared)

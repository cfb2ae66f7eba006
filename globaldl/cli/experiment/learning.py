"""`globaldl experiment learning`: ResNet-8 and the video model learn on 4 compressed devices."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def learning(
    shared: SharedOptions,
    profile: Annotated[
        str,
        typer.Option(
            help="Link profile of the 4 devices. The exchange is synchronous, so the link "
            "changes the run's time, not what it learns; on lte one repeat takes over an hour."
        ),
    ] = "lan",
) -> None:
    """ResNet-8 and the video model: 4 compressed devices vs a 1-process dense calibration."""

    def build() -> Experiment:
        from globaldl.experiments import LearningExperiment

        return LearningExperiment(
            quick=shared.quick, cycle_time_ms=shared.cycle_time, profile=profile
        )

    run_and_exit(build, shared)

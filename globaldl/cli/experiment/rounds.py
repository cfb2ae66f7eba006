"""`globaldl experiment rounds`: local steps, compressed deltas and overlap on a distant link."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def rounds(
    shared: SharedOptions,
    profile: Annotated[
        str, typer.Option(help="The slow link: 5 Mbit/s up, 20 down, 50 ms one way.")
    ] = "custom:5:20:50",
) -> None:
    """Local steps with compressed, overlapped deltas against per-step Horovod (issue 13)."""

    def build() -> Experiment:
        from globaldl.experiments import RoundsExperiment

        return RoundsExperiment(
            quick=shared.quick, cycle_time_ms=shared.cycle_time, shaped_profile=profile
        )

    run_and_exit(build, shared)

"""`globaldl experiment recovery`: seconds from a device's death to the next step, and back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def recovery(
    shared: SharedOptions,
    profile: Annotated[str, typer.Option(help="Link profile of the 3 devices.")] = "lte",
    kill_runs: Annotated[
        int | None,
        typer.Option(
            min=1, help="Kill-and-revive runs in each repeat of the plan [default: 2; quick: 1]."
        ),
    ] = None,
) -> None:
    """Elastic recovery: seconds from a device's death to the next step, and from its return."""

    def build() -> Experiment:
        from globaldl.experiments import RecoveryExperiment

        return RecoveryExperiment(
            quick=shared.quick,
            cycle_time_ms=shared.cycle_time,
            profile=profile,
            repeats=kill_runs,
        )

    run_and_exit(build, shared)

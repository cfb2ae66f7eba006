"""`globaldl experiment balance`: two fast and two slow devices, equal shares vs by speed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def balance(
    shared: SharedOptions,
    profile: Annotated[str, typer.Option(help="Link profile of the 4 devices.")] = "lte",
) -> None:
    """Mixed fleet (2 fast, 2 quarter-speed devices): equal shares vs --balance speed."""

    def build() -> Experiment:
        from globaldl.experiments import BalanceExperiment

        return BalanceExperiment(
            quick=shared.quick, cycle_time_ms=shared.cycle_time, profile=profile
        )

    run_and_exit(build, shared)

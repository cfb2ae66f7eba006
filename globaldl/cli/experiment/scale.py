"""`globaldl experiment scale`: the largest LeNet fleet this machine trains, and what it costs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def scale(shared: SharedOptions) -> None:
    """The largest LeNet fleet this machine trains, memory per worker, links under load."""

    def build() -> Experiment:
        from globaldl.experiments import ScaleExperiment

        return ScaleExperiment(quick=shared.quick, cycle_time_ms=shared.cycle_time)

    run_and_exit(build, shared)

"""`globaldl experiment sites`: 16 devices in 4 sites behind shared LTE uplinks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def sites(shared: SharedOptions) -> None:
    """16 devices in 4 sites behind shared LTE uplinks, against the same 16 devices flat."""

    def build() -> Experiment:
        from globaldl.experiments import SitesExperiment

        return SitesExperiment(quick=shared.quick, cycle_time_ms=shared.cycle_time)

    run_and_exit(build, shared)

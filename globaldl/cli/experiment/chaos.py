"""`globaldl experiment chaos`: random kills and revives under Horovod Elastic, and their cost."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def chaos(
    shared: SharedOptions,
    profile: Annotated[
        str,
        typer.Option(
            help="Link profile of the 4 devices [default: lte's rates without its delay; on "
            "lte itself one repeat of 7 trials takes about 1.8 hours]."
        ),
    ] = "custom:5:17.5",
    trials: Annotated[
        int | None,
        typer.Option(min=1, help="Kill/revive trials in each repeat [default: 20; quick: 2]."),
    ] = None,
    trials_per_run: Annotated[
        int, typer.Option(min=1, help="Trials in one elastic run (its length follows).")
    ] = 5,
    seed: Annotated[int, typer.Option(help="Seed of the trial schedule.")] = 0,
    collective_timeout_seconds: Annotated[
        int,
        typer.Option(
            help="GLOBALDL_GLOO_COLLECTIVE_TIMEOUT_SECONDS of the workers: how long survivors "
            "wait for a vanished device once a ring trains (the join timeout stays 60 s)."
        ),
    ] = 10,
) -> None:
    """Chaos: seeded random kills and revives on an elastic, compressed fleet."""

    def build() -> Experiment:
        from globaldl.experiments.chaos import ChaosExperiment

        return ChaosExperiment(
            quick=shared.quick,
            cycle_time_ms=shared.cycle_time,
            profile=profile,
            trials=trials,
            trials_per_run=trials_per_run,
            seed=seed,
            collective_timeout_seconds=collective_timeout_seconds,
        )

    run_and_exit(build, shared)

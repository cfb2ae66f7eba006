"""`globaldl experiment scaling`: per-device traffic as devices are added, every exchange mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import (
    SharedOptions,
    experiment_command,
    parse_int_list,
    parse_names,
)

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def scaling(
    shared: SharedOptions,
    device_counts: Annotated[
        str | None, typer.Option(help="Flat fleet sizes [default: 2,4,8,16; quick: 2,4].")
    ] = None,
    codecs: Annotated[
        str | None,
        typer.Option(
            help="Exchange modes, comma-separated, dense among them [default: dense, fp16, "
            "topk+int8, shared-randomk+intsum, shared-topk+intsum, powersgd+fp16; quick: "
            "dense, shared-topk+intsum]."
        ),
    ] = None,
    link: Annotated[
        str | None,
        typer.Option(
            help="Each device's link and each site's WAN: a profile with latency, or "
            "custom:UP:DOWN:DELAY_MS [default: lte]."
        ),
    ] = None,
    cpu: Annotated[
        float | None,
        typer.Option("--cpu", help="CPU cores per device [default: 2 cores shared by the fleet]."),
    ] = None,
) -> None:
    """Per-device bytes, step time and accuracy at 2-16 devices; 4 sites x 4, ring vs sites."""

    def build() -> Experiment:
        from globaldl.experiments import ScalingExperiment

        return ScalingExperiment(
            quick=shared.quick,
            cycle_time_ms=shared.cycle_time,
            device_counts=parse_int_list("--device-counts", device_counts)
            if device_counts
            else None,
            codecs=parse_names(codecs),
            link=link,
            cpu_cores_per_device=cpu,
        )

    run_and_exit(build, shared)

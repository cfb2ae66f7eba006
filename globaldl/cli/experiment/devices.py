"""`globaldl experiment devices`: time, accuracy and time to accuracy against devices."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command, parse_int_list

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def devices(
    shared: SharedOptions,
    device_counts: Annotated[
        str | None, typer.Option(help="Fleet sizes [default: 1,2,4,8; quick: 1,2,4].")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(help="Link profile of every device [default: lte's rates, no delay]."),
    ] = None,
    cpu: Annotated[float | None, typer.Option("--cpu", help="CPU cores per device.")] = None,
    lenet_target: Annotated[float, typer.Option(help="Target val_accuracy, LeNet/MNIST.")] = 0.90,
    resnet_target: Annotated[
        float, typer.Option(help="Target val_accuracy, ResNet-8/cifar-synthetic.")
    ] = 0.50,
) -> None:
    """Time, accuracy and time to accuracy against devices [default cpu: 0.25; quick 0.5]."""

    def build() -> Experiment:
        from globaldl.experiments import DevicesExperiment
        from globaldl.experiments.spec import LENET_MNIST, RESNET8_CIFAR

        workloads = [LENET_MNIST.with_target(lenet_target)]
        if not shared.quick:
            workloads.append(RESNET8_CIFAR.with_target(resnet_target))
        return DevicesExperiment(
            quick=shared.quick,
            cycle_time_ms=shared.cycle_time,
            device_counts=parse_int_list("--device-counts", device_counts)
            if device_counts
            else None,
            workloads=workloads,
            profile=profile,
            cpu_cores_per_device=cpu,
        )

    run_and_exit(build, shared)

"""`globaldl experiment ablation`: each compression step alone and together, shaped and not."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from globaldl.cli.experiment.execute import run_and_exit
from globaldl.cli.experiment.options import SharedOptions, experiment_command, parse_names

if TYPE_CHECKING:
    from globaldl.experiments import Experiment


@experiment_command()
def ablation(
    shared: SharedOptions,
    devices: Annotated[int, typer.Option(help="Devices.")] = 4,
    cpu: Annotated[float, typer.Option("--cpu", help="CPU cores per device.")] = 0.5,
    target: Annotated[float, typer.Option(help="Target val_accuracy (LeNet/MNIST).")] = 0.90,
    variants: Annotated[
        str | None,
        typer.Option(
            help="Variants by label, comma-separated, e.g. none,fp16,none-cycle1ms "
            "[default: the 8 the goals need; see globaldl/experiments/ablation.py]."
        ),
    ] = None,
) -> None:
    """Compression ablation on a 5 Mbit/s uplink, and the recommended preset unshaped."""

    def build() -> Experiment:
        from globaldl.experiments import AblationExperiment
        from globaldl.experiments.ablation import variants_by_label
        from globaldl.experiments.spec import LENET_MNIST

        labels = parse_names(variants)
        return AblationExperiment(
            quick=shared.quick,
            cycle_time_ms=shared.cycle_time,
            variants=variants_by_label(labels) if labels else None,
            devices=devices,
            cpu_cores_per_device=cpu,
            workload=LENET_MNIST.with_target(target),
        )

    run_and_exit(build, shared)

"""`globaldl experiment scaling`: per-device traffic as devices are added, every exchange mode.

Registers on `globaldl experiment`'s command group and shares its options and runner.
"""

from __future__ import annotations

from typing import Annotated

import typer

from globaldl.cli.experiment import (
    Cpu,
    CycleTime,
    DryRun,
    Only,
    Out,
    Prefix,
    Quick,
    StateDir,
    Subnet,
    _execute,
    _exit_code,
    _labels,
    app,
    parse_cycle_time,
    parse_int_list,
)
from globaldl.experiments import Experiment


@app.command()
def scaling(
    quick: Quick = False,
    device_counts: Annotated[
        str | None, typer.Option(help="Flat fleet sizes [default: 2,4,8,16; quick: 2,4].")
    ] = None,
    codecs: Annotated[
        str | None,
        typer.Option(
            help="Exchange modes, comma-separated, dense among them [default: dense, fp16, "
            "topk+int8, shared-randomk+intsum, shared-topk+intsum, powersgd+fp16; quick: dense, "
            "shared-topk+intsum]."
        ),
    ] = None,
    link: Annotated[
        str | None,
        typer.Option(
            help="Each device's link and each site's WAN: a profile with latency, or "
            "custom:UP:DOWN:DELAY_MS [default: lte]."
        ),
    ] = None,
    cpu: Cpu = None,
    cycle_time_ms: CycleTime = "auto",
    out: Out = None,
    only: Only = None,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """Per-device bytes, step time and accuracy at 2-16 devices; 4 sites x 4, ring vs sites."""

    def build() -> Experiment:
        from globaldl.experiments import ScalingExperiment

        return ScalingExperiment(
            quick=quick,
            cycle_time_ms=parse_cycle_time(cycle_time_ms),
            device_counts=parse_int_list("--device-counts", device_counts)
            if device_counts
            else None,
            codecs=_labels(codecs),
            link=link,
            cpu_cores_per_device=cpu,
        )

    report = _execute(
        build,
        out=out,
        dry_run=dry_run,
        state_dir=state_dir,
        prefix=prefix,
        subnet=subnet,
        only=_labels(only),
    )
    raise typer.Exit(code=_exit_code([report]))

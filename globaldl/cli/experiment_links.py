"""`globaldl experiment latency|scale|sites`: the experiments of the fleet's global links.

They register on `globaldl experiment`'s command group and share its options and runner.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.experiment import (
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
)
from globaldl.experiments import Experiment


def _execute_and_exit(
    build: Callable[[], Experiment],
    out: Path | None,
    only: str | None,
    dry_run: bool,
    state_dir: Path | None,
    prefix: str | None,
    subnet: str | None,
) -> None:
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


def _delays(text: str | None) -> list[float] | None:
    """`0,25,50` -> [0.0, 25.0, 50.0]; ValueError naming the bad entry."""
    if not text:
        return None
    delays = []
    for part in text.split(","):
        try:
            delays.append(float(part))
        except ValueError:
            raise ValueError(
                f"--delays-ms takes milliseconds separated by commas, e.g. 0,25,50; "
                f"{part.strip()!r} is not a number"
            ) from None
    return delays


@app.command()
def latency(
    quick: Quick = False,
    delays_ms: Annotated[
        str | None,
        typer.Option(
            help="One-way delays per access link, ms, comma-separated, including 0 "
            "[default: 0,25,50,100,300; quick: 0,100]."
        ),
    ] = None,
    cycle_time_ms: CycleTime = "auto",
    out: Out = None,
    only: Only = None,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """Step time and time to accuracy against one-way delay (dense, fp16, top-k + int8)."""

    def build() -> Experiment:
        from globaldl.experiments import LatencyExperiment

        return LatencyExperiment(
            quick=quick,
            cycle_time_ms=parse_cycle_time(cycle_time_ms),
            delays_ms=_delays(delays_ms),
        )

    _execute_and_exit(build, out, only, dry_run, state_dir, prefix, subnet)


@app.command()
def scale(
    quick: Quick = False,
    cycle_time_ms: CycleTime = "auto",
    out: Out = None,
    only: Only = None,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """The largest LeNet fleet this machine trains, memory per worker, links under load."""

    def build() -> Experiment:
        from globaldl.experiments import ScaleExperiment

        return ScaleExperiment(quick=quick, cycle_time_ms=parse_cycle_time(cycle_time_ms))

    _execute_and_exit(build, out, only, dry_run, state_dir, prefix, subnet)


@app.command()
def sites(
    quick: Quick = False,
    cycle_time_ms: CycleTime = "auto",
    out: Out = None,
    only: Only = None,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """16 devices in 4 sites behind shared LTE uplinks, against the same 16 devices flat."""

    def build() -> Experiment:
        from globaldl.experiments import SitesExperiment

        return SitesExperiment(quick=quick, cycle_time_ms=parse_cycle_time(cycle_time_ms))

    _execute_and_exit(build, out, only, dry_run, state_dir, prefix, subnet)

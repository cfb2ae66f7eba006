"""`globaldl experiment all`: every experiment in turn, and one table of every goal."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from globaldl.cli.errors import user_errors
from globaldl.cli.experiment.execute import command_line, execute, exit_code
from globaldl.cli.experiment.options import DEFAULT_RESULTS_DIR, SharedOptions, experiment_command

if TYPE_CHECKING:
    from globaldl.experiments import Experiment, ExperimentReport


@experiment_command(without=("out", "only"))
def all_experiments(
    shared: SharedOptions,
    out: Annotated[
        Path, typer.Option(help="Results root; each experiment writes into OUT/NAME.")
    ] = DEFAULT_RESULTS_DIR,
) -> None:
    """Run every experiment in turn (devices ... rounds); OUT/targets.md lists every goal."""
    from globaldl.experiments import EXPERIMENTS

    reports: list[ExperimentReport | None] = []
    for name, experiment_class in EXPERIMENTS.items():

        def build(experiment_class: Any = experiment_class) -> Experiment:
            return experiment_class(quick=shared.quick, cycle_time_ms=shared.cycle_time)

        reports.append(execute(build, shared, out / name))
    if not shared.dry_run:
        with user_errors():
            path = write_targets_summary(out, [r for r in reports if r is not None], command_line())
        typer.echo(f"targets of every experiment: {path}")
    raise typer.Exit(code=exit_code(reports))


def write_targets_summary(out: Path, reports: list[ExperimentReport], command: str) -> Path:
    """OUT/targets.md: every experiment's goals, met or not, in one table."""
    from globaldl.files import write_text_atomically
    from globaldl.markdown import markdown_table

    rows = [
        {"experiment": report.name, **check.as_row()}
        for report in reports
        for check in report.targets
    ]
    text = (
        "# globaldl experiments: targets\n\n"
        f"Measured with `{command}`. Each experiment's folder has its tables and plots.\n\n"
        + markdown_table(rows, ["experiment", "goal", "status", "measured"])
    )
    out.mkdir(parents=True, exist_ok=True)
    path = out / "targets.md"
    write_text_atomically(path, text)
    return path

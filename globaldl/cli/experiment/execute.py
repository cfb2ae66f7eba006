"""What every experiment command does once it has built its experiment: plan, run, report."""

from __future__ import annotations

import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from globaldl.cli.errors import user_errors
from globaldl.cli.experiment.options import DEFAULT_RESULTS_DIR, SharedOptions

if TYPE_CHECKING:  # the experiments load matplotlib and more; --help should not wait for them
    from globaldl.experiments import Experiment, ExperimentReport, ExperimentRunner


def command_line() -> str:
    """The command as typed, for the results (`globaldl experiment ...`)."""
    args = sys.argv[1:]
    return shlex.join(["globaldl", *([] if "experiment" in args else ["experiment"]), *args])


def make_runner(name: str, shared: SharedOptions, out: Path | None = None) -> ExperimentRunner:
    """The runner for experiment `name` with the shared options (validated)."""
    from globaldl.experiments import runner as runner_module

    return runner_module.ExperimentRunner(
        out or shared.out or DEFAULT_RESULTS_DIR / name,
        state_dir=shared.state_dir or runner_module.DEFAULT_EXPERIMENT_STATE_DIR,
        prefix=shared.prefix or runner_module.DEFAULT_EXPERIMENT_PREFIX,
        subnet=shared.subnet or runner_module.DEFAULT_EXPERIMENT_SUBNET,
        busy_policy=shared.busy,
        max_reruns=shared.max_reruns,
    )


def print_plan(
    experiment: Experiment,
    runner: ExperimentRunner,
    repeats: int,
    only: Sequence[str] | None,
    resume: bool = False,
) -> None:
    """The fleets and train commands of one repeat, and what the whole schedule will take.

    With `resume`, the schedule leaves out the runs already recorded ok in the results folder.
    """
    from globaldl.experiments.progress import RunClock, earlier_run_seconds, interleave
    from globaldl.experiments.results import load_results, recorded_ok

    specs = [spec for spec in experiment.plan() if only is None or spec.label in only]
    runner.validate(specs)
    typer.echo(f"{experiment.name}: {len(specs)} runs")
    previous = None
    for index, spec in enumerate(specs, start=1):
        if spec.fleet != previous:
            typer.echo(
                "  "
                + spec.fleet.up_command(
                    prefix=runner.prefix, subnet=runner.subnet, state_dir=str(runner.state_dir)
                )
            )
            previous = spec.fleet
        typer.echo(
            f"    [{index}] {spec.label}: HOROVOD_CYCLE_TIME={runner.cycle_time_ms(spec):g} "
            f"globaldl train {shlex.join(spec.train_args)}"
        )
    recorded = load_results(runner.out_dir, specs, name=experiment.name)
    done = recorded_ok(recorded, {spec.label for spec in specs}) if resume else set()
    schedule = interleave(specs, repeats, done)
    earlier = earlier_run_seconds(recorded, specs)
    clock = RunClock(schedule, earlier)
    seconds, basis = clock.estimate(schedule)
    if seconds is None:
        estimate = f"time unknown: no earlier runs of this plan in {runner.out_dir}"
    else:
        from globaldl.experiments.progress import duration_text

        timed = len(earlier)
        guessed = f"; the other {len(specs) - timed} at the mean run" if timed < len(specs) else ""
        estimate = (
            f"about {duration_text(seconds)}, from the run times recorded in {runner.out_dir} "
            f"for {timed} of {len(specs)} labels{guessed} (fleet start-ups not included)"
        )
    left = f", {len(done)} recorded already" if done else ""
    typer.echo(f"  x {repeats} repeats, interleaved = {len(schedule)} runs{left}; {estimate}")


def print_report(report: ExperimentReport) -> None:
    """What was written, every target's status, and the runs that failed."""
    for path in report.paths:
        typer.echo(f"  wrote {path}")
    for check in report.targets:
        typer.echo(f"  target {check.status}: {check.goal} ({check.measured})")
    if report.failed_runs:
        typer.echo(
            f"  {len(report.failed_runs)} run(s) failed: "
            + ", ".join(
                f"{r.spec.label} repeat {r.repeat} ({r.status})" for r in report.failed_runs
            )
        )


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def execute(
    build: Callable[[], Experiment], shared: SharedOptions, out: Path | None = None
) -> ExperimentReport | None:
    """Build the experiment, then print its plan (--dry-run) or run it and write its outputs."""
    from globaldl.experiments import run_experiment

    with user_errors():
        experiment = build()
        runner = make_runner(experiment.name, shared, out)
        if shared.dry_run:
            print_plan(experiment, runner, shared.repeat_count, shared.labels, shared.resume)
            return None
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        typer.echo(
            f"experiment {experiment.name}: {len(experiment.plan())} runs x "
            f"{shared.repeat_count} repeats -> {runner.out_dir}"
        )
        try:
            report = run_experiment(
                experiment,
                runner,
                runner.out_dir,
                command=command_line(),
                only=shared.labels,
                repeats=shared.repeat_count,
                resume=shared.resume,
            )
        except KeyboardInterrupt:
            typer.echo(
                f"experiment {experiment.name}: interrupted; finished runs written to "
                f"{runner.out_dir} (the same command with --resume runs the rest)",
                err=True,
            )
            raise typer.Exit(code=130) from None
    print_report(report)
    return report


def exit_code(reports: Sequence[ExperimentReport | None]) -> int:
    """1 when any run failed (or was refused), else 0."""
    return 1 if any(report is not None and report.failed_runs for report in reports) else 0


def run_and_exit(
    build: Callable[[], Experiment], shared: SharedOptions, out: Path | None = None
) -> None:
    """`execute`, then exit with `exit_code`."""
    raise typer.Exit(code=exit_code([execute(build, shared, out)]))

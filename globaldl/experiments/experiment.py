"""The Experiment base class, and `run_experiment`: plan -> fleet runs -> CSV, tables, plots."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globaldl.experiments.analysis import (
    TargetCheck,
    device_tx_bytes_per_step,
    mean_step_seconds,
    training_seconds,
    wire_bytes_per_step,
)
from globaldl.experiments.cycle_time import (
    COORDINATION_BYTES_PER_CYCLE,
    CYCLE_TIME_LADDER_MS,
    HOROVOD_DEFAULT_CYCLE_TIME_MS,
    MAX_COORDINATION_SHARE,
)
from globaldl.experiments.outputs import write_csv
from globaldl.experiments.runner import ExperimentRunner, RunResult, load_results
from globaldl.experiments.spec import RunSpec


class Experiment:
    """An experiment: a plan of fleet runs, and the tables, plots and targets made from them.

    A subclass sets `name` and `title` and overrides:

    * `plan()`: every run (a list of RunSpec), runs that share a fleet next to each other;
    * `rows(results)`: the table rows (by default one per run, see `run_row`);
    * `columns`: the markdown table's columns (the CSV gets every column);
    * `plots(rows, results, out_dir)`: the PNG files it draws (optional);
    * `targets(rows, results)`: the goals it checks, as TargetChecks (optional);
    * `method()`: how the runs are built, in markdown (optional).

    Example:
        >>> class Tiny(Experiment):
        ...     name, title = "tiny", "One run"
        ...     def plan(self):
        ...         return [RunSpec("tiny", "only", FleetConfig(2, "lte", 0.5), ("--epochs", "1"))]

    """

    name: str = ""
    title: str = ""
    columns: Sequence[str] = ()

    def __init__(self, *, quick: bool = False, cycle_time_ms: float | None = None) -> None:
        if cycle_time_ms is not None and not cycle_time_ms > 0:
            raise ValueError(f"cycle_time_ms must be > 0 or None (auto), got {cycle_time_ms!r}")
        self.quick = quick
        self.cycle_time_ms = cycle_time_ms

    def plan(self) -> list[RunSpec]:
        """Every run of the experiment, in order."""
        raise NotImplementedError

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """Table rows: one per run by default."""
        return [run_row(result) for result in results]

    def plots(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult], out_dir: Path
    ) -> list[Path]:
        """Draw the experiment's PNG plots into `out_dir`; return their paths."""
        return []

    def targets(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult]
    ) -> list[TargetCheck]:
        """The goals this experiment checks."""
        return []

    def method(self) -> str:
        """How the runs are built (markdown)."""
        return ""

    def extra_outputs(self, results: Sequence[RunResult], out_dir: Path) -> list[Path]:
        """Files beyond the main CSV/JSON/markdown and the plots (e.g. a per-device CSV)."""
        return []

    def extra_markdown(self, results: Sequence[RunResult]) -> str:
        """Markdown sections beyond the main table (e.g. a per-device table)."""
        return ""

    def get_config(self) -> dict[str, Any]:
        """The experiment's options, for the results JSON."""
        return {"name": self.name, "quick": self.quick, "cycle_time_ms": self.cycle_time_ms}


def run_row(result: RunResult) -> dict[str, Any]:
    """The columns every run has: its factors, fleet, outcome and exact commands."""
    spec, summary = result.spec, result.summary
    row: dict[str, Any] = {"label": spec.label, **spec.factors}
    row.update(
        {
            "status": result.status,
            "devices": spec.fleet.devices,
            "profile": spec.fleet.profile,
            "up_kbit_per_second": result.link.up_kbit_per_second,
            "down_kbit_per_second": result.link.down_kbit_per_second,
            "cpu_cores_per_device": spec.fleet.cpu_cores_per_device,
            "cpu_cores_total": spec.fleet.cpu_cores_total,
            "horovod_cycle_time_ms": result.cycle_time_ms,
            "latency_emulated": result.latency_emulated,
        }
    )
    if summary is not None:
        row.update(
            {
                "ranks": summary["ranks"],
                "epochs": len(summary.get("history", [])),
                "steps_per_rank": summary["steps"],
                "global_batch_size": summary["global_batch_size"],
                "val_accuracy": summary["val_accuracy"],
                "training_seconds": training_seconds(summary),
                "wall_seconds": summary["wall_seconds"],
                "mean_step_seconds": mean_step_seconds(summary),
                "wire_bytes_per_step": wire_bytes_per_step(summary),
                "device_tx_bytes_per_step": device_tx_bytes_per_step(result.accounting, summary),
                "compression_ratio": summary.get("compression_ratio"),
            }
        )
    if result.accounting is not None:
        row["coordination_tx_bytes_per_second"] = result.accounting.get("extra_tx_bytes_per_second")
    row["run_seconds"] = result.run_seconds
    row["train_command"] = result.train_command
    row["fleet_command"] = result.fleet_command
    return row


@dataclass
class ExperimentReport:
    """What `run_experiment` wrote and found."""

    name: str
    results: list[RunResult]
    rows: list[dict[str, Any]]
    targets: list[TargetCheck]
    paths: list[Path] = field(default_factory=list)
    complete: bool = True

    @property
    def failed_runs(self) -> list[RunResult]:
        """Runs that did not finish with a summary."""
        return [result for result in self.results if not result.ok]


def link_notes(results: Sequence[RunResult]) -> str:
    """What the fleet emulated and what it did not (latency), and the cycle times used."""
    emulated = {result.latency_emulated for result in results}
    delayed = any(result.link.impaired for result in results)
    if not delayed:
        latency = "The links shape rates only (tc tbf, layer-2 bytes); no profile adds delay."
    elif emulated == {True}:
        latency = (
            "Delay, jitter and loss of the profiles were emulated in user space (vde2 wirefilter "
            "between switches; globaldl/fleet/vde.py), rates shaped with tc tbf; the forwarding "
            "processes ran in the fleet's `emulation` cgroup, outside the devices' CPU quotas."
        )
    else:
        latency = (
            "**Delay is NOT emulated in every run**: where the fleet could not emulate links "
            "(column `latency_emulated` false) it shaped RATES only (tc tbf, layer-2 bytes). "
            "Profiles keep their names, but no one-way delay, jitter or loss was added there."
        )
    cycles = sorted({result.cycle_time_ms for result in results})
    cycle_text = ", ".join(f"{value:g} ms" for value in cycles) or "none"
    return (
        f"{latency}\n\n"
        f"HOROVOD_CYCLE_TIME used: {cycle_text} (column `horovod_cycle_time_ms`). Horovod's "
        f"default is {HOROVOD_DEFAULT_CYCLE_TIME_MS:g} ms, and its coordination sends about "
        f"{COORDINATION_BYTES_PER_CYCLE} bytes per device per cycle even when idle (measured on "
        "this fleet: 185 kB/s at 1 ms, 40 kB/s at 10 ms, 19 kB/s at 20 ms, 8 kB/s at 50 ms), "
        "more than a slow-4G uplink at 1 ms; a longer cycle delays every collective instead. "
        "Unless a run says otherwise, the cycle time is chosen per link: the shortest of "
        f"{', '.join(f'{value:g}' for value in CYCLE_TIME_LADDER_MS)} ms that keeps idle "
        f"coordination under {MAX_COORDINATION_SHARE:.0%} of the narrower direction "
        "(globaldl/experiments/cycle_time.py). `coordination_tx_bytes_per_second` is what each "
        "device's interface sent beyond the ring-allreduce share of the gradients, over the "
        "whole run (fleet byte accounting)."
    )


def _targets_markdown(checks: Sequence[TargetCheck]) -> str:
    from globaldl.bench.results import markdown_table

    if not checks:
        return ""
    return "## Targets (reported, never asserted)\n\n" + markdown_table(
        [check.as_row() for check in checks], ["goal", "status", "measured"]
    )


def run_experiment(
    experiment: Experiment,
    runner: ExperimentRunner,
    out_dir: Path,
    command: str = "",
    only: Sequence[str] | None = None,
) -> ExperimentReport:
    """Run the experiment's plan on the fleet, then write CSV, JSON, markdown and plots.

    With `only` (run labels) just those runs run; the outputs also take every other run of
    the plan already in `out_dir` (to re-run one failed or disturbed run). Whatever ran is
    written even when a run or the fleet fails, or the user interrupts; the exception then
    propagates after the outputs are written (marked incomplete).
    """
    specs = experiment.plan()
    chosen = specs
    if only is not None:
        unknown = sorted(set(only) - {spec.label for spec in specs})
        if unknown:
            raise ValueError(
                f"no run labelled {', '.join(unknown)} in {experiment.name}; its runs: "
                f"{', '.join(spec.label for spec in specs)}"
            )
        chosen = [spec for spec in specs if spec.label in only]
    # Refusals (a bad plan, a fleet already up) come before anything is run or written.
    runner.validate(chosen)
    runner.check_no_fleet_up()
    kept = load_results(out_dir, [spec for spec in specs if spec not in chosen])
    fresh: list[RunResult] = []
    complete = False
    try:
        runner.run(chosen, collected=fresh)
        complete = True
    finally:
        by_label = {result.spec.label: result for result in [*kept, *fresh]}
        results = [by_label[spec.label] for spec in specs if spec.label in by_label]
        report = write_outputs(experiment, results, out_dir, command, complete=complete)
    return report


def write_outputs(
    experiment: Experiment,
    results: list[RunResult],
    out_dir: Path,
    command: str = "",
    *,
    complete: bool = True,
) -> ExperimentReport:
    """Write `<name>.csv`, `<name>.json`, `<name>.md` and the plots into `out_dir`."""
    from globaldl.bench.results import write_results

    out_dir = Path(out_dir)
    rows = experiment.rows(results)
    checks = experiment.targets(rows, results) if results else []
    plot_paths = experiment.plots(rows, results, out_dir) if rows else []
    csv_path = write_csv(out_dir / f"{experiment.name}.csv", rows)
    extra_paths = experiment.extra_outputs(results, out_dir)
    sections = []
    if not complete:
        sections.append(
            f"**Incomplete**: {len(results)} of {len(experiment.plan())} runs finished before "
            "the experiment stopped."
        )
    if checks:
        sections.append(_targets_markdown(checks))
    if plot_paths:
        sections.append(
            "## Plots\n\n" + "\n".join(f"![{path.stem}]({path.name})" for path in plot_paths)
        )
    if experiment.method():
        sections.append("## How the runs are built\n\n" + experiment.method())
    if experiment.extra_markdown(results):
        sections.append(experiment.extra_markdown(results))
    if results:
        sections.append("## The links\n\n" + link_notes(results))
    sections.append(
        f"Every run's exact `globaldl train` and `globaldl fleet run` commands are in "
        f"`{csv_path.name}`; each run's summary, byte accounting and log are in `runs/<label>/`."
    )
    json_path, md_path = write_results(
        out_dir,
        experiment.name,
        experiment.title,
        rows,
        notes="\n\n".join(sections),
        command=command,
        columns=[column for column in experiment.columns if any(column in row for row in rows)]
        or None,
        extra={
            "experiment": experiment.get_config(),
            "complete": complete,
            "targets": [check.as_row() for check in checks],
            "runs": [result.to_dict() for result in results],
        },
    )
    return ExperimentReport(
        name=experiment.name,
        results=results,
        rows=rows,
        targets=checks,
        paths=[csv_path, json_path, md_path, *extra_paths, *plot_paths],
        complete=complete,
    )

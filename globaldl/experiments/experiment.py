"""The Experiment base class, and `run_experiment`: plan -> repeated fleet runs -> tables, plots.

Outputs of an experiment NAME in its folder: `NAME.csv` (one row per run label: medians over
the repeats, with `<column>_min`/`<column>_max` where repeats differ), `NAME-runs.csv` (one
row per run, repeats and machine load included), `NAME.md` (the table as `median [min-max]`,
the targets evaluated on medians, the protocol and the load of every run), `NAME.json`
(everything, each run's summary included) and the PNG plots.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globaldl.experiments.aggregate import aggregate_rows, presented
from globaldl.experiments.analysis import (
    TargetCheck,
    add_traffic_ratios,
    device_tx_bytes_per_step,
    mean_step_seconds,
    training_seconds,
    wire_bytes_per_step,
)
from globaldl.experiments.outputs import write_csv
from globaldl.experiments.results import RunResult, load_results, portable, recorded_ok
from globaldl.experiments.runner import ExperimentRunner
from globaldl.experiments.sections import (
    link_notes,
    load_columns,
    load_markdown,
    protocol_markdown,
    protocol_record,
    targets_markdown,
)
from globaldl.experiments.spec import RunSpec


class Experiment:
    """An experiment: a plan of fleet runs, and the tables, plots and targets made from them.

    A subclass sets `name` and `title` and overrides:

    * `plan()`: the runs of ONE repeat (a list of RunSpec), runs that share a fleet next to
      each other; the runner repeats the plan (interleaved) and records the machine's load;
    * `rows(results)`: one row per run, repeats included (by default `run_row`);
    * `aggregate(rows)`: the table rows, one per label (by default the median of each
      measured column over the finished repeats, with its min-max; see aggregate.py);
    * `columns`: the markdown table's columns (the CSVs get every column);
    * `plots(rows, results, out_dir)`: the PNG files it draws from the aggregated rows
      (optional; `row_spread` gives a median with its range for error bars);
    * `targets(rows, results)`: the goals it checks on the aggregated rows, i.e. on medians,
      as TargetChecks (optional);
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
        """The runs of one repeat of the experiment, in order."""
        raise NotImplementedError

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per run (repeats included)."""
        return [run_row(result) for result in results]

    def aggregate(self, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The table: one row per label, medians with their min-max over the repeats."""
        return aggregate_rows(rows)

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
    row: dict[str, Any] = {"label": spec.label, **spec.factors, "repeat": result.repeat}
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
        traffic = summary.get("traffic") or {}
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
                "device_tx_bytes_per_step_model": traffic.get("device_tx_bytes_per_step_model"),
                "compression_ratio": summary.get("compression_ratio"),
                "traffic_ratio_vs_dense_model": traffic.get("traffic_ratio_vs_dense"),
            }
        )
    if result.accounting is not None:
        # Older accountings applied the ring-allreduce factor to every run: not shown.
        row["coordination_payload_bytes_per_second"] = result.accounting.get(
            "coordination_payload_bytes_per_second"
        )
    row["run_seconds"] = result.run_seconds
    row.update(load_columns(result))
    row["train_command"] = portable(result.train_command)
    row["fleet_command"] = portable(result.fleet_command)
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


def run_experiment(
    experiment: Experiment,
    runner: ExperimentRunner,
    out_dir: Path,
    command: str = "",
    only: Sequence[str] | None = None,
    repeats: int = 1,
    resume: bool = False,
) -> ExperimentReport:
    """Run the experiment's plan `repeats` times (interleaved), then write its outputs.

    With `only` (run labels) just those runs run (every repeat); the outputs also take every
    other run of the plan already in `out_dir` (to re-run one failed or disturbed run), and
    the recorded command keeps the one those runs came from (`EARLIER; then COMMAND`).
    With `resume` a run (label and repeat) already recorded `ok` in `out_dir` is kept, not
    run again: an experiment longer than a sitting runs in parts, each stopped (interrupted)
    where its time ends and resumed in order by the next.
    Whatever ran is written even when a run or the fleet fails, or the user interrupts; the
    exception then propagates after the outputs are written (marked incomplete).
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
    recorded = load_results(out_dir, specs, name=experiment.name)
    chosen_labels = {spec.label for spec in chosen}
    done = recorded_ok(recorded, chosen_labels) if resume else set()
    kept = [
        result
        for result in recorded
        if result.spec.label not in chosen_labels or (result.spec.label, result.repeat) in done
    ]
    if (only is not None or resume) and kept:
        command = _with_earlier_command(out_dir / f"{experiment.name}.json", command)
    fresh: list[RunResult] = []
    complete = False
    try:
        runner.run(chosen, collected=fresh, repeats=repeats, earlier=recorded, done=done)
        complete = True
    finally:
        position = {spec.label: index for index, spec in enumerate(specs)}
        results = sorted(
            [*kept, *fresh], key=lambda result: (result.repeat, position[result.spec.label])
        )
        report = write_outputs(
            experiment,
            results,
            out_dir,
            command,
            complete=complete,
            protocol=protocol_record(runner, repeats),
        )
    return report


def _with_earlier_command(document_path: Path, command: str) -> str:
    """`EARLIER; then COMMAND` when the folder's document names the command of its runs."""
    if not document_path.exists():
        return command
    earlier = json.loads(document_path.read_text()).get("command") or ""
    return f"{earlier}; then {command}" if earlier and earlier != command else command


def run_machines(results: Sequence[RunResult]) -> list[tuple[dict[str, Any], list[str]]]:
    """Each machine the runs recorded, with its runs as LABEL/repeat-K, in first-run order."""
    machines: list[tuple[dict[str, Any], list[str]]] = []
    for result in results:
        if result.machine is None:
            continue
        name = f"{result.spec.label}/repeat-{result.repeat}"
        for machine, runs in machines:
            if machine == result.machine:
                runs.append(name)
                break
        else:
            machines.append((dict(result.machine), [name]))
    return machines


def machines_markdown(machines: Sequence[tuple[dict[str, Any], list[str]]]) -> str:
    """Which run was taken on which machine, and what that means for comparing them."""
    lines = [
        "## Machines",
        "",
        f"These runs were taken on {len(machines)} machines. Times (seconds, steps, "
        "throughput) compare only between runs of one machine; accuracies of the same seeded "
        "run may differ between machines by floating point.",
        "",
    ]
    for index, (machine, runs) in enumerate(machines, start=1):
        description = ", ".join(f"{key} {value}" for key, value in machine.items())
        lines.append(f"{index}. {description}: {', '.join(runs)}")
    return "\n".join(lines)


def write_outputs(
    experiment: Experiment,
    results: list[RunResult],
    out_dir: Path,
    command: str = "",
    *,
    complete: bool = True,
    protocol: dict[str, Any] | None = None,
    machine: dict[str, Any] | None = None,
) -> ExperimentReport:
    """Write `<name>.csv`, `<name>-runs.csv`, `<name>.json`, `<name>.md` and the plots.

    `machine` describes where the runs were taken (default: the machine the runs recorded,
    else this machine). Runs taken on several machines get a section that says which ran
    where: their times do not compare across machines.
    """
    from globaldl.bench.results import write_results

    out_dir = Path(out_dir)
    run_rows = experiment.rows(results)
    rows = experiment.aggregate(run_rows)
    # Ratios of medians: the dense run's device bytes per step over each run's, same fleet.
    add_traffic_ratios(rows)
    checks = experiment.targets(rows, results) if results else []
    plot_paths = experiment.plots(rows, results, out_dir) if rows else []
    csv_path = write_csv(out_dir / f"{experiment.name}.csv", rows)
    runs_csv_path = write_csv(out_dir / f"{experiment.name}-runs.csv", run_rows)
    extra_paths = experiment.extra_outputs(results, out_dir)
    repeats = (protocol or {}).get("repeats") or max((r.repeat for r in results), default=1)
    sections = []
    if not complete:
        sections.append(
            f"**Incomplete**: {len(results)} of {len(experiment.plan()) * repeats} runs "
            "finished before the experiment stopped."
        )
    if checks:
        sections.append(targets_markdown(checks))
    if plot_paths:
        sections.append(
            "## Plots\n\n" + "\n".join(f"![{path.stem}]({path.name})" for path in plot_paths)
        )
    if experiment.method():
        sections.append("## How the runs are built\n\n" + experiment.method())
    if experiment.extra_markdown(results):
        sections.append(experiment.extra_markdown(results))
    machines = run_machines(results)
    if len(machines) > 1:
        sections.append(machines_markdown(machines))
        machine = {"runs taken on": f"{len(machines)} machines (see Machines below)"}
    elif machines:
        machine = machines[0][0]
    if results:
        sections.append(protocol_markdown(results, protocol))
        if load_markdown(run_rows):
            sections.append(load_markdown(run_rows))
        sections.append("## The links\n\n" + link_notes(results))
    sections.append(
        f"`{csv_path.name}` holds the medians and ranges, `{runs_csv_path.name}` every run with "
        "its exact `globaldl train` and `globaldl fleet run` commands and its machine load; "
        "each run's summary, byte accounting and log are in `runs/<label>/repeat-<k>/`."
    )
    columns = [column for column in experiment.columns if any(column in row for row in rows)]
    if columns:
        columns += ["repeats", "busy_repeats"]
    json_path, md_path = write_results(
        out_dir,
        experiment.name,
        experiment.title,
        rows,
        notes="\n\n".join(sections),
        command=portable(command),
        columns=columns or None,
        markdown_rows=presented(rows, columns or list(rows[0]) if rows else []),
        machine=machine,
        # Every run's record (summaries included): indented it outgrew 2 MiB at 59 runs. Each
        # run's table row is in `<name>-runs.csv` and derives from its record, so it is not
        # here again (with it, 84 runs outgrew 2 MiB compact).
        json_indent=None,
        extra={
            "experiment": experiment.get_config(),
            "complete": complete,
            "protocol": protocol,
            "targets": [check.as_row() for check in checks],
            "runs": [result.to_dict() for result in results],
            **(
                {"machines": [{**found, "runs": runs} for found, runs in machines]}
                if len(machines) > 1
                else {}
            ),
        },
    )
    return ExperimentReport(
        name=experiment.name,
        results=results,
        rows=rows,
        targets=checks,
        paths=[csv_path, runs_csv_path, json_path, md_path, *extra_paths, *plot_paths],
        complete=complete,
    )

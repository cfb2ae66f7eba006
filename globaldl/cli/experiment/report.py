"""`globaldl experiment report NAME`: rebuild an experiment's outputs from its recorded runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.errors import user_errors
from globaldl.cli.experiment.execute import print_report
from globaldl.cli.experiment.options import DEFAULT_RESULTS_DIR


def report(
    name: Annotated[
        str,
        typer.Argument(help="devices, resources, ablation, bottleneck, recovery or balance."),
    ],
    quick: Annotated[bool, typer.Option("--quick", help="Use the quick plan's settings.")] = False,
    out: Annotated[
        Path | None, typer.Option(help="Results folder [default: results/experiments/NAME].")
    ] = None,
) -> None:
    """Rewrite an experiment's tables and plots from the runs in its folder; nothing runs.

    The runs come from OUT/runs/ (every repeat), or, in a clone without them, from the runs
    recorded in OUT/NAME.json; every recorded run is used, also of labels the current plan
    no longer has. Paths in the rewritten files are relative to the repository; the machine
    description stays the one the runs were taken on.
    """
    from globaldl.experiments import get, write_outputs
    from globaldl.experiments.results import load_results

    with user_errors():
        experiment = get(name, quick=quick)
        out_dir = out or DEFAULT_RESULTS_DIR / name
        results = load_results(out_dir, experiment.plan(), name=name, unplanned=True)
        if not results:
            raise ValueError(f"no run results of {name} in {out_dir / 'runs'} or {name}.json")
        previous_path = out_dir / f"{name}.json"
        previous = json.loads(previous_path.read_text()) if previous_path.exists() else {}
        planned = [spec.label for spec in experiment.plan()]
        done = {result.spec.label for result in results} & set(planned)
        written = write_outputs(
            experiment,
            results,
            out_dir,
            previous.get("command", ""),
            complete=previous.get("complete", len(done) == len(planned)),
            protocol=previous.get("protocol"),
            machine=previous.get("machine"),
        )
    typer.echo(f"{name}: {len(results)} runs, {len(done)} of {len(planned)} labels of the plan")
    print_report(written)

"""`globaldl experiment report NAME`: rebuild an experiment's outputs from its recorded runs."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from globaldl.cli.errors import user_errors
from globaldl.cli.experiment.execute import print_report
from globaldl.cli.experiment.options import DEFAULT_RESULTS_DIR


def report(
    name: Annotated[
        str,
        typer.Argument(
            help="devices, resources, ablation, bottleneck, recovery, balance, scaling, learning "
            "or rounds."
        ),
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
    description stays the one the runs were taken on, and the experiment is rebuilt with the
    options its runs were planned with (NAME.json's `experiment`: a chaos run of 7 trials is
    judged against 7 trials per repeat, not the default 20).
    """
    from globaldl.experiments import get, write_outputs
    from globaldl.experiments.results import load_results

    with user_errors():
        out_dir = out or DEFAULT_RESULTS_DIR / name
        previous_path = out_dir / f"{name}.json"
        previous = json.loads(previous_path.read_text()) if previous_path.exists() else {}
        experiment = get(name, quick=quick, **recorded_options(name, previous))
        results = load_results(out_dir, experiment.plan(), name=name, unplanned=True)
        if not results:
            raise ValueError(f"no run results of {name} in {out_dir / 'runs'} or {name}.json")
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


PLAIN = (str, int, float, bool)
"""The option values a results document records that a constructor takes as they are."""


def recorded_options(name: str, document: dict[str, Any]) -> dict[str, Any]:
    """The plain options (text, numbers, flags) of the experiment a results document recorded.

    Only those its constructor takes; `quick` stays the command line's. Derived entries
    (a chaos schedule, learning workloads) are rebuilt by the constructor from these.
    """
    from globaldl.experiments import EXPERIMENTS

    recorded = document.get("experiment") or {}
    if name not in EXPERIMENTS or recorded.get("name", name) != name:
        return {}
    accepted = inspect.signature(EXPERIMENTS[name].__init__).parameters
    return {
        key: value
        for key, value in recorded.items()
        if key in accepted
        and key != "quick"
        and _plain(accepted[key].default)
        and (value is None or isinstance(value, PLAIN))
    }


def _plain(default: Any) -> bool:
    """Whether a parameter takes plain values (text, numbers, flags, None by default).

    A recorded `workload: lenet` is a name, not the Workload object the constructor expects,
    so such options keep their default.
    """
    return default is inspect.Parameter.empty or default is None or isinstance(default, PLAIN)

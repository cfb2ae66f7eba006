"""`globaldl bench`: benchmarks that write JSON and a markdown table into a results folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.errors import user_errors

app = typer.Typer(help="Benchmarks: numbers written as JSON and markdown, never asserted by tests.",
                  no_args_is_help=True)

DEFAULT_OUT = Path("results/bench")


@app.command()
def timing(
    model: Annotated[str, typer.Option(help="Model to time.")] = "lenet",
    dataset: Annotated[str, typer.Option(help="Dataset to time.")] = "mnist",
    batch_size: Annotated[int, typer.Option(help="Batch size.")] = 16,
    steps: Annotated[int, typer.Option(help="Steps per measurement.")] = 200,
    repeats: Annotated[int, typer.Option(help="Measurements per variant (median reported).")] = 5,
    out: Annotated[Path, typer.Option(help="Results folder.")] = DEFAULT_OUT,
) -> None:
    """What the per-phase timestamps cost: the same step with and without them."""
    with user_errors():
        from globaldl.bench.results import write_results
        from globaldl.bench.timing import measure_timing_cost
        from globaldl.settings import TrainSettings

        settings = TrainSettings(model=model, dataset=dataset, batch_size=batch_size)
        rows = [measure_timing_cost(settings, steps, repeats)]
        command = (f"globaldl bench timing --model {model} --dataset {dataset} "
                   f"--batch-size {batch_size} --steps {steps} --repeats {repeats}")
        _, md_path = write_results(out, "timing", "Cost of phase timing", rows, command=command,
                                   notes="One process; the step is the full training step.")
        typer.echo(md_path.read_text())

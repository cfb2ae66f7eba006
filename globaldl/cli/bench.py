"""`globaldl bench`: benchmarks that write JSON and a markdown table into a results folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.errors import user_errors

app = typer.Typer(
    help="Benchmarks: numbers written as JSON and markdown, never asserted by tests.",
    no_args_is_help=True,
)

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
        command = (
            f"globaldl bench timing --model {model} --dataset {dataset} "
            f"--batch-size {batch_size} --steps {steps} --repeats {repeats}"
        )
        _, md_path = write_results(
            out,
            "timing",
            "Cost of phase timing",
            rows,
            command=command,
            notes="One process; the step is the full training step.",
        )
        typer.echo(md_path.read_text())


@app.command()
def compression(
    batch_size: Annotated[int, typer.Option(help="Batch size of the real gradients.")] = 32,
    repeats: Annotated[int, typer.Option(help="Timed repetitions per measurement (median).")] = 20,
    accuracy_epochs: Annotated[
        int,
        typer.Option(help="Epochs of the dense vs recommended-preset accuracy check (0: skip)."),
    ] = 3,
    out: Annotated[Path, typer.Option(help="Results folder.")] = DEFAULT_OUT,
) -> None:
    """Ratio of dense fp32 bytes to wire bytes, and codec time as a share of compute time."""
    with user_errors():
        from globaldl.bench.compression import run_accuracy_check, run_codec_benchmark
        from globaldl.bench.results import write_results

        rows = run_codec_benchmark(batch_size, repeats)
        accuracy = run_accuracy_check(accuracy_epochs) if accuracy_epochs > 0 else []
        resnet_300x = [
            r
            for r in rows
            if r["workload"] == "resnet20"
            and r["prune"] == "topk"
            and r["density"] == 0.001
            and r["quantize"] != "none"
            and r["ratio"] >= 300
        ]
        met_by = (
            "met by " + ", ".join(r["quantize"] for r in resnet_300x) if resnet_300x else "NOT met"
        )
        notes = [
            "codec_ms = compress on one rank + decompress of two ranks' payloads, one tf.function;",
            "compute_ms = forward + backward of one batch. Targets: top-k 0.1% + a quantizer",
            f">= 300x on ResNet-20 ({met_by});",
            "codec time <= 10% of compute; recommended preset within 1 point of dense on MNIST.",
        ]
        if accuracy:
            from globaldl.bench.results import markdown_table

            loss_points = 100 * (accuracy[0]["val_accuracy"] - accuracy[1]["val_accuracy"])
            notes += [
                "",
                "## Accuracy, LeNet on MNIST, 2 Horovod ranks",
                "",
                markdown_table(accuracy),
                f"The recommended preset is {loss_points:.1f} points below dense "
                f"({'within' if loss_points <= 1.0 else 'NOT within'} 1 point).",
            ]
        command = (
            f"globaldl bench compression --batch-size {batch_size} --repeats {repeats} "
            f"--accuracy-epochs {accuracy_epochs}"
        )
        _, md_path = write_results(
            out,
            "compression",
            "Compression: bytes and codec time",
            rows,
            notes="\n".join(notes),
            command=command,
            extra={"accuracy": accuracy},
        )
        typer.echo(md_path.read_text())


@app.command()
def links(
    repeats: Annotated[int, typer.Option(help="Interleaved repeats (medians reported).")] = 3,
    seconds: Annotated[float, typer.Option(help="Bulk transfer time per measurement.")] = 5.0,
    profiles: Annotated[
        str | None,
        typer.Option(
            help="Profiles, comma-separated [default: fibre,lte,slow-4g,lte-m,geo-satellite,"
            "nb-iot]."
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Results folder.")] = DEFAULT_OUT,
) -> None:
    """Every profile's emulated link (round trip, loss, rate) against the profile; its CPU cost."""
    with user_errors():
        from globaldl.bench.links import COLUMNS, NOTES, PROFILES, measure_links
        from globaldl.bench.results import write_results

        chosen = tuple(p.strip() for p in profiles.split(",")) if profiles else PROFILES
        rows = measure_links(chosen, repeats=repeats, seconds=seconds)
        met = all(row["within_10_percent"] for row in rows)
        command = f"globaldl bench links --repeats {repeats} --seconds {seconds:g}" + (
            f" --profiles {','.join(chosen)}" if profiles else ""
        )
        _, md_path = write_results(
            out,
            "links",
            "Emulated links against their profiles, and the CPU they cost",
            rows,
            notes=NOTES + f"\n\nTarget (all within 10%): {'met' if met else 'NOT met'}.",
            command=command,
            columns=COLUMNS,
        )
        typer.echo(md_path.read_text())

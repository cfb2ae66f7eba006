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
def simulate(
    devices: Annotated[str, typer.Option(help="Device counts to time.")] = "100,1000,3000,10000",
    mix: Annotated[str, typer.Option(help="Link mix of the projection.")] = (
        "lte:60,lte-m:30,nb-iot:10"
    ),
    model: Annotated[str, typer.Option(help="Model of the projection.")] = "lenet",
    steps: Annotated[int, typer.Option(help="Steps per projection (at most).")] = 100,
    repeats: Annotated[int, typer.Option(help="Interleaved repeats (median reported).")] = 3,
    out: Annotated[Path, typer.Option(help="Results folder.")] = DEFAULT_OUT,
) -> None:
    """What `globaldl simulate project` costs per device count (target: 10,000 in < 10 min)."""
    with user_errors():
        from globaldl.bench.results import write_results
        from globaldl.bench.simulate import COLUMNS, measure_projection_cost, target_verdict
        from globaldl.simulate.fleetdata import load_observations
        from globaldl.simulate.outputs import DEFAULT_OUT_DIR, PARAMETERS_FILE, read_parameters
        from globaldl.simulate.platform import default_profiles, load_mixes, resolve_mix
        from globaldl.simulate.projection import ProjectionRequest

        profiles = default_profiles()
        counts = tuple(int(part) for part in devices.split(","))
        request = ProjectionRequest(
            devices=counts,
            mix=resolve_mix(mix, profiles, load_mixes()),
            model=model,
            site_size=50,
            site_profile=profiles["fibre"],
            steps=steps,
        )
        rows = measure_projection_cost(
            request,
            load_observations(),
            read_parameters(DEFAULT_OUT_DIR / PARAMETERS_FILE),
            profiles,
            repeats,
            progress=lambda message: typer.echo(f"[bench] {message}", err=True),
        )
        command = (
            f"globaldl bench simulate --devices {devices} --mix {mix} --model {model} "
            f"--steps {steps} --repeats {repeats}"
        )
        notes = [
            "Every exchange mode (dense, fp16-sum, gather, hierarchical with sites of 50, local",
            "H=8) projected per count; CPU seconds include the SimGrid child processes;",
            "growth_exponent_from_previous: cost ~ devices^exponent between consecutive counts.",
            target_verdict(rows) + ".",
        ]
        _, md_path = write_results(
            out,
            "simulate",
            "Projection cost per device count",
            rows,
            "\n".join(notes),
            command,
            columns=COLUMNS,
        )
        typer.echo(md_path.read_text())

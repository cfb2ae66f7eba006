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
    workloads: Annotated[
        str, typer.Option(help="Models to measure, comma-separated: lenet, resnet20.")
    ] = "lenet,resnet20",
    out: Annotated[Path, typer.Option(help="Results folder.")] = DEFAULT_OUT,
) -> None:
    """Ratio of dense fp32 bytes to wire bytes, and codec time as a share of compute time."""
    with user_errors():
        from globaldl.bench.compression import (
            model_summaries,
            run_accuracy_check,
            run_codec_benchmark,
        )
        from globaldl.bench.results import write_results

        names = [name.strip() for name in workloads.split(",") if name.strip()]
        rows = run_codec_benchmark(batch_size, repeats, names)
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
            "codec_seconds_per_step = compress on one rank + decompress of two ranks' payloads,",
            "one tf.function (median of the repeats, min-max beside it); compute_seconds_per_step",
            "= forward + backward of one batch (median). Targets: top-k 0.1% + a quantizer",
            f">= 300x on ResNet-20 ({met_by}); codec time <= 10% of compute for every",
            "combination (codec_within_target), and for the pruned ones <= 10% on ResNet-20 and",
            "<= 25% on LeNet; recommended preset within 1 point of dense on MNIST.",
            "",
            *(f"- {line}" for line in model_summaries(rows)),
        ]
        if accuracy:
            from globaldl.markdown import markdown_table

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
            f"--accuracy-epochs {accuracy_epochs} --workloads {','.join(names)}"
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


def _numbers(option: str, text: str) -> list[float]:
    """`1,5,20` -> [1.0, 5.0, 20.0]; ValueError naming the option otherwise."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r} must be numbers separated by commas") from None
    if not values or not all(value > 0 for value in values):
        raise ValueError(f"{option} {text!r} must list numbers > 0")
    return values


@app.command()
def coordination(
    devices: Annotated[
        str, typer.Option(help="Device counts, comma-separated (a fleet each).")
    ] = "2,4,8",
    cycle_times_ms: Annotated[
        str, typer.Option(help="HOROVOD_CYCLE_TIME values in ms, comma-separated.")
    ] = "1,5,20,50",
    cpu: Annotated[float, typer.Option(help="CPU cores per device.")] = 0.25,
    repeats: Annotated[int, typer.Option(help="Repeats per point (median, min-max).")] = 3,
    idle_seconds: Annotated[float, typer.Option(help="Idle window per measurement, s.")] = 8.0,
    out: Annotated[Path, typer.Option(help="Results folder.")] = DEFAULT_OUT,
) -> None:
    """Horovod's idle coordination per device: bytes per second and per cycle, on the fleet.

    Also the byte accounting's calibration (launch and init bytes per device), committed as
    coordination.json, where `fleet run` finds it. Needs root; about 25 s per measurement.
    """
    with user_errors():
        from globaldl.bench import coordination as bench
        from globaldl.bench.results import write_results

        counts = [int(value) for value in _numbers("--devices", devices)]
        cycles = _numbers("--cycle-times-ms", cycle_times_ms)
        measured = bench.run_coordination_bench(
            device_counts=counts,
            cycle_times_ms=cycles,
            cpu_cores_per_device=cpu,
            repeats=repeats,
            idle_seconds=idle_seconds,
            progress=typer.echo,
        )
        rows = [bench.summarise(measured[key]) for key in sorted(measured)]
        check = bench.coordination_rule_check(rows)
        plot_path = bench.plot(rows, out / "coordination.png")
        command = (
            f"globaldl bench coordination --devices {devices} --cycle-times-ms {cycle_times_ms} "
            f"--cpu {cpu:g} --repeats {repeats} --idle-seconds {idle_seconds:g}"
        )
        notes = [
            f"Each device on an unshaped link (`{bench.PROFILE}`), {cpu:g} cores, Horovod's core "
            f"started by the probe and left idle for {idle_seconds:g} s; rank 0's timeline counts "
            "the cycles. Bytes per second are frames on each device's uplink (headers "
            "included), the mean over devices; bytes per cycle divide by the cycles counted; "
            "`cycles_on_time_share` below 1 means the loop ran late (a busy CPU). Medians of "
            f"{repeats} interleaved repeats, min-max beside them; `load_average_1min_max` is the "
            "machine's highest 1-minute load average during a point's repeats.",
            "",
            f"Target: {check['goal']}: **{check['status']}** ({check['measured']}).",
            "",
            f"![coordination]({plot_path.name})",
        ]
        _, md_path = write_results(
            out,
            "coordination",
            "Horovod's idle coordination per device",
            rows,
            notes="\n".join(notes),
            command=command,
            columns=[
                "devices",
                "horovod_cycle_time_ms",
                "tx_bytes_per_second_per_device",
                "tx_bytes_per_second_per_device_min",
                "tx_bytes_per_second_per_device_max",
                "max_tx_bytes_per_cycle",
                "payload_bytes_per_cycle_per_device",
                "cycles_on_time_share",
                "launch_payload_bytes",
                "load_average_1min_max",
            ],
            extra={
                "target": check,
                "calibrations": [
                    bench.median_calibration(measured[key]).to_dict() for key in sorted(measured)
                ],
                "measurements": [m.to_dict() for key in sorted(measured) for m in measured[key]],
            },
        )
        typer.echo(md_path.read_text())


@app.command()
def batchnorm(
    ranks: Annotated[int, typer.Option(help="Horovod ranks on this machine.")] = 2,
    models: Annotated[str, typer.Option(help="resnet-8 and/or resnet-20, comma-separated.")] = (
        "resnet-8,resnet-20"
    ),
    cycle_times_ms: Annotated[
        str, typer.Option(help="HOROVOD_CYCLE_TIME values to measure at, comma-separated.")
    ] = "1,5,20",
    steps: Annotated[int, typer.Option(help="Timed steps per variant and launch.")] = 30,
    repeats: Annotated[int, typer.Option(help="Interleaved repeats (median reported).")] = 3,
    batch_size: Annotated[int, typer.Option(help="Local batch per rank.")] = 16,
    round_trip_ms: Annotated[
        float, typer.Option(help="Round trip for the least-added-time column.")
    ] = 100.0,
    out: Annotated[Path, typer.Option(help="Results folder.")] = DEFAULT_OUT,
) -> None:
    """Synchronised batch norm against averaged moving statistics: step time, collectives."""
    with user_errors():
        from globaldl.bench.batchnorm import BatchNormBench, run_and_write

        bench = BatchNormBench(
            ranks=ranks,
            models=tuple(part.strip() for part in models.split(",") if part.strip()),
            cycle_times_ms=tuple(_numbers("--cycle-times-ms", cycle_times_ms)),
            steps=steps,
            repeats=repeats,
            batch_size=batch_size,
            round_trip_ms=round_trip_ms,
        )
        paths = run_and_write(bench, out, progress=typer.echo)
        typer.echo(paths[1].read_text())


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
        counts = tuple(int(value) for value in _numbers("--devices", devices))
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
            f"Every exchange mode ({', '.join(request.modes)}; hierarchical with sites of 50,",
            f"local with H={request.local_steps}) projected per count; CPU seconds include the",
            "SimGrid child processes;",
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

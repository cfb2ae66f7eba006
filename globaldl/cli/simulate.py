"""`globaldl simulate`: calibrate the SimGrid model on fleet runs, project to many devices."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from globaldl.cli.errors import user_errors

app = typer.Typer(
    help="Project training to 1,000-10,000 devices on SimGrid, calibrated on the fleet's runs.",
    no_args_is_help=True,
)

OutDir = Annotated[
    Path | None, typer.Option("--out", help="output folder (default: results/projection)")
]


def _progress(message: str) -> None:
    typer.echo(f"[simulate] {message}", err=True)


def _command() -> str:
    return "globaldl " + " ".join(shlex.quote(argument) for argument in sys.argv[1:])


def _device_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or any(count < 1 for count in counts):
        raise ValueError(f"--devices must be positive integers like 100,1000,10000, got {text!r}")
    return counts


@app.command()
def calibrate(
    results_dir: Annotated[
        Path | None, typer.Option(help="fleet results (default: results/experiments)")
    ] = None,
    fit_on: str = typer.Option(
        "ablation,bottleneck,latency", help="experiments to fit on; every other run is held out"
    ),
    out: OutDir = None,
) -> None:
    """Fit the simulator on some fleet runs, write parameters and the held-out error table."""
    from globaldl.simulate.calibration import calibrate as fit
    from globaldl.simulate.fleetdata import DEFAULT_RESULTS_DIR, load_observations
    from globaldl.simulate.outputs import DEFAULT_OUT_DIR, write_calibration

    with user_errors():
        observations = load_observations(results_dir or DEFAULT_RESULTS_DIR)
        experiments = tuple(name.strip() for name in fit_on.split(",") if name.strip())
        calibration = fit(observations, experiments, progress=_progress)
    path = write_calibration(out or DEFAULT_OUT_DIR, calibration, _command())
    typer.echo(
        f"held-out median |error| {calibration.held_out_median_error:.1%} "
        f"(target <= 10%: {'met' if calibration.error_target_met else 'NOT met'}); rankings "
        f"preserved: {'yes' if calibration.rankings_preserved else 'NO'}; written to {path}"
    )


@app.command()
def project(
    devices: str = typer.Option("100,1000,10000", help="device counts, comma-separated"),
    mix: str = typer.Option(
        "lte:60,lte-m:30,nb-iot:10", help="PROFILE:SHARE,... or a mix named in mixes.yaml"
    ),
    model: str = typer.Option("lenet", help="a model the fleet measured (lenet, resnet-8, ...)"),
    cpu_cores: float = typer.Option(0.5, help="each device's CPU quota, in cores"),
    speeds: str = typer.Option(
        "1:100",
        help="RELATIVE_SPEED:SHARE,... the devices' CPUs against the fleet's reference core, "
        "e.g. 1:70,0.25:30 (30% of devices four times slower)",
    ),
    balance: str = typer.Option(
        "equal",
        help="local batches: equal, or speed (split by each device's speed, as training's "
        "--balance speed does)",
    ),
    site_size: int = typer.Option(50, help="devices per site for the hierarchical mode (0: none)"),
    site_profile: str = typer.Option("fibre", help="link profile of each site's shared WAN link"),
    local_steps: int = typer.Option(
        16, help="H, steps between exchanges in the local mode (the fleet measured 16, 64)"
    ),
    target_accuracy: float = typer.Option(0.9, help="validation accuracy to reach"),
    steps: int = typer.Option(100, help="steps to simulate at most (fewer once steady)"),
    gloo_timeout_seconds: float = typer.Option(30.0, help="HOROVOD_GLOO_TIMEOUT_SECONDS"),
    modes: str = typer.Option(
        "dense,fp16-sum,gather,sparse-sum,hierarchical,local",
        help="exchange modes (sparse-sum: shared top-k 1% + integer sums, as the fleet ran it)",
    ),
    name: str = typer.Option("", help="output name (default: derived from model and mix)"),
    parameters_file: Annotated[
        Path | None, typer.Option(help="calibration JSON (default: the committed one)")
    ] = None,
    out: OutDir = None,
) -> None:
    """Project step time, time to accuracy, bytes per device and crossovers per exchange mode."""
    from globaldl.simulate.fleetdata import load_observations
    from globaldl.simulate.outputs import (
        DEFAULT_OUT_DIR,
        PARAMETERS_FILE,
        calibration_summary,
        read_parameters,
        speeds_note,
        write_projection,
    )
    from globaldl.simulate.platform import (
        default_profiles,
        load_mixes,
        parse_speed_shares,
        resolve_mix,
    )
    from globaldl.simulate.projection import ProjectionRequest
    from globaldl.simulate.projection import project as run_projection

    out = out or DEFAULT_OUT_DIR
    parameters_path = parameters_file or DEFAULT_OUT_DIR / PARAMETERS_FILE
    started = time.monotonic()
    with user_errors():
        counts = _device_counts(devices)
        profiles = default_profiles()
        if site_size and site_profile not in profiles:
            raise ValueError(f"--site-profile {site_profile!r}; valid: {sorted(profiles)}")
        request = ProjectionRequest(
            devices=counts,
            mix=resolve_mix(mix, profiles, load_mixes()),
            model=model,
            cpu_cores=cpu_cores,
            speeds=parse_speed_shares(speeds),
            balance=balance,
            site_size=site_size,
            site_profile=profiles[site_profile] if site_size else None,
            local_steps=local_steps,
            target_accuracy=target_accuracy,
            steps=steps,
            gloo_timeout_seconds=gloo_timeout_seconds,
            modes=tuple(part.strip() for part in modes.split(",") if part.strip()),
        )
        parameters = read_parameters(parameters_path)
        rows = run_projection(request, load_observations(), parameters, profiles, _progress)
    calibration = json.loads(Path(parameters_path).read_text())
    speed_mix = request.speeds.describe()
    recorded = {
        "devices": list(counts),
        "mix": mix,
        "model": model,
        "cpu_cores": cpu_cores,
        "speeds": speed_mix,
        "balance": balance,
        "site_size": site_size,
        "site_profile": site_profile,
        "local_steps": local_steps,
        "target_accuracy": target_accuracy,
        "steps": steps,
        "gloo_timeout_seconds": gloo_timeout_seconds,
    }
    header = {
        "title": f"{model} on {mix}, {cpu_cores:g} core per device{speeds_note(recorded)}",
        "command": _command(),
        "parameters_file": str(parameters_path.name),
        "calibration": calibration_summary(calibration),
        "simulation_seconds": time.monotonic() - started,
        "request": recorded,
    }
    derived = mix if request.speeds.is_uniform else f"{mix}-speeds-{speed_mix}"
    derived += "-balance-speed" if balance == "speed" else ""
    output_name = name or f"{model}-" + "".join(ch if ch.isalnum() else "-" for ch in derived)
    path = write_projection(out, output_name, rows, header)
    typer.echo(f"projection written to {path} in {time.monotonic() - started:.1f} s")


@app.command()
def readme(
    out: OutDir = None,
    readme_path: Annotated[
        Path | None, typer.Option("--readme", help="README to update (default: the repo's)")
    ] = None,
) -> None:
    """Regenerate the README's projection section from the projection files in --out."""
    from globaldl.simulate.outputs import (
        DEFAULT_OUT_DIR,
        DEFAULT_README,
        projection_documents,
        readme_section,
        refresh_readme,
    )

    out = out or DEFAULT_OUT_DIR
    target = readme_path or DEFAULT_README
    with user_errors():
        documents = projection_documents(out)
        if not documents:
            raise ValueError(f"no projection in {out}; run `globaldl simulate project` first")
        relative = os.path.relpath(out.resolve(), target.resolve().parent)
        if not refresh_readme(target, readme_section(documents, Path(relative).as_posix())):
            raise ValueError(f"{target} has no generated projection section (markers missing)")
    typer.echo(f"{target}: projection section regenerated from {len(documents)} projections")

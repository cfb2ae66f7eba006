"""`globaldl experiment`: the papers' tables, measured on the emulated fleet."""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from globaldl.experiments import Experiment, ExperimentReport

app = typer.Typer(
    help="Experiments on the emulated fleet: each brings its own fleets up and down, runs "
    "`globaldl train` through `fleet run`, and writes CSV, JSON, markdown and PNG plots.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DEFAULT_RESULTS_DIR = Path("results/experiments")

Quick = Annotated[bool, typer.Option("--quick", help="A short version: a few minutes on 2 cores.")]
Out = Annotated[
    Path | None, typer.Option(help="Results folder [default: results/experiments/NAME].")
]
CycleTime = Annotated[
    str,
    typer.Option(
        "--cycle-time-ms",
        help="HOROVOD_CYCLE_TIME of the runs: auto (chosen per link so Horovod's idle "
        "coordination stays under 5% of it) or a number of milliseconds.",
    ),
]
Only = Annotated[
    str | None,
    typer.Option(
        help="Run only these runs (labels, comma-separated); the tables and plots also take "
        "the other runs already in the results folder."
    ),
]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Print the plan (fleets, train commands); run nothing.")
]
StateDir = Annotated[
    Path | None,
    typer.Option(help="State dir of the experiments' fleets [default: /run/globaldl-experiments]."),
]
Prefix = Annotated[
    str | None, typer.Option(help="Device name prefix of the experiments' fleets [default: gdlx].")
]
Subnet = Annotated[
    str | None, typer.Option(help="Subnet of the experiments' fleets [default: 10.78.0.0/24].")
]
Cpu = Annotated[float | None, typer.Option("--cpu", help="CPU cores per device.")]
CpuCores = Annotated[float, typer.Option("--cpu", help="CPU cores per device.")]


@contextmanager
def _user_errors() -> Iterator[None]:
    """Bad input -> one line and exit 2; a fleet the system refused -> exit 1.

    Not globaldl.cli.errors: that module imports TensorFlow, and `experiment --help` should not.
    """
    from globaldl.fleet.fleet import FleetError

    try:
        yield
    except FleetError as error:
        typer.echo(f"globaldl: error: {error}", err=True)
        raise typer.Exit(code=1) from None
    except (ValueError, OSError) as error:
        typer.echo(f"globaldl: error: {error}", err=True)
        raise typer.Exit(code=2) from None


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parse_cycle_time(text: str) -> float | None:
    """`auto` -> None (chosen per link), else a positive number of milliseconds."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"--cycle-time-ms {text!r} is not allowed; use auto or milliseconds > 0"
        ) from None
    if not value > 0:
        raise ValueError(f"--cycle-time-ms {text!r} is not allowed; use auto or milliseconds > 0")
    return value


def parse_int_list(option: str, text: str) -> list[int]:
    """`1,2,4` -> [1, 2, 4]; ValueError naming the option otherwise."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r} must be whole numbers separated by commas") from None
    if not values or any(value < 1 for value in values):
        raise ValueError(f"{option} {text!r} must list whole numbers >= 1")
    return values


def _command_line() -> str:
    args = sys.argv[1:]
    return shlex.join(["globaldl", *([] if "experiment" in args else ["experiment"]), *args])


def _runner(
    name: str, out: Path | None, state_dir: Path | None, prefix: str | None, subnet: str | None
) -> Any:
    from globaldl.experiments import runner as runner_module

    return runner_module.ExperimentRunner(
        out or DEFAULT_RESULTS_DIR / name,
        state_dir=state_dir or runner_module.DEFAULT_EXPERIMENT_STATE_DIR,
        prefix=prefix or runner_module.DEFAULT_EXPERIMENT_PREFIX,
        subnet=subnet or runner_module.DEFAULT_EXPERIMENT_SUBNET,
    )


def _print_plan(experiment: Experiment, runner: Any, only: list[str] | None = None) -> None:
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


def _report(report: ExperimentReport) -> None:
    for path in report.paths:
        typer.echo(f"  wrote {path}")
    for check in report.targets:
        typer.echo(f"  target {check.status}: {check.goal} ({check.measured})")
    if report.failed_runs:
        typer.echo(
            f"  {len(report.failed_runs)} run(s) failed: "
            + ", ".join(f"{r.spec.label} ({r.status})" for r in report.failed_runs)
        )


def _execute(
    build: Callable[[], Experiment],
    *,
    out: Path | None,
    dry_run: bool,
    state_dir: Path | None,
    prefix: str | None,
    subnet: str | None,
    only: list[str] | None = None,
) -> ExperimentReport | None:
    from globaldl.experiments import run_experiment

    # write_results loads TensorFlow (for its version); keep its start-up chatter out.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with _user_errors():
        experiment = build()
        runner = _runner(experiment.name, out, state_dir, prefix, subnet)
        if dry_run:
            _print_plan(experiment, runner, only)
            return None
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        typer.echo(
            f"experiment {experiment.name}: {len(experiment.plan())} runs -> {runner.out_dir}"
        )
        try:
            report = run_experiment(
                experiment, runner, runner.out_dir, command=_command_line(), only=only
            )
        except KeyboardInterrupt:
            typer.echo(
                f"experiment {experiment.name}: interrupted; finished runs written to "
                f"{runner.out_dir}",
                err=True,
            )
            raise typer.Exit(code=130) from None
    _report(report)
    return report


def _labels(text: str | None) -> list[str] | None:
    return [part.strip() for part in text.split(",") if part.strip()] if text else None


def _exit_code(reports: list[ExperimentReport | None]) -> int:
    return 1 if any(report is not None and report.failed_runs for report in reports) else 0


@app.command()
def devices(
    quick: Quick = False,
    device_counts: Annotated[
        str | None, typer.Option(help="Fleet sizes [default: 1,2,4,8; quick: 1,2,4].")
    ] = None,
    profile: Annotated[str, typer.Option(help="Link profile of every device.")] = "lte",
    cpu: Cpu = None,
    lenet_target: Annotated[float, typer.Option(help="Target val_accuracy, LeNet/MNIST.")] = 0.90,
    resnet_target: Annotated[
        float, typer.Option(help="Target val_accuracy, ResNet-8/cifar-synthetic.")
    ] = 0.50,
    cycle_time_ms: CycleTime = "auto",
    out: Out = None,
    only: Only = None,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """Time, accuracy and time to accuracy against devices [default cpu: 0.25; quick 0.5]."""

    def build() -> Experiment:
        from globaldl.experiments import DevicesExperiment
        from globaldl.experiments.spec import LENET_MNIST, RESNET8_CIFAR

        workloads = [LENET_MNIST.with_target(lenet_target)]
        if not quick:
            workloads.append(RESNET8_CIFAR.with_target(resnet_target))
        return DevicesExperiment(
            quick=quick,
            cycle_time_ms=parse_cycle_time(cycle_time_ms),
            device_counts=parse_int_list("--device-counts", device_counts)
            if device_counts
            else None,
            workloads=workloads,
            profile=profile,
            cpu_cores_per_device=cpu,
        )

    report = _execute(
        build,
        out=out,
        dry_run=dry_run,
        state_dir=state_dir,
        prefix=prefix,
        subnet=subnet,
        only=_labels(only),
    )
    raise typer.Exit(code=_exit_code([report]))


@app.command()
def resources(
    quick: Quick = False,
    devices: Annotated[int | None, typer.Option(help="Devices [default: 4; quick: 2].")] = None,
    profile: Annotated[str, typer.Option(help="Link profile of every device.")] = "lte",
    cpu: CpuCores = 0.5,
    cycle_time_ms: CycleTime = "auto",
    out: Out = None,
    only: Only = None,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """CPU, memory and network per device for MLP layers x batch size (scraped exporters)."""

    def build() -> Experiment:
        from globaldl.experiments import ResourcesExperiment

        return ResourcesExperiment(
            quick=quick,
            cycle_time_ms=parse_cycle_time(cycle_time_ms),
            devices=devices,
            profile=profile,
            cpu_cores_per_device=cpu,
        )

    report = _execute(
        build,
        out=out,
        dry_run=dry_run,
        state_dir=state_dir,
        prefix=prefix,
        subnet=subnet,
        only=_labels(only),
    )
    raise typer.Exit(code=_exit_code([report]))


@app.command()
def ablation(
    quick: Quick = False,
    devices: Annotated[int, typer.Option(help="Devices.")] = 4,
    cpu: CpuCores = 0.5,
    target: Annotated[float, typer.Option(help="Target val_accuracy (LeNet/MNIST).")] = 0.90,
    cycle_time_ms: CycleTime = "auto",
    out: Out = None,
    only: Only = None,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """Compression ablation on a 5 Mbit/s uplink, and the recommended preset unshaped."""

    def build() -> Experiment:
        from globaldl.experiments import AblationExperiment
        from globaldl.experiments.spec import LENET_MNIST

        return AblationExperiment(
            quick=quick,
            cycle_time_ms=parse_cycle_time(cycle_time_ms),
            devices=devices,
            cpu_cores_per_device=cpu,
            workload=LENET_MNIST.with_target(target),
        )

    report = _execute(
        build,
        out=out,
        dry_run=dry_run,
        state_dir=state_dir,
        prefix=prefix,
        subnet=subnet,
        only=_labels(only),
    )
    raise typer.Exit(code=_exit_code([report]))


@app.command()
def bottleneck(
    quick: Quick = False,
    profiles: Annotated[
        str | None,
        typer.Option(
            help="Link profiles, comma-separated [default: fibre,lte,slow-4g,lte-m,nb-iot; "
            "quick: fibre,slow-4g]."
        ),
    ] = None,
    devices: Annotated[int | None, typer.Option(help="Devices [default: 4; quick: 2].")] = None,
    cpu: CpuCores = 0.5,
    cycle_time_ms: CycleTime = "auto",
    out: Out = None,
    only: Only = None,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """The dominant phase of the step per link profile and model (a table and a heatmap)."""

    def build() -> Experiment:
        from globaldl.experiments import BottleneckExperiment

        chosen = (
            [part.strip() for part in profiles.split(",") if part.strip()] if profiles else None
        )
        return BottleneckExperiment(
            quick=quick,
            cycle_time_ms=parse_cycle_time(cycle_time_ms),
            profiles=chosen,
            devices=devices,
            cpu_cores_per_device=cpu,
        )

    report = _execute(
        build,
        out=out,
        dry_run=dry_run,
        state_dir=state_dir,
        prefix=prefix,
        subnet=subnet,
        only=_labels(only),
    )
    raise typer.Exit(code=_exit_code([report]))


@app.command()
def recovery(
    quick: Quick = False,
    profile: Annotated[str, typer.Option(help="Link profile of the 3 devices.")] = "lte",
    repeats: Annotated[
        int | None, typer.Option(help="Kill-and-revive runs [default: 2; quick: 1].")
    ] = None,
    cycle_time_ms: CycleTime = "auto",
    out: Out = None,
    only: Only = None,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """Elastic recovery: seconds from a device's death to the next step, and from its return."""

    def build() -> Experiment:
        from globaldl.experiments import RecoveryExperiment

        return RecoveryExperiment(
            quick=quick,
            cycle_time_ms=parse_cycle_time(cycle_time_ms),
            profile=profile,
            repeats=repeats,
        )

    report = _execute(
        build,
        out=out,
        dry_run=dry_run,
        state_dir=state_dir,
        prefix=prefix,
        subnet=subnet,
        only=_labels(only),
    )
    raise typer.Exit(code=_exit_code([report]))


@app.command()
def balance(
    quick: Quick = False,
    profile: Annotated[str, typer.Option(help="Link profile of the 4 devices.")] = "lte",
    cycle_time_ms: CycleTime = "auto",
    out: Out = None,
    only: Only = None,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """Mixed fleet (2 fast, 2 quarter-speed devices): equal shares vs --balance speed."""

    def build() -> Experiment:
        from globaldl.experiments import BalanceExperiment

        return BalanceExperiment(
            quick=quick, cycle_time_ms=parse_cycle_time(cycle_time_ms), profile=profile
        )

    report = _execute(
        build,
        out=out,
        dry_run=dry_run,
        state_dir=state_dir,
        prefix=prefix,
        subnet=subnet,
        only=_labels(only),
    )
    raise typer.Exit(code=_exit_code([report]))


@app.command()
def rounds(
    quick: Quick = False,
    profile: Annotated[
        str, typer.Option(help="The slow link: 5 Mbit/s up, 20 down, 50 ms one way.")
    ] = "custom:5:20:50",
    cycle_time_ms: CycleTime = "auto",
    out: Out = None,
    only: Only = None,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """Local steps with compressed, overlapped deltas against per-step Horovod (issue 13)."""

    def build() -> Experiment:
        from globaldl.experiments import RoundsExperiment

        return RoundsExperiment(
            quick=quick, cycle_time_ms=parse_cycle_time(cycle_time_ms), shaped_profile=profile
        )

    report = _execute(
        build,
        out=out,
        dry_run=dry_run,
        state_dir=state_dir,
        prefix=prefix,
        subnet=subnet,
        only=_labels(only),
    )
    raise typer.Exit(code=_exit_code([report]))


@app.command(name="all")
def all_experiments(
    quick: Quick = False,
    cycle_time_ms: CycleTime = "auto",
    out: Annotated[
        Path, typer.Option(help="Results root; each experiment writes into OUT/NAME.")
    ] = DEFAULT_RESULTS_DIR,
    dry_run: DryRun = False,
    state_dir: StateDir = None,
    prefix: Prefix = None,
    subnet: Subnet = None,
) -> None:
    """Run every experiment in turn (devices ... balance); OUT/targets.md lists every goal."""
    from globaldl.experiments import EXPERIMENTS

    reports: list[ExperimentReport | None] = []
    for name, experiment_class in EXPERIMENTS.items():

        def build(experiment_class: Any = experiment_class) -> Experiment:
            return experiment_class(quick=quick, cycle_time_ms=parse_cycle_time(cycle_time_ms))

        reports.append(
            _execute(
                build,
                out=out / name,
                dry_run=dry_run,
                state_dir=state_dir,
                prefix=prefix,
                subnet=subnet,
            )
        )
    if not dry_run:
        with _user_errors():
            path = write_targets_summary(
                out, [r for r in reports if r is not None], _command_line()
            )
        typer.echo(f"targets of every experiment: {path}")
    raise typer.Exit(code=_exit_code(reports))


@app.command()
def report(
    name: Annotated[
        str,
        typer.Argument(
            help="devices, resources, ablation, bottleneck, recovery, balance or rounds."
        ),
    ],
    quick: Quick = False,
    out: Out = None,
) -> None:
    """Rewrite an experiment's tables and plots from the runs in its folder; nothing runs.

    The plan is the experiment's default one (with --quick: the quick one); runs found in
    OUT/runs/LABEL/result.json are used in plan order, missing ones are left out.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with _user_errors():
        import json

        from globaldl.experiments import get, write_outputs
        from globaldl.experiments.runner import load_results

        experiment = get(name, quick=quick)
        out_dir = out or DEFAULT_RESULTS_DIR / name
        specs = experiment.plan()
        results = load_results(out_dir, specs)
        if not results:
            raise ValueError(f"no run results of {name} in {out_dir / 'runs'}")
        previous = out_dir / f"{name}.json"
        command = json.loads(previous.read_text()).get("command", "") if previous.exists() else ""
        written = write_outputs(
            experiment, results, out_dir, command, complete=len(results) == len(specs)
        )
    typer.echo(f"{name}: {len(results)} of {len(specs)} runs")
    _report(written)


def write_targets_summary(out: Path, reports: list[ExperimentReport], command: str) -> Path:
    """OUT/targets.md: every experiment's goals, met or not, in one table."""
    from globaldl.bench.results import markdown_table
    from globaldl.monitoring.files import write_text_atomically

    rows = [
        {"experiment": report.name, **check.as_row()}
        for report in reports
        for check in report.targets
    ]
    text = (
        "# globaldl experiments: targets\n\n"
        f"Measured with `{command}`. Each experiment's folder has its tables and plots.\n\n"
        + markdown_table(rows, ["experiment", "goal", "status", "measured"])
    )
    out.mkdir(parents=True, exist_ok=True)
    path = out / "targets.md"
    write_text_atomically(path, text)
    return path


if __name__ == "__main__":
    sys.exit(app())

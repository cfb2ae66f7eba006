"""`devices`: elapsed time, accuracy and time to accuracy against the number of devices.

Default runs (one repeat; the protocol runs 3, about 2 hours), on lte's rates without its
delay (`DEVICES_PROFILE`): LeNet/MNIST dense and compressed on 1, 2, 4 and 8 devices (5
epochs: the compressed 8-device fleet reached 0.90 only in its third epoch), and
ResNet-8/cifar-synthetic compressed only, 3 epochs of 128 global steps. Left out: dense
ResNet-8 (about 13 minutes a repeat; its exchange-bound step on these links is measured by
`bottleneck`) and the fourth ResNet epoch: no ResNet fleet reached 0.50 in 4 short epochs,
its accuracy is the `learning` experiment's question, and here it gives the time per epoch of
a model whose compute is not negligible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from globaldl.experiments.aggregate import error_bars, row_spread
from globaldl.experiments.analysis import (
    NO_RESULT,
    Spread,
    TargetCheck,
    falls_with_devices,
    seconds_or_not_reached,
    time_to_target,
)
from globaldl.experiments.experiment import Experiment, run_row
from globaldl.experiments.outputs import save_figure
from globaldl.experiments.runner import RunResult
from globaldl.experiments.spec import (
    LENET_MNIST,
    RESNET8_CIFAR,
    FleetConfig,
    RunSpec,
    Workload,
    compression_args,
    slug,
)

COMPRESSED = "prune+quantize"
# lte's rates (5 Mbit/s up, 17.5 down) without its 35 ms delay each way: the table shows how
# time falls with devices on a narrow uplink; what delay adds is the `latency` experiment's
# question. (It measured 12-14 device round trips per step: at lte's 140 ms round trip about
# 1.9 s more for each of the ~2,900 exchanging steps of a repeat, 1.5 hours a repeat.)
DEVICES_PROFILE = "custom:5:17.5"
# The compression presets each workload runs with by default (see the module docstring).
DEFAULT_COMPRESSIONS: dict[str, tuple[str, ...]] = {
    LENET_MNIST.name: ("none", COMPRESSED),
    RESNET8_CIFAR.name: (COMPRESSED,),
}


@dataclass(frozen=True)
class Schedule:
    """How long a workload trains: epochs, and the GLOBAL steps per epoch (None: all the data).

    With N devices each rank runs global_steps_per_epoch // N steps of its fixed local batch,
    so an epoch is the same amount of work whatever N is.
    """

    epochs: int
    global_steps_per_epoch: int | None = None

    def max_steps_per_epoch(self, devices: int) -> int | None:
        """Steps each of `devices` ranks runs per epoch (None: its whole shard)."""
        if self.global_steps_per_epoch is None:
            return None
        return max(1, self.global_steps_per_epoch // devices)


def _finished(row: dict[str, Any], column: str) -> Spread | str:
    """A column's median with its range, or NO_RESULT for a fleet without a finished run."""
    spread = row_spread(row, column) if row.get("repeats") else None
    return NO_RESULT if spread is None else spread


class DevicesExperiment(Experiment):
    """The edge-training paper's table (time and accuracy vs devices), on globaldl's fleet.

    The paper's elapsed time GREW with devices (synchronisation cost more than the compute it
    spread). Here every device adds compute (a fixed CPU share per device) and the global work
    per epoch stays fixed (each device gets 1/N of the data at a fixed local batch), so the
    time per epoch should fall with N, most of all with the gradients compressed.
    """

    name = "devices"
    title = "Time and accuracy against the number of devices"
    columns = (
        "model",
        "compression",
        "devices",
        "cpu_cores_total",
        "epochs",
        "steps_per_rank",
        "training_seconds",
        "seconds_per_epoch",
        "val_accuracy",
        "target_accuracy",
        "seconds_to_target",
        "mean_step_seconds",
        "wire_bytes_per_step",
        "compression_ratio",
        "device_tx_bytes_per_step",
        "traffic_ratio_vs_dense_measured",
        "status",
    )

    def __init__(
        self,
        *,
        quick: bool = False,
        cycle_time_ms: float | None = None,
        device_counts: Sequence[int] | None = None,
        workloads: Sequence[Workload] | None = None,
        compressions: Sequence[str] | None = None,
        profile: str | None = None,
        cpu_cores_per_device: float | None = None,
        schedules: dict[str, Schedule] | None = None,
        batch_size: int = 16,
    ) -> None:
        super().__init__(quick=quick, cycle_time_ms=cycle_time_ms)
        self.device_counts = tuple(device_counts or ((1, 2, 4) if quick else (1, 2, 4, 8)))
        if sorted(set(self.device_counts)) != list(self.device_counts) or self.device_counts[0] < 1:
            raise ValueError(
                f"device_counts must be increasing whole numbers >= 1, got {self.device_counts}"
            )
        self.workloads = tuple(
            workloads or ((LENET_MNIST,) if quick else (LENET_MNIST, RESNET8_CIFAR))
        )
        # Given presets apply to every workload; else each workload's defaults.
        self.compressions_of = {
            workload.name: tuple(
                compressions or DEFAULT_COMPRESSIONS.get(workload.name, ("none", COMPRESSED))
            )
            for workload in self.workloads
        }
        self.compressions = tuple(
            dict.fromkeys(c for presets in self.compressions_of.values() for c in presets)
        )
        for preset in self.compressions:
            compression_args(preset)
        self.profile = profile or DEVICES_PROFILE
        # 8 devices x 0.25 cores fill 2 cores; quick stops at 4 devices x 0.5.
        self.cpu_cores_per_device = cpu_cores_per_device or (0.5 if quick else 0.25)
        default_schedules = (
            {LENET_MNIST.name: Schedule(2, 48), RESNET8_CIFAR.name: Schedule(1, 16)}
            if quick
            else {LENET_MNIST.name: Schedule(5), RESNET8_CIFAR.name: Schedule(3, 128)}
        )
        self.schedules = {**default_schedules, **(schedules or {})}
        missing = [w.name for w in self.workloads if w.name not in self.schedules]
        if missing:
            raise ValueError(f"no schedule for workload(s) {missing}; give one in schedules")
        self.batch_size = batch_size

    def plan(self) -> list[RunSpec]:
        """One fleet per device count; on it every workload, compressed and not."""
        specs = []
        for devices in self.device_counts:
            fleet = FleetConfig(devices, self.profile, self.cpu_cores_per_device)
            for workload in self.workloads:
                schedule = self.schedules[workload.name]
                steps = schedule.max_steps_per_epoch(devices)
                for compression in self.compressions_of[workload.name]:
                    args = [
                        *workload.train_args,
                        "--batch-size",
                        str(self.batch_size),
                        "--epochs",
                        str(schedule.epochs),
                    ]
                    if steps is not None:
                        args += ["--max-steps-per-epoch", str(steps)]
                    args += [*compression_args(compression), "--seed", "0"]
                    specs.append(
                        RunSpec(
                            experiment=self.name,
                            label=f"{workload.name}-n{devices}-{slug(compression)}",
                            fleet=fleet,
                            train_args=tuple(args),
                            factors={"model": workload.name, "compression": compression},
                            cycle_time_ms=self.cycle_time_ms,
                        )
                    )
        return specs

    def _target_of(self, model: str) -> float:
        return next(w.target_accuracy for w in self.workloads if w.name == model)

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per run, with seconds per epoch and time to the workload's target."""
        rows = []
        for result in results:
            row = run_row(result)
            target = self._target_of(str(result.spec.factors["model"]))
            row["target_accuracy"] = target
            if result.summary is not None:
                history = result.summary.get("history", [])
                row["seconds_per_epoch"] = (
                    sum(epoch["seconds"] for epoch in history) / len(history) if history else None
                )
                row["seconds_to_target"] = seconds_or_not_reached(time_to_target(history, target))
            rows.append(row)
        return rows

    def targets(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult]
    ) -> list[TargetCheck]:
        """Time per epoch falls with devices (every config); time to accuracy (compressed).

        "Falls" means at every step from the smallest fleet to the largest, on the medians of
        the repeats: the status and the measured text use that one definition.
        """
        first, last = self.device_counts[0], self.device_counts[-1]
        checks = []
        for workload in self.workloads:
            for compression in self.compressions_of[workload.name]:
                selected = [
                    row
                    for row in rows
                    if row["model"] == workload.name and row["compression"] == compression
                ]
                checks.append(
                    falls_with_devices(
                        f"{workload.name}, {compression}: time per epoch falls at every step "
                        f"from {first} to {last} devices",
                        {row["devices"]: _finished(row, "seconds_per_epoch") for row in selected},
                    )
                )
                if compression == COMPRESSED:
                    checks.append(
                        falls_with_devices(
                            f"{workload.name}, {compression}: time to val_accuracy "
                            f"{workload.target_accuracy:g} falls at every step from {first} to "
                            f"{last} devices",
                            {
                                row["devices"]: _finished(row, "seconds_to_target")
                                for row in selected
                            },
                        )
                    )
        return checks

    def plots(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult], out_dir: Path
    ) -> list[Path]:
        """devices.png: time per epoch, final accuracy and time to target against devices."""
        panels = (
            ("seconds_per_epoch", "seconds per epoch"),
            ("val_accuracy", "final validation accuracy"),
            ("seconds_to_target", "seconds to target accuracy"),
        )

        lines = [(w, c) for w in self.workloads for c in self.compressions_of[w.name]]

        def draw(figure: Any) -> None:
            axes = figure.subplots(1, len(panels))
            for axis, (column, label) in zip(axes, panels, strict=True):
                plotted = 0
                # The same colour for a line in every panel, plotted or not.
                for index, (workload, compression) in enumerate(lines):
                    points = [
                        (row["devices"], spread)
                        for row in rows
                        if row["model"] == workload.name and row["compression"] == compression
                        and (spread := row_spread(row, column)) is not None and spread.reached
                    ]  # fmt: skip
                    if points:
                        axis.errorbar(
                            [n for n, _ in points],
                            [spread.median for _, spread in points],
                            yerr=error_bars([spread for _, spread in points]),
                            marker="o",
                            capsize=3,
                            color=f"C{index}",
                            linestyle="-" if compression == COMPRESSED else "--",
                            label=f"{workload.name} {compression}",
                        )
                        plotted += 1
                if not plotted:
                    axis.text(0.5, 0.5, "no run got there", ha="center", transform=axis.transAxes)
                axis.set_xscale("log", base=2)
                axis.set_xlim(self.device_counts[0] / 1.3, self.device_counts[-1] * 1.3)
                axis.set_xticks(list(self.device_counts), [str(n) for n in self.device_counts])
                axis.set_xlabel("devices")
                axis.set_title(label, fontsize=9)
                axis.grid(alpha=0.3)
            axes[0].legend(fontsize=7)
            figure.suptitle(
                f"{self.profile} links, {self.cpu_cores_per_device:g} cores per device; "
                "median of the repeats, bars min-max; missing points: not reached",
                fontsize=9,
            )

        return [save_figure(out_dir / "devices.png", draw, width_inches=12, height_inches=4)]

    def method(self) -> str:
        """How the runs are built."""
        schedules = "; ".join(
            f"{w.name}: {self.schedules[w.name].epochs} epochs"
            + (
                f" of {self.schedules[w.name].global_steps_per_epoch} global steps"
                if self.schedules[w.name].global_steps_per_epoch
                else " over all its training data"
            )
            + f", target val_accuracy {w.target_accuracy:g}"
            for w in self.workloads
        )
        return (
            f"Devices {', '.join(map(str, self.device_counts))}, each with "
            f"{self.cpu_cores_per_device:g} CPU cores (so N devices have N x that: adding a "
            f"device adds compute) and the `{self.profile}` link. Local batch "
            f"{self.batch_size} per device; each device trains on 1/N of the data and runs "
            "1/N of the global steps, so the work per epoch is the same for every N (the "
            "learning rate is scaled by N, `--scale-lr`, the default). Compression: "
            f"{', '.join(self.compressions)} (`{COMPRESSED}` = `--prune topk --density 0.01 "
            f"--quantize int8`). {schedules}. `seconds_to_target` is the time from the first "
            "step to the end of the first epoch whose validation accuracy reached the target "
            "(validation included, process start-up excluded); `training_seconds` is the sum "
            "of all epochs, `run_seconds` the whole `fleet run` (start-up included). Per workload: "
            + "; ".join(
                f"{name}: {', '.join(presets)}" for name, presets in self.compressions_of.items()
            )
            + "."
        )

    def get_config(self) -> dict[str, Any]:
        """The experiment's options."""
        return {
            **super().get_config(),
            "device_counts": list(self.device_counts),
            "workloads": [w.name for w in self.workloads],
            "compressions": {name: list(c) for name, c in self.compressions_of.items()},
            "profile": self.profile,
            "cpu_cores_per_device": self.cpu_cores_per_device,
            "schedules": {name: vars(s) for name, s in self.schedules.items()},
            "batch_size": self.batch_size,
        }

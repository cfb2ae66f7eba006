"""`learning`: the bigger workloads learn on 4 compressed devices as well as one dense process.

For each workload (ResNet-8 on cifar-synthetic, the 3-D video model on moving-mnist, the
video analytics case of the global-IoT paper) two runs get the same budget: the same epochs,
the same global batch and the same learning-rate schedule.

1. Calibration: ONE dense process (a 1-device fleet given the whole fleet's CPU, 2 cores) at
   the global batch (4 x 16 = 64) and the learning rate the fleet reaches (4 x 0.01). Its final
   validation accuracy is the target. A 1-device fleet run rather than a plain local
   process: the same launcher, cgroup and summary as every other run, so the only difference
   from the fleet run is the number of devices and the compression. The CPU share does not
   change what the run learns, only how long it takes, so the device gets the fleet's total.
2. Fleet: 4 devices (0.5 core each, lan links by default), top-k 1% + int8 with error
   feedback, local batch 16, learning rate 0.01 x 4. A workload can name more compressions
   (the video model also runs deep gradient compression + int8: momentum correction and a
   density warm-up, the paper's remedy for what plain top-k loses); each is a fleet run of
   its own against the same calibration.

The links change how long a run takes, not what it learns (the exchange is synchronous): on
lte a compressed ResNet-8 step took about 1.4 s, 95% of it exchange (one interrupted run, not
a benchmark figure), so 3 repeats would take about 3.5 hours (estimate). The default is
therefore lan; `--profile` runs the same plan on any link.

Target: the fleet's final validation accuracy within 1 point of the calibrated target (one-
sided: ending higher is fine). Both runs warm the learning rate up linearly and decay it
along a cosine to zero (globaldl/schedules.py): at a constant rate the final accuracy swings
by several points between epochs and two runs cannot be compared within a point. The budgets
were chosen with smoke runs so that the dense run learns for real (far above chance) and one
repeat takes under ~90 minutes on a quiet 2-core machine.

ResNet-8 keeps batch normalisation local to each device (batch statistics of 16 examples; the
moving statistics are averaged at every epoch end, see globaldl/bench/batchnorm.py), while the
calibration normalises over all 64: the comparison includes that difference too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from globaldl.experiments.aggregate import representative_results
from globaldl.experiments.analysis import TargetCheck
from globaldl.experiments.experiment import Experiment, run_row
from globaldl.experiments.outputs import number_or_none, save_figure
from globaldl.experiments.runner import RunResult
from globaldl.experiments.spec import FleetConfig, RunSpec, compression_args, slug

COMPRESSION = "prune+quantize"
COMPRESSION_SUMMARIES = {
    "prune+quantize": "top-k 1% + int8, error feedback",
    "dgc+quantize": "DGC 1% after a 2-epoch warm-up + int8",
}
CALIBRATION, FLEET = "calibration", "fleet"
TOLERANCE_POINTS = 1.0


@dataclass(frozen=True)
class LearningWorkload:
    """A model on a dataset, the budget both of its runs get, and what counts as learning.

    `learning_rate` is per device at the local batch; the fleet scales it by the number of
    devices (as `globaldl train` does), the calibration (one process, so its own scaling is
    x 1) is given the scaled rate directly.
    `learns_above` is the validation accuracy the dense calibration must exceed for the
    workload to count as learned at all (chance is 1 / classes). `compressions` are the
    presets (globaldl/experiments/spec.py) the fleet runs, each against the calibration.
    """

    name: str
    train_args: tuple[str, ...]
    epochs: int
    lr_warmup_epochs: int
    learns_above: float
    learning_rate: float = 0.01
    compressions: tuple[str, ...] = (COMPRESSION,)

    def __post_init__(self) -> None:
        if self.epochs < 1 or not 0 <= self.lr_warmup_epochs <= self.epochs:
            raise ValueError(
                f"workload {self.name}: epochs {self.epochs} and lr_warmup_epochs "
                f"{self.lr_warmup_epochs} must satisfy 0 <= warm-up <= epochs >= 1"
            )
        if not 0 < self.learns_above < 1:
            raise ValueError(
                f"workload {self.name}: learns_above must be in (0, 1), got {self.learns_above!r}"
            )
        if not self.compressions:
            raise ValueError(f"workload {self.name}: compressions must name at least one preset")
        unknown = [name for name in self.compressions if name not in COMPRESSION_SUMMARIES]
        if unknown:
            raise ValueError(
                f"workload {self.name}: compressions {unknown} are not among "
                f"{', '.join(COMPRESSION_SUMMARIES)}"
            )


RESNET8_LEARNING = LearningWorkload(
    "resnet-8",
    ("--model", "resnet", "--depth", "8", "--dataset", "cifar-synthetic"),
    epochs=12,
    lr_warmup_epochs=2,
    learns_above=0.80,
)
VIDEO_LEARNING = LearningWorkload(
    "video",
    ("--model", "video", "--dataset", "moving-mnist"),
    epochs=10,
    lr_warmup_epochs=2,
    learns_above=0.80,
    compressions=(COMPRESSION, "dgc+quantize"),
)


class LearningExperiment(Experiment):
    """Per workload: a 1-process dense calibration, then 4 compressed devices, same budget."""

    name = "learning"
    title = "Real learning: 4 compressed devices against a 1-process dense calibration"
    columns = (
        "model",
        "role",
        "devices",
        "compression",
        "epochs",
        "global_batch_size",
        "val_accuracy",
        "target_accuracy",
        "points_below_target",
        "weights_identical",
        "training_seconds",
        "mean_step_seconds",
        "status",
    )

    def __init__(
        self,
        *,
        quick: bool = False,
        cycle_time_ms: float | None = None,
        devices: int = 4,
        profile: str = "lan",
        cpu_cores_per_device: float = 0.5,
        local_batch_size: int = 16,
        workloads: Sequence[LearningWorkload] | None = None,
    ) -> None:
        super().__init__(quick=quick, cycle_time_ms=cycle_time_ms)
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 2:
            raise ValueError(f"devices must be a whole number >= 2, got {devices!r}")
        if isinstance(local_batch_size, bool) or local_batch_size < 1:
            raise ValueError(f"local_batch_size must be >= 1, got {local_batch_size!r}")
        self.devices = devices
        self.profile = profile
        self.local_batch_size = local_batch_size
        self.workloads = tuple(
            workloads or ((RESNET8_LEARNING,) if quick else (RESNET8_LEARNING, VIDEO_LEARNING))
        )
        names = [workload.name for workload in self.workloads]
        if len(set(names)) != len(names):
            raise ValueError(f"workload names must be unique, got {names}")
        self.fleet = FleetConfig(devices, profile, cpu_cores_per_device)
        # The calibration does the whole fleet's work alone, so it gets the fleet's cores.
        self.calibration_fleet = FleetConfig(1, profile, self.fleet.cpu_cores_total)

    def _budget_args(self, workload: LearningWorkload) -> tuple[str, ...]:
        """Epochs and schedule, identical for both runs (quick: 2 short epochs)."""
        if self.quick:
            return ("--epochs", "2", "--max-steps-per-epoch", "10", "--lr-warmup-epochs", "1")
        return (
            "--epochs",
            str(workload.epochs),
            "--lr-warmup-epochs",
            str(workload.lr_warmup_epochs),
        )

    def plan(self) -> list[RunSpec]:
        """Every calibration on the 1-device fleet, then every fleet run on the 4 devices."""
        global_batch = self.local_batch_size * self.devices
        calibrations, fleet_runs = [], []
        for workload in self.workloads:
            common = (*workload.train_args, *self._budget_args(workload), "--lr-decay", "cosine")
            calibrations.append(
                RunSpec(
                    experiment=self.name,
                    label=slug(f"{workload.name}-{CALIBRATION}-dense-1"),
                    fleet=self.calibration_fleet,
                    train_args=(
                        *common,
                        "--batch-size",
                        str(global_batch),
                        "--learning-rate",
                        f"{workload.learning_rate * self.devices:g}",
                        "--seed",
                        "0",
                    ),
                    factors={"model": workload.name, "role": CALIBRATION, "compression": "none"},
                    cycle_time_ms=self.cycle_time_ms,
                    timeout_seconds=3600.0,
                )
            )
            fleet_runs.extend(
                RunSpec(
                    experiment=self.name,
                    label=slug(f"{workload.name}-{FLEET}-{slug(compression)}-{self.devices}"),
                    fleet=self.fleet,
                    train_args=(
                        *common,
                        "--batch-size",
                        str(self.local_batch_size),
                        "--learning-rate",
                        f"{workload.learning_rate:g}",
                        *compression_args(compression),
                        "--seed",
                        "0",
                    ),
                    factors={"model": workload.name, "role": FLEET, "compression": compression},
                    cycle_time_ms=self.cycle_time_ms,
                    timeout_seconds=3600.0,
                )
                for compression in workload.compressions
            )
        return [*calibrations, *fleet_runs]

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per run; a fleet row carries its calibrated target and the gap to it."""
        calibrated = {
            result.spec.factors["model"]: result.summary["val_accuracy"]
            for result in results
            if result.spec.factors["role"] == CALIBRATION and result.summary is not None
        }
        rows = []
        for result in results:
            row = run_row(result)
            summary = result.summary or {}
            row["weights_identical"] = summary.get("weights_identical")
            target = calibrated.get(result.spec.factors["model"])
            if target is not None:
                row["target_accuracy"] = target
                if "val_accuracy" in row:
                    row["points_below_target"] = 100 * (target - row["val_accuracy"])
            rows.append(row)
        return rows

    def targets(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult]
    ) -> list[TargetCheck]:
        """Per workload: the calibration learns; each fleet is within 1 point, weights agree."""
        checks = []
        for workload in self.workloads:
            mine = [row for row in rows if row["model"] == workload.name]
            calibration = next((row for row in mine if row["role"] == CALIBRATION), {})
            target = number_or_none(calibration.get("val_accuracy"))
            checks.append(
                TargetCheck(
                    f"{workload.name}: the 1-process dense calibration learns (final "
                    f"val_accuracy above {workload.learns_above:g})",
                    "no calibration run" if target is None else f"{target:.4f}",
                    None if target is None else target > workload.learns_above,
                )
            )
            for compression in workload.compressions:
                fleet = next(
                    (
                        row
                        for row in mine
                        if row["role"] == FLEET and row["compression"] == compression
                    ),
                    {},
                )
                checks.extend(self._fleet_checks(workload.name, compression, target, fleet))
        return checks

    def _fleet_checks(
        self, model: str, compression: str, target: float | None, fleet: dict[str, Any]
    ) -> list[TargetCheck]:
        """One fleet compression of a workload: within the tolerance of the target; identical."""
        reached = number_or_none(fleet.get("val_accuracy"))
        goal = (
            f"{model}: {self.devices} devices with {compression} within "
            f"{TOLERANCE_POINTS:g} point of the calibrated target"
        )
        if target is None or reached is None:
            within = TargetCheck(goal, "missing runs", None)
        else:
            gap = 100 * (target - reached)
            within = TargetCheck(
                goal,
                f"{reached:.4f} vs target {target:.4f} ({gap:+.1f} points below)",
                gap <= TOLERANCE_POINTS,
            )
        identical = fleet.get("weights_identical")
        return [
            within,
            TargetCheck(
                f"{model}: every device ends with identical weights ({compression})",
                "missing run" if identical is None else str(identical).lower(),
                identical,
            ),
        ]

    def plots(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult], out_dir: Path
    ) -> list[Path]:
        """Validation accuracy per epoch, calibration against fleet, per workload.

        One curve per run: its median repeat (seeded runs repeat the same curve).
        """
        finished = representative_results(results)
        if not finished:
            return []

        def draw(figure: Any) -> None:
            for index, workload in enumerate(self.workloads, start=1):
                axes = figure.add_subplot(1, len(self.workloads), index)
                for result in finished:
                    if result.spec.factors["model"] != workload.name:
                        continue
                    history = result.summary["history"]  # type: ignore[index]
                    role = result.spec.factors["role"]
                    devices = result.spec.fleet.devices
                    label = f"{role} ({devices} device{'s' if devices > 1 else ''}"
                    if role == FLEET:
                        label += f", {result.spec.factors['compression']}"
                    axes.plot(
                        [epoch["epoch"] for epoch in history],
                        [epoch["val_accuracy"] for epoch in history],
                        marker="o" if role == CALIBRATION else "s",
                        label=label + ")",
                    )
                    if role == CALIBRATION:
                        target = history[-1]["val_accuracy"]
                        axes.axhline(
                            target - TOLERANCE_POINTS / 100,
                            color="grey",
                            linestyle=":",
                            label=f"target - {TOLERANCE_POINTS:g} point",
                        )
                axes.set_title(workload.name)
                axes.set_xlabel("epoch")
                axes.set_ylabel("val_accuracy")
                if axes.get_legend_handles_labels()[0]:
                    axes.legend()

        return [save_figure(out_dir / "learning.png", draw, width_inches=5.0 * len(self.workloads))]

    def method(self) -> str:
        """How the runs are built."""
        global_batch = self.local_batch_size * self.devices
        budgets = "; ".join(
            f"{w.name}: {w.epochs} epochs, warm-up {w.lr_warmup_epochs}, learning rate "
            f"{w.learning_rate * self.devices:g} at batch {global_batch}"
            for w in self.workloads
        )
        compressions = "; ".join(
            f"{w.name}: "
            + ", ".join(f"{name} ({COMPRESSION_SUMMARIES[name]})" for name in w.compressions)
            for w in self.workloads
        )
        return (
            f"Calibration: 1 device with {self.calibration_fleet.cpu_cores_per_device:g} cores "
            f"(the fleet's total), dense, batch {global_batch}. Fleet: {self.devices} devices x "
            f"{self.fleet.cpu_cores_per_device:g} core on {self.profile}, {compressions}, local "
            f"batch {self.local_batch_size}. Same budget for "
            f"both: {budgets}; linear warm-up, then cosine decay to 0; SGD momentum 0.9; seed "
            "0. The target of each workload is its calibration's final val_accuracy; the fleet "
            f"meets it within {TOLERANCE_POINTS:g} point or not (ending higher is fine)."
            + (
                " Quick mode: ResNet-8 only, 2 epochs of 10 steps; not a result."
                if self.quick
                else ""
            )
        )

    def get_config(self) -> dict[str, Any]:
        """The experiment's options."""
        return {
            **super().get_config(),
            "devices": self.devices,
            "profile": self.profile,
            "cpu_cores_per_device": self.fleet.cpu_cores_per_device,
            "local_batch_size": self.local_batch_size,
            "workloads": [
                {**w.__dict__, "compressions": list(w.compressions)} for w in self.workloads
            ],
        }

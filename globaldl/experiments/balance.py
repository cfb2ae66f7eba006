"""`balance`: a fleet of two fast and two slow devices, equal shares against `--balance speed`.

Four devices on one link profile; devices 1 and 2 get 0.8 of a core each, devices 3 and 4 a
quarter of that (0.2). With equal shares every step waits for the slow devices; with
`--balance speed` each device's local batch follows its measured speed (globaldl/balance.py)
and the global batch (4 x 16) stays the same, so the step time and the time to the target
accuracy are directly comparable.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from globaldl.experiments.analysis import (
    TargetCheck,
    at_least_times_sooner,
    at_most_times,
    seconds_or_not_reached,
    time_to_target,
)
from globaldl.experiments.experiment import Experiment, run_row
from globaldl.experiments.outputs import number_or_none, save_figure
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

FAST_CORES, SLOW_CORES = 0.8, 0.2
COMPRESSION = "prune+quantize"
BALANCES = ("equal", "speed")


class BalanceExperiment(Experiment):
    """Step time and time to accuracy on a mixed-CPU fleet, equal shares vs by speed."""

    name = "balance"
    title = "Mixed fleet (2 fast, 2 slow devices): equal shares vs --balance speed"
    columns = (
        "model",
        "balance",
        "rank_batch_sizes",
        "mean_step_seconds",
        "seconds_to_target",
        "target_accuracy",
        "val_accuracy",
        "training_seconds",
        "status",
    )

    def __init__(
        self,
        *,
        quick: bool = False,
        cycle_time_ms: float | None = None,
        profile: str = "lte",
        workloads: Sequence[Workload] | None = None,
    ) -> None:
        super().__init__(quick=quick, cycle_time_ms=cycle_time_ms)
        self.profile = profile
        self.workloads = tuple(
            workloads or ((LENET_MNIST,) if quick else (LENET_MNIST, RESNET8_CIFAR))
        )
        self.fleet = FleetConfig(
            4, profile, FAST_CORES, cpu_cores_each=(FAST_CORES, FAST_CORES, SLOW_CORES, SLOW_CORES)
        )
        self.schedules = {
            LENET_MNIST.name: ("--epochs", "2" if quick else "4"),
            RESNET8_CIFAR.name: ("--epochs", "2" if quick else "4", "--max-steps-per-epoch", "32"),
        }

    def plan(self) -> list[RunSpec]:
        """Each workload with equal shares, then by speed, on one mixed fleet."""
        specs = []
        for workload in self.workloads:
            for balance in BALANCES:
                specs.append(
                    RunSpec(
                        experiment=self.name,
                        label=slug(f"{workload.name}-{balance}"),
                        fleet=self.fleet,
                        train_args=(
                            *workload.train_args,
                            *self.schedules[workload.name],
                            "--balance",
                            balance,
                            *compression_args(COMPRESSION),
                            "--seed",
                            "0",
                        ),
                        factors={"model": workload.name, "balance": balance},
                        cycle_time_ms=self.cycle_time_ms,
                        timeout_seconds=1200.0,
                    )
                )
        return specs

    def _target_of(self, model: str) -> float:
        return next(w.target_accuracy for w in self.workloads if w.name == model)

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per run: the batches chosen, step time, time to the target accuracy."""
        rows = []
        for result in results:
            row = run_row(result)
            target = self._target_of(str(result.spec.factors["model"]))
            row["target_accuracy"] = target
            summary = result.summary or {}
            row["rank_batch_sizes"] = "/".join(str(b) for b in summary.get("rank_batch_sizes", []))
            row["measured_speeds"] = summary.get("measured_speeds")
            if result.summary is not None:
                row["seconds_to_target"] = seconds_or_not_reached(
                    time_to_target(summary.get("history", []), target)
                )
            rows.append(row)
        return rows

    def targets(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult]
    ) -> list[TargetCheck]:
        """Balancing by speed makes steps shorter and reaches the target no later."""
        checks = []
        for workload in self.workloads:
            by = {row["balance"]: row for row in rows if row["model"] == workload.name}
            equal, speed = by.get("equal", {}), by.get("speed", {})
            checks.append(
                at_most_times(
                    f"{workload.name}: mean step with --balance speed shorter than with equal "
                    "shares",
                    number_or_none(speed.get("mean_step_seconds")),
                    number_or_none(equal.get("mean_step_seconds")),
                    1.0,
                )
            )
            checks.append(
                at_least_times_sooner(
                    f"{workload.name}: --balance speed reaches val_accuracy "
                    f"{workload.target_accuracy:g} no later than equal shares",
                    number_or_none(speed.get("seconds_to_target")),
                    number_or_none(equal.get("seconds_to_target")),
                    1.0,
                )
            )
        return checks

    def plots(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult], out_dir: Path
    ) -> list[Path]:
        """Validation accuracy against training time, equal shares vs by speed, per model."""
        by_label = {result.spec.label: result for result in results if result.summary}
        if not by_label:
            return []

        def draw(figure: Any) -> None:
            for index, workload in enumerate(self.workloads, start=1):
                axes = figure.add_subplot(1, len(self.workloads), index)
                for balance in BALANCES:
                    result = by_label.get(slug(f"{workload.name}-{balance}"))
                    if result is None or result.summary is None:
                        continue
                    history = result.summary["history"]
                    seconds, elapsed = [], 0.0
                    for epoch in history:
                        elapsed += epoch["seconds"]
                        seconds.append(elapsed)
                    axes.plot(
                        seconds, [e["val_accuracy"] for e in history], marker="o", label=balance
                    )
                axes.axhline(workload.target_accuracy, color="grey", linestyle=":")
                axes.set_title(f"{workload.name}, {self.profile}, cores 0.8/0.8/0.2/0.2")
                axes.set_xlabel("training seconds")
                axes.set_ylabel("val_accuracy")
                axes.legend()

        return [save_figure(out_dir / "balance.png", draw, width_inches=5.0 * len(self.workloads))]

    def method(self) -> str:
        """How the runs are built."""
        return (
            f"4 devices on {self.profile}: devices 1-2 with {FAST_CORES} core, devices 3-4 with "
            f"{SLOW_CORES} core (`fleet up --cpu-each {FAST_CORES},{FAST_CORES},{SLOW_CORES},"
            f"{SLOW_CORES}`), {COMPRESSION}, local batch 16 (global 64). `--balance speed` "
            "times forward/backward passes for 2 s on every device before training and splits the "
            "global batch in proportion (the chosen batches are in `rank_batch_sizes`)."
        )

    def get_config(self) -> dict[str, Any]:
        """The experiment's options."""
        return {
            **super().get_config(),
            "profile": self.profile,
            "workloads": [w.name for w in self.workloads],
        }

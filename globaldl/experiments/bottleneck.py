"""`bottleneck`: which phase of the step dominates, per link profile and model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
from globaldl.monitoring.phases import PHASES, bottleneck_phase, phase_shares

# Every device access profile, each now with its delay (vde2): the bottleneck map with latency.
FULL_PROFILES: tuple[str, ...] = ("fibre", "lte", "slow-4g", "lte-m", "geo-satellite", "nb-iot")
QUICK_PROFILES: tuple[str, ...] = ("fibre", "slow-4g")
# NB-IoT moves 26-62 kbit/s: a dense LeNet step takes minutes there, so its runs are bounded.
SLOW_PROFILE_STEPS = {"nb-iot": 3}
SLOW_PROFILE_TIMEOUT_SECONDS = 3 * 3600.0


class BottleneckExperiment(Experiment):
    """The phase that dominates the step, for each link profile x model (x compression).

    The rule is globaldl's `bottleneck_phase`, applied to the run summary's `phase_seconds`.
    """

    name = "bottleneck"
    title = "Bottleneck phase per link profile and model"
    columns = (
        "model",
        "compression",
        "profile",
        "up_kbit_per_second",
        "horovod_cycle_time_ms",
        "steps_per_rank",
        "bottleneck_phase",
        "bottleneck_share",
        "share_data_load",
        "share_compute",
        "share_compress",
        "share_exchange",
        "share_decompress",
        "share_apply",
        "mean_step_seconds",
        "status",
    )

    def __init__(
        self,
        *,
        quick: bool = False,
        cycle_time_ms: float | None = None,
        profiles: Sequence[str] | None = None,
        workloads: Sequence[Workload] | None = None,
        compressions: Sequence[str] | None = None,
        devices: int | None = None,
        cpu_cores_per_device: float = 0.5,
        max_steps_per_epoch: int | None = None,
        batch_size: int = 16,
    ) -> None:
        super().__init__(quick=quick, cycle_time_ms=cycle_time_ms)
        self.profiles = tuple(profiles or (QUICK_PROFILES if quick else FULL_PROFILES))
        self.workloads = tuple(workloads or (LENET_MNIST, RESNET8_CIFAR))
        self.compressions = tuple(
            compressions or (("none",) if quick else ("none", "prune+quantize"))
        )
        for preset in self.compressions:
            compression_args(preset)
        self.devices = devices or (2 if quick else 4)
        self.cpu_cores_per_device = cpu_cores_per_device
        self.max_steps_per_epoch = max_steps_per_epoch or (8 if quick else 20)
        self.batch_size = batch_size

    def steps_for(self, profile: str) -> int:
        """Steps per device on `profile` (bounded on the slowest links)."""
        return min(
            self.max_steps_per_epoch, SLOW_PROFILE_STEPS.get(profile, self.max_steps_per_epoch)
        )

    def plan(self) -> list[RunSpec]:
        """One fleet per profile; on it every model x compression, one bounded epoch."""
        specs = []
        for profile in self.profiles:
            fleet = FleetConfig(self.devices, profile, self.cpu_cores_per_device)
            for workload in self.workloads:
                for compression in self.compressions:
                    args = (
                        *workload.train_args,
                        "--batch-size",
                        str(self.batch_size),
                        "--epochs",
                        "1",
                        "--max-steps-per-epoch",
                        str(self.steps_for(profile)),
                        *compression_args(compression),
                        "--seed",
                        "0",
                    )
                    specs.append(
                        RunSpec(
                            experiment=self.name,
                            label=f"{workload.name}-{slug(profile)}-{slug(compression)}",
                            fleet=fleet,
                            train_args=args,
                            factors={"model": workload.name, "compression": compression},
                            cycle_time_ms=self.cycle_time_ms,
                            timeout_seconds=(
                                SLOW_PROFILE_TIMEOUT_SECONDS
                                if profile in SLOW_PROFILE_STEPS
                                else 3600.0
                            ),
                        )
                    )
        return specs

    def rows(self, results: Sequence[RunResult]) -> list[dict[str, Any]]:
        """One row per run: the bottleneck phase, its share, and every phase's share."""
        rows = []
        for result in results:
            row = run_row(result)
            if result.summary is not None and sum(result.summary["phase_seconds"].values()) > 0:
                phase_seconds = result.summary["phase_seconds"]
                shares = phase_shares(phase_seconds)
                phase = bottleneck_phase(phase_seconds)
                row["bottleneck_phase"] = phase
                row["bottleneck_share"] = shares[phase]
                row.update({f"share_{name}": shares[name] for name in PHASES})
            rows.append(row)
        return rows

    def plots(
        self, rows: Sequence[dict[str, Any]], results: Sequence[RunResult], out_dir: Path
    ) -> list[Path]:
        """bottleneck.png: a heatmap of the exchange's share, each cell naming the bottleneck."""
        line_names = [
            f"{workload.name} {compression}"
            for workload in self.workloads
            for compression in self.compressions
        ]

        def cell(line: str, profile: str) -> dict[str, Any]:
            return next(
                (
                    row
                    for row in rows
                    if f"{row['model']} {row['compression']}" == line and row["profile"] == profile
                ),
                {},
            )

        def draw(figure: Any) -> None:
            import numpy as np

            axis = figure.subplots()
            shares = np.full((len(line_names), len(self.profiles)), np.nan)
            for i, line in enumerate(line_names):
                for j, profile in enumerate(self.profiles):
                    row = cell(line, profile)
                    value = number_or_none(row.get("share_exchange"))
                    if value is not None:
                        shares[i, j] = value
                    text = (
                        f"{row['bottleneck_phase']}\n{row['bottleneck_share']:.0%}"
                        if "bottleneck_phase" in row
                        else "no run"
                    )
                    axis.text(j, i, text, ha="center", va="center", fontsize=8)
            image = axis.imshow(shares, cmap="Oranges", vmin=0, vmax=1, aspect="auto")
            axis.set_xticks(range(len(self.profiles)), self.profiles)
            axis.set_yticks(range(len(line_names)), line_names)
            axis.set_xlabel("link profile")
            figure.colorbar(image, ax=axis, label="exchange share of the step")
            axis.set_title(
                f"bottleneck phase and its share; {self.devices} devices x "
                f"{self.cpu_cores_per_device:g} cores",
                fontsize=9,
            )

        height = 1.5 + 0.7 * len(line_names)
        width = 3 + 1.6 * len(self.profiles)
        return [
            save_figure(out_dir / "bottleneck.png", draw, width_inches=width, height_inches=height)
        ]

    def method(self) -> str:
        """How the runs are built."""
        bounded = ", ".join(
            f"{profile}: {steps}"
            for profile, steps in SLOW_PROFILE_STEPS.items()
            if profile in self.profiles
        )
        return (
            f"Profiles {', '.join(self.profiles)} x models "
            f"{', '.join(w.name for w in self.workloads)} x compression "
            f"{', '.join(self.compressions)}; {self.devices} devices x "
            f"{self.cpu_cores_per_device:g} cores, local batch {self.batch_size}, one epoch of "
            f"{self.max_steps_per_epoch} steps per device"
            + (f" (bounded on the slowest links: {bounded})" if bounded else "")
            + ". The bottleneck is `globaldl.monitoring.bottleneck_phase` applied to the run "
            "summary's `phase_seconds` (rank 0's time per phase summed over the run): the phase "
            "with the largest share. Rank 0's exchange includes waiting for slower ranks."
        )

    def get_config(self) -> dict[str, Any]:
        """The experiment's options."""
        return {
            **super().get_config(),
            "profiles": list(self.profiles),
            "workloads": [w.name for w in self.workloads],
            "compressions": list(self.compressions),
            "devices": self.devices,
            "cpu_cores_per_device": self.cpu_cores_per_device,
            "max_steps_per_epoch": self.max_steps_per_epoch,
            "slow_profile_steps": dict(SLOW_PROFILE_STEPS),
            "batch_size": self.batch_size,
        }
